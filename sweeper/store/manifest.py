"""A run's manifest as typed records: what a sweep or a bisect was asked to do. Pure.

`manifest.json` is written and read only by the store (`sweeper.store.run_folder.RunDir`), through `to_json`
and `from_json` here; every other module sees a `SweepManifest` or a `BisectManifest`. Versions:

- 1: the manifests written before these records (no `manifest_version` key);
- 2: the same keys, with `manifest_version` and a sweep's `commit_order` (its refs in history
  order, learnt from the repository when the run was planned; absent from version 1);
- 3: a sweep's `design` (which cells of the product it runs) and `cost` (the GPU-time profile it
  was planned with), both optional: a manifest without them ran the full product;
- 4: a sweep's `adaptive` (the stopping rule of its cells) and `budget` (the GPU-hours it was given
  and the servers that did not fit), both optional: without them every cell replays its whole suite
  and every server of the design runs;
- 5: a sweep's `phases` (each batch of servers it started: the design, then each zoom phase, with
  the server groups it ran and why) and `zoom` (how the zoom ended). A manifest of an earlier version
  ran one phase, its design: `phases_of` reads it so.

Each cells file's footer keeps a copy of the manifest without the matrix, and without any value
too large to keep (`sweeper.store.run_folder`): read back with the same `from_json`, a value it lacks is
None, which is what a repair checks for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweeper.errors import RecordError, StoreError, clip

# The sweeper's version: what every manifest and Parquet footer records as its producer (pyproject.toml
# reads it from here, so there is one place to change it).
SWEEPER_VERSION = "0.1.0"

VERSION = 5
# Keys every version has written beside the record's own fields.
_FRAME = ("kind", "schema_version", "manifest_version")


@dataclass(frozen=True)
class Host:
    """The driver's machine."""

    hostname: str | None = None
    sweeper: str | None = None


@dataclass(frozen=True)
class Retry:
    """A server group lost with its node or worker and submitted again."""

    group_id: str
    attempt: int
    error: str
    at: str


@dataclass(frozen=True)
class Repair:
    """When and from which matrix a lost or damaged manifest was rebuilt."""

    at: str
    matrix_path: str
    checked_against: str | None = None  # what the rebuilt manifest was checked against (a sweep's)


@dataclass(frozen=True)
class DesignRecord:
    """The design a sweep runs (`sweeper.plan.design`): its kind, strength and seed, and the cells chosen."""

    kind: str
    strength: int
    seed: int
    servers: int
    cells: int
    digest: str  # names the chosen cells: a resume must choose the same


@dataclass(frozen=True)
class CostRecord:
    """The cost profile (`sweeper.plan.cost`) a sweep was planned with, in seconds."""

    install_s: float
    start_s: float
    request_s: float
    source: str


@dataclass(frozen=True)
class AdaptiveRecord:
    """The stopping rule of an adaptive sweep's cells (`sweeper.judge.sequential.Rule`)."""

    threshold: float
    detect: float
    confidence: float
    round: int
    width: float | None = None


@dataclass(frozen=True)
class BudgetRecord:
    """`--budget`: the GPU-hours given, what the kept servers model, and the servers left untested."""

    gpu_hours: float
    modelled_hours: float
    servers: int
    cells: int
    left_servers: int
    left_cells: int
    left_groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class PhaseRecord:
    """One batch of servers a sweep started: its design (phase 1) or a zoom (`sweeper.plan.zoom`)."""

    phase: int
    kind: str  # "design", "zoom" or "rerun" (cells `sweep matrix --where` ran again, `sweeper.drivers.rerun`)
    groups: tuple[str, ...]  # the server groups it ran, by group id
    cells: int
    reason: str  # what it was for: the design's name, or the candidates it tells apart


@dataclass(frozen=True)
class SweepManifest:
    """`sweep matrix`: the matrix as given, its suite, the refs resolved to shas."""

    run_id: str
    created: str | None = None
    sweeper: str | None = None
    host: Host | None = None
    matrix_path: str | None = None
    matrix: Mapping[str, Any] = field(default_factory=dict)  # the matrix file as given (user input)
    matrix_digest: str | None = None
    suite_path: tuple[str, ...] | None = None
    suite: str | None = None
    suite_digest: str | None = None
    commits: Mapping[str, str | None] | None = None  # ref -> full sha (None: not resolved)
    commit_order: tuple[str, ...] | None = None  # the refs oldest first, where the repository told
    repo: str | None = None
    cells: int | None = None
    groups: int | None = None
    retried: tuple[Retry, ...] = ()
    repaired: Repair | None = None
    design: DesignRecord | None = None  # None: the full product (every manifest before version 3)
    cost: CostRecord | None = None
    adaptive: AdaptiveRecord | None = None  # None: whole suites (every manifest before version 4)
    budget: BudgetRecord | None = None
    phases: tuple[PhaseRecord, ...] = ()  # empty before version 5: one phase, the design (`phases_of`)
    zoom: str | None = None  # how the zoom ended, per mode; None: no zoom (or not ended yet)

    kind = "matrix"

    def axis_commits(self) -> list[str]:
        """The commit axis as the matrix lists it (else the resolved refs)."""
        return commit_axis(self.matrix, self.commits)


@dataclass(frozen=True)
class BisectManifest:
    """`sweep bisect`: the range (good .. bad, oldest first) and the cells it bisects."""

    run_id: str
    created: str | None = None
    sweeper: str | None = None
    host: Host | None = None
    matrix_path: str | None = None
    matrix: Mapping[str, Any] = field(default_factory=dict)
    good: str | None = None
    bad: str | None = None
    good_sha: str | None = None
    bad_sha: str | None = None
    commits: tuple[str, ...] | None = None  # the first-parent range, good first
    settings_keys: tuple[str, ...] | None = None
    cells: tuple[Mapping[str, Any], ...] | None = None  # each target's axis values, the commit aside
    suite_digest: str | None = None
    repo: str | None = None  # where the history comes from
    repaired: Repair | None = None

    kind = "bisect"


Manifest = SweepManifest | BisectManifest


def phases_of(manifest: SweepManifest, done_groups: Sequence[str]) -> tuple[PhaseRecord, ...]:
    """A sweep's phases: as recorded (version 4), else its one phase, the design, made of the
    groups that have results (`done_groups`)."""
    if manifest.phases:
        return manifest.phases
    design = manifest.design
    reason = "full product" if design is None or design.kind == "full" else f"covering, strength {design.strength}"
    return (PhaseRecord(1, "design", tuple(sorted(done_groups)), manifest.cells or 0, reason),)


def commit_axis(matrix: Mapping[str, Any], commits: Mapping[str, str | None] | None) -> list[str]:
    """A matrix's commit axis as it lists it (else the refs of `commits`)."""
    axes = matrix.get("axes")
    listed = axes.get("commit") if isinstance(axes, Mapping) else None
    return [str(c) for c in listed] if isinstance(listed, list) and listed else list(commits or {})
KINDS: dict[str, type[SweepManifest | BisectManifest]] = {"matrix": SweepManifest, "bisect": BisectManifest}


# ---- to JSON ------------------------------------------------------------------------------------

def to_json(manifest: Manifest) -> dict[str, Any]:
    """The record as manifest.json holds it (the store adds `schema_version`)."""
    out: dict[str, Any] = {"kind": manifest.kind, "manifest_version": VERSION}
    for name in _fields(type(manifest)):
        value = getattr(manifest, name)
        if name in ("retried", "repaired", "design", "cost", "adaptive", "budget", "phases", "zoom") and not value:
            continue  # written only once something was retried or repaired (or designed), as before
        out[name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, (Host, Retry, Repair, DesignRecord, CostRecord, AdaptiveRecord, BudgetRecord, PhaseRecord)):
        # An optional part left out rather than null: a bisect's repair never had `checked_against`.
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None or f.default is dataclasses.MISSING}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ---- from JSON ----------------------------------------------------------------------------------

def from_json(data: Mapping[str, Any]) -> Manifest:
    """A manifest of any version this sweeper reads. RecordError says what does not fit (damage);
    StoreError, that a newer sweeper wrote it."""
    version = data.get("manifest_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordError(f"'manifest_version' is {clip(version)}, expected a whole number from 1")
    if version > VERSION:
        raise StoreError(f"manifest version {version}, this sweep reads up to {VERSION}; use the sweeper "
                         "version that wrote it")
    kind = data.get("kind", "matrix")  # repairs always took a manifest without one for a sweep's
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"'kind' is {clip(kind)}, expected one of {', '.join(KINDS)}")
    known = set(_fields(cls))
    unknown = sorted(set(data) - known - set(_FRAME))
    if unknown:
        raise RecordError(f"unknown key {clip(unknown[0])} in a {kind} manifest")
    values: dict[str, Any] = {}
    for name in known:
        if name in data:
            values[name] = _READERS[name, kind](name, data[name])
    if "run_id" not in values or values["run_id"] is None:
        raise RecordError("no 'run_id'")
    return cls(**values)


Reader = Callable[[str, Any], Any]


def _wrong(name: str, value: Any, expected: str) -> RecordError:
    return RecordError(f"{name!r} is a JSON {_json_type(value)} where {expected} belongs")


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _text(name: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _wrong(name, value, "a string")


def _count(name: str, value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise _wrong(name, value, "a whole number")


def _texts(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise _wrong(name, value, "an array of strings")


def _object(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise _wrong(name, value, "an object")


def _matrix(name: str, value: Any) -> dict[str, Any]:
    return {} if value is None else _object(name, value)


def _shas(name: str, value: Any) -> dict[str, str | None] | None:
    if value is None:
        return None
    if isinstance(value, dict) and all(isinstance(v, str) or v is None for v in value.values()):
        return value
    raise _wrong(name, value, "an object of refs to shas")


def _cells(name: str, value: Any) -> tuple[dict[str, Any], ...] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return tuple(value)
    raise _wrong(name, value, "an array of objects")


def _seconds(name: str, value: Any) -> float | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return None if value is None else float(value)
    raise _wrong(name, value, "a number")


Part = (type[Host] | type[Retry] | type[Repair] | type[DesignRecord] | type[CostRecord] | type[AdaptiveRecord]
        | type[BudgetRecord] | type[PhaseRecord])
_PART_READERS: dict[str, Reader] = {"attempt": _count, "strength": _count, "seed": _count, "servers": _count,
                                    "cells": _count, "install_s": _seconds, "start_s": _seconds,
                                    "request_s": _seconds, "threshold": _seconds, "detect": _seconds,
                                    "confidence": _seconds, "width": _seconds, "round": _count,
                                    "gpu_hours": _seconds, "modelled_hours": _seconds, "left_servers": _count,
                                    "left_cells": _count, "left_groups": _texts, "phase": _count, "groups": _texts}


def _record(cls: Part) -> Reader:
    def read(name: str, value: Any) -> Any:
        if value is None:
            return None
        got = _object(name, value)
        unknown = sorted(set(got) - set(_fields(cls)))
        if unknown:
            raise RecordError(f"unknown key {clip(unknown[0])} in {name!r}")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            required = f.default is dataclasses.MISSING
            if f.name not in got and not required:
                continue
            if got.get(f.name) is None and required:
                raise RecordError(f"{name!r} has no {f.name!r}")
            reader: Reader = _PART_READERS.get(f.name, _text)
            values[f.name] = reader(f"{name}.{f.name}", got[f.name])
        return cls(**values)
    return read


def _list_of(cls: type[Retry | PhaseRecord]) -> Reader:
    def read_all(name: str, value: Any) -> tuple[Any, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise _wrong(name, value, "an array")
        read = _record(cls)
        return tuple(read(name, v) for v in value)
    return read_all


_retries = _list_of(Retry)


_COMMON: dict[str, Reader] = {
    "run_id": _text, "created": _text, "sweeper": _text, "host": _record(Host), "matrix_path": _text,
    "matrix": _matrix, "suite_digest": _text, "repo": _text, "repaired": _record(Repair),
}
_READERS: dict[tuple[str, str], Reader] = {
    **{(k, "matrix"): r for k, r in _COMMON.items()},
    **{(k, "bisect"): r for k, r in _COMMON.items()},
    **{(k, "matrix"): r for k, r in {
        "matrix_digest": _text, "suite_path": _texts, "suite": _text, "commits": _shas, "commit_order": _texts,
        "cells": _count, "groups": _count, "retried": _retries, "design": _record(DesignRecord),
        "cost": _record(CostRecord), "adaptive": _record(AdaptiveRecord), "budget": _record(BudgetRecord),
        "phases": _list_of(PhaseRecord), "zoom": _text}.items()},
    **{(k, "bisect"): r for k, r in {
        "good": _text, "bad": _text, "good_sha": _text, "bad_sha": _text, "commits": _texts,
        "settings_keys": _texts, "cells": _cells}.items()},
}


def _fields(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))
