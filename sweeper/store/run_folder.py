"""The results: `runs/<run_id>/` (a local folder or a filesystem URI such as `s3://bucket/runs`)
with a manifest, Parquet samples and cells, and logs.

One declared schema per table (with `schema_version` in the Parquet metadata), written one file per
finished server group with an atomic rename, so a crash never leaves a half file and a resumed run
knows exactly which groups are done: a group is done when its cells file exists (written last) and
both files check out. Each file's metadata records its row count; the cells file also records its
samples file's row count and size and the run's manifest (all but the matrix), so damage is found
when a file is read and a lost manifest can be rebuilt. Damaged files are moved aside, never deleted.
After each Parquet file it writes (or moves aside), the run's catalogue (`sweeper.store.catalogue`) is
updated: which settings, suite and commits each file holds. The manifest is a typed record
(`sweeper.store.manifest`): this is the only module that reads or writes `manifest.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sweeper.errors import RecordError, StoreError, clip, one_line
from sweeper.store.catalogue import INDEXED, RunCatalogue, Wanted, keys_of
from sweeper.store.location import Location, is_temp_name
from sweeper.store.manifest import SWEEPER_VERSION as __version__
from sweeper.store.manifest import Host, Manifest, Retry, SweepManifest, from_json, to_json
from sweeper.store.metrics_table import METRICS_SCHEMA, TABLE

# The schema version written. A new version only adds nullable columns at the end of a table
# (readers read every file with the declared schemas, so an older file reads with nulls there) and
# stays readable alongside the versions in READABLE; anything else is a new reader's business.
#   1: the tables as first declared; 2: cells add install_s, replay_s, samples_planned, stop_reason.
SCHEMA_VERSION = 2
READABLE = frozenset({1, 2})
_META = {b"schema_version": str(SCHEMA_VERSION).encode(), b"producer": f"sweeper {__version__}".encode()}

_AXES = [
    pa.field("settings_key", pa.string()),
    pa.field("commit", pa.string()),
    pa.field("commit_sha", pa.string()),
    pa.field("spec_method", pa.string()),
    pa.field("num_speculative_tokens", pa.int32()),
    pa.field("async_scheduling", pa.bool_()),
    pa.field("attention_backend", pa.string()),
    # Every axis value of the cell (generic env./serve./request. ones too), JSON-encoded values.
    pa.field("axes", pa.map_(pa.string(), pa.string())),
]

SAMPLE_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("cell_id", pa.string()),
    pa.field("server_key", pa.string()),
    *_AXES,
    pa.field("vllm_version", pa.string()),
    pa.field("suite", pa.string()),
    pa.field("suite_digest", pa.string()),
    pa.field("case_id", pa.string()),
    pa.field("repeat", pa.int32()),
    pa.field("request_id", pa.string()),
    pa.field("passed", pa.bool_()),
    pa.field("failed_checks", pa.list_(pa.string())),
    pa.field("check_details", pa.map_(pa.string(), pa.string())),
    pa.field("finish_reason", pa.string()),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("completion_tokens", pa.int32()),
    pa.field("reasoning_tokens", pa.int32()),
    pa.field("latency_s", pa.float64()),
    pa.field("ttft_s", pa.float64()),
    pa.field("http_status", pa.int32()),
    pa.field("error", pa.string()),
    pa.field("content_tail", pa.string()),
    pa.field("log_errors", pa.list_(pa.string())),
    pa.field("started_at", pa.timestamp("ms", tz="UTC")),
    # How the answer failed on the wire (`sweeper.spec.status.Transport`), null when it came whole. Last,
    # and nullable: files written before it read with nulls here (readers use this declared schema).
    pa.field("transport", pa.string()),
], metadata=_META)

CELL_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("cell_id", pa.string()),
    pa.field("server_key", pa.string()),
    *_AXES,
    pa.field("suite", pa.string()),
    pa.field("suite_digest", pa.string()),
    pa.field("status", pa.string()),
    pa.field("status_detail", pa.string()),
    # What a crash or a refused start says about the settings (`sweeper.vllm.crash`): a crash's
    # exception type + innermost vLLM frame, or `refused: <vLLM's reason>` when the refusal names a
    # setting; null when the cell ran, or when a start failure says nothing about the settings.
    pa.field("failure_signature", pa.string()),
    pa.field("log_tail", pa.string()),
    pa.field("n_samples", pa.int32()),
    pa.field("n_failed", pa.int32()),
    pa.field("failure_rate", pa.float64()),
    pa.field("ci_low", pa.float64()),
    pa.field("ci_high", pa.float64()),
    pa.field("failed_checks", pa.map_(pa.string(), pa.int32())),
    pa.field("startup_s", pa.float64()),
    pa.field("duration_s", pa.float64()),
    pa.field("gpu_seconds", pa.float64()),
    pa.field("server_starts", pa.int32()),
    pa.field("node", pa.string()),
    # What actually ran, next to what was asked for.
    pa.field("effective_model_runner", pa.string()),
    pa.field("effective_async_scheduling", pa.bool_()),
    pa.field("effective_attention_backend", pa.string()),
    pa.field("effective_spec_method", pa.string()),
    pa.field("effective_num_speculative_tokens", pa.int32()),
    pa.field("effective_structured_backend", pa.string()),
    pa.field("effective_differs", pa.list_(pa.string())),
    # Environment fingerprint.
    pa.field("vllm_version", pa.string()),
    pa.field("torch_version", pa.string()),
    pa.field("cuda_version", pa.string()),
    pa.field("gpu_name", pa.string()),
    pa.field("gpu_driver", pa.string()),
    pa.field("cpu_model", pa.string()),
    pa.field("hostname", pa.string()),
    # Spec-decode figures from the /metrics difference across the server group's replay: the same on
    # every cell row of the group (its cells' requests share the server and are interleaved).
    pa.field("spec_drafts", pa.float64()),
    pa.field("spec_draft_tokens", pa.float64()),
    pa.field("spec_accepted_tokens", pa.float64()),
    pa.field("spec_acceptance_rate", pa.float64()),
    pa.field("spec_mean_acceptance_length", pa.float64()),
    pa.field("spec_accepted_per_position", pa.list_(pa.float64())),  # acceptance at draft position 0, 1, ...
    pa.field("ttft_p50_s", pa.float64()),
    pa.field("latency_p50_s", pa.float64()),
    # Schema version 2 (last, nullable: a version-1 file reads with nulls here). The measured parts of
    # the group's cost (`gpu_seconds` is this cell's share of them, by `sweeper.plan.cost.cell_seconds`):
    # seconds getting the environment (its lookup, when cached) and replaying the suite.
    pa.field("install_s", pa.float64()),
    pa.field("replay_s", pa.float64()),
    # The samples a whole replay sends; why an adaptive cell stopped (`sweeper.judge.sequential.Stop`:
    # clean, failing, width, exhausted, server), null when the cell replayed its whole suite.
    pa.field("samples_planned", pa.int32()),
    pa.field("stop_reason", pa.string()),
], metadata=_META)

PROBE_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("probe", pa.int32()),
    pa.field("round", pa.int32()),
    pa.field("commit_sha", pa.string()),
    pa.field("position", pa.int32()),
    pa.field("settings_key", pa.string()),
    pa.field("cell_id", pa.string()),
    pa.field("status", pa.string()),
    pa.field("n_samples", pa.int32()),
    pa.field("n_failed", pa.int32()),
    # Failures per failure mode (sweeper.judge.modes) among this probe's samples of this cell.
    pa.field("mode_failures", pa.map_(pa.string(), pa.int32())),
    pa.field("reused", pa.bool_()),
    pa.field("group_id", pa.string()),
    pa.field("gpu_seconds", pa.float64()),
], metadata=_META)

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _readable() -> str:
    return " and ".join(str(v) for v in sorted(READABLE))


def new_run_id(name: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:40] or "run"
    return f"{stamp}-{slug}"


def table(rows: Iterable[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows -> a table of exactly `schema` (missing keys are null; unknown keys are a bug)."""
    rows = list(rows)
    names = set(schema.names)
    for row in rows:
        extra = set(row) - names
        if extra:
            raise ValueError(f"columns not in the schema: {sorted(extra)}")
    cols = {name: [row.get(name) for row in rows] for name in schema.names}
    return pa.Table.from_pydict(cols, schema=schema)


def write_atomic(tbl: pa.Table, path: str | os.PathLike[str] | Location) -> None:
    """One Parquet file (local path or filesystem URI), atomically: whole or absent."""
    Location.parse(path).write_atomic(parquet_bytes(tbl))


def write_json_atomic(data: Any, path: str | os.PathLike[str] | Location) -> None:
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    Location.parse(path).write_atomic(text.encode())


def parquet_bytes(tbl: pa.Table, extra: Mapping[str, Any] | None = None) -> pa.Buffer:
    """`tbl` as a Parquet file in memory, with `schema_version`, the row count and `extra` in its
    key-value metadata (what a reader checks the file against)."""
    meta = {**(tbl.schema.metadata or {}), **_META, ROWS_KEY: str(tbl.num_rows).encode()}
    for key, value in (extra or {}).items():
        meta[f"sweeper.{key}".encode()] = (value if isinstance(value, str) else json.dumps(value, default=str)).encode()
    sink = pa.BufferOutputStream()
    pq.write_table(tbl.replace_schema_metadata(meta), sink)
    return sink.getvalue()


ROWS_KEY = b"sweeper.rows"
MANIFEST = "manifest.json"
KINDS = ("samples", "cells", "probes")
# What of the manifest each cells file carries (all of it but the matrix itself, which can be large):
# enough to rebuild a lost manifest from the matrix file and the results.
_IDENTITY_LIMIT = 64 * 1024
_MANIFEST_LIMIT = 64 * 2**20


class DamagedManifest(StoreError):
    """manifest.json is missing, not JSON, not a JSON object, or fits no manifest version."""


@dataclass(frozen=True)
class FileCheck:
    """What reading one Parquet file's footer found: `problem` None when it is sound."""

    problem: str | None
    rows: int = 0
    meta: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Damage:
    """One damaged part of a run: the manifest, a server group (its samples and cells files), or
    one probes file. `files` are relative to the run folder; `why` says what is wrong."""

    run_id: str
    part: str
    why: str
    files: tuple[str, ...] = ()
    group_id: str | None = None

    def __str__(self) -> str:
        return f"run {self.run_id}: {self.part}: {self.why}"


@dataclass
class Scan:
    """A run's files as they are: sound groups, damaged parts, groups stopped between their two
    writes (`partial`: a samples file without its cells file; never read, re-run on resume)."""

    groups: dict[str, tuple[str, str]] = field(default_factory=dict)  # group -> (samples, cells) paths
    metrics: dict[str, str] = field(default_factory=dict)  # sound group with a bench -> its metrics path
    probes: list[str] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)  # group -> sample rows


# Footers already read, by (filesystem, path, size, mtime): a report reads a run several times.
_CHECKED: dict[tuple[str, str, int | None, int | None], FileCheck] = {}


def check_parquet(loc: Location, info: pafs.FileInfo) -> FileCheck:
    """A Parquet file's footer: readable, of this schema version, holding the rows recorded when
    it was written."""
    key = (loc.fs.type_name, loc.path, info.size, info.mtime_ns)
    found = _CHECKED.get(key)
    if found is None:
        found = _check_parquet(loc, info)
        if len(_CHECKED) > 200_000:
            _CHECKED.clear()
        _CHECKED[key] = found
    return found


def _check_parquet(loc: Location, info: pafs.FileInfo) -> FileCheck:
    try:
        with loc.fs.open_input_file(loc.path) as f:
            md = pq.read_metadata(f)
    except (OSError, pa.ArrowException) as exc:
        size = f"{info.size:,} bytes" if info.size is not None else "unknown size"
        return FileCheck(f"not a readable Parquet file ({size}, truncated or overwritten?): "
                         f"{one_line(str(exc))[:160]}")
    meta = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in (md.metadata or {}).items()}
    version = meta.get("schema_version")
    if version not in {str(v) for v in READABLE}:
        return FileCheck(f"schema version {clip(version)}, this sweep reads {_readable()}", md.num_rows, meta)
    written = meta.get(ROWS_KEY.decode())
    if written is not None and written != str(md.num_rows):
        return FileCheck(f"holds {md.num_rows} rows, {clip(written)} were written", md.num_rows, meta)
    return FileCheck(None, md.num_rows, meta)


class RunDir:
    """One run's folder: a local folder or a prefix on a pyarrow filesystem (`s3://…`).

    Every file is written atomically. A group's samples file is written first, then its cells file:
    the cells file marks the group done, and records the size and row count of its samples file.
    Readers see only sound groups; `scan()` says what is damaged, `move_aside()` keeps damaged
    files under `damaged/` so that a resumed run can run those groups again."""

    def __init__(self, root: str | os.PathLike[str] | Location) -> None:
        self.location = Location.parse(root)
        self._identity: dict[str, Any] | None = None
        self._catalogue: RunCatalogue | None = None

    def __repr__(self) -> str:
        return f"RunDir({self.location.shown!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and self.location == other.location

    def __hash__(self) -> int:
        return hash(self.location)

    @property
    def run_id(self) -> str:
        return self.location.name

    @property
    def uri(self) -> str:
        """The run's place as shown to people (a path, or `s3://bucket/prefix/run`)."""
        return self.location.shown

    @property
    def root(self) -> Path:
        """The run folder, for runs on this machine's disk."""
        return self.location.as_path()

    @property
    def local(self) -> bool:
        return self.location.local

    @property
    def fs(self) -> pafs.FileSystem:
        return self.location.fs

    @property
    def runs_dir(self) -> Location:
        return self.location.parent

    def file(self, *parts: str) -> Location:
        return self.location.join(*parts)

    @property
    def manifest_file(self) -> Location:
        return self.file(MANIFEST)

    @property
    def manifest_path(self) -> Path:
        """manifest.json of a run on this machine's disk."""
        return self.root / MANIFEST

    @property
    def logs(self) -> Path:
        """The server logs' folder of a run on this machine's disk (`read_log` reads them anywhere)."""
        if not self.local:
            raise StoreError(f"{self.uri} is not on this machine's disk; its logs are read with read_log")
        return self.root / "logs"

    def samples_path(self, group_id: str) -> Location:
        return self.file("samples", f"{group_id}.parquet")

    def cells_path(self, group_id: str) -> Location:
        return self.file("cells", f"{group_id}.parquet")

    def metrics_path(self, group_id: str) -> Location:
        return self.file("metrics", f"{group_id}.parquet")

    # ---- reading -------------------------------------------------------------------------------

    def listing(self, kind: str) -> dict[str, pafs.FileInfo]:
        """`<kind>/*.parquet` by name (temporary files of unfinished writes left out)."""
        return self.file(kind).parquet_files()

    def scan(self, *, groups: bool = True, probes: bool = True, manifest: bool = True,
             only: Collection[str] | None = None) -> Scan:
        """Every Parquet file's footer checked (of the parts asked for, of the groups and probes
        named in `only` when given); sound groups and damaged parts."""
        out = Scan()
        if groups:
            self._scan_groups(out, only)
        if probes:
            self._scan_probes(out, only)
        problem = self.manifest_problem() if manifest else None
        if problem:
            out.damage.insert(0, Damage(self.run_id, MANIFEST, problem, (MANIFEST,) if self.manifest_file.exists()
                                        else ()))
        return out

    def _scan_groups(self, out: Scan, only: Collection[str] | None) -> None:
        samples, cells = self.listing("samples"), self.listing("cells")
        names = set(samples) | set(cells)
        for gid in sorted(names if only is None else names & set(only)):
            s_info, c_info = samples.get(gid), cells.get(gid)
            if c_info is None:
                out.partial.append(gid)
                continue
            files = (f"samples/{gid}.parquet", f"cells/{gid}.parquet")
            why = None
            c = check_parquet(self.file(files[1]), c_info)
            s = check_parquet(self.file(files[0]), s_info) if s_info is not None else None
            if c.problem:
                why = f"{files[1]}: {c.problem}"
            elif s is None:
                why = f"{files[0]} is missing (its cells file is there)"
            elif s.problem:
                why = f"{files[0]}: {s.problem}"
            else:
                rows, size = c.meta.get("sweeper.samples_rows"), c.meta.get("sweeper.samples_bytes")
                if rows is not None and rows != str(s.rows):
                    why = f"{files[0]}: holds {s.rows} rows, {clip(rows)} were written"
                elif size is not None and s_info is not None and size != str(s_info.size):
                    why = f"{files[0]}: {s_info.size:,} bytes, {clip(size)} were written"
            m_file, m_info = f"metrics/{gid}.parquet", None
            if not why and c.meta.get("sweeper.metrics_rows") is not None:
                why, m_info = self._check_metrics(gid, c.meta)
            if why:
                present = [f for f, i in zip(files, (s_info, c_info), strict=True) if i is not None]
                if m_info is not None:
                    present.insert(0, m_file)
                out.damage.append(Damage(self.run_id, f"group {gid}", why, tuple(present), gid))
            else:
                out.groups[gid] = (self.file(files[0]).path, self.file(files[1]).path)
                out.rows[gid] = s.rows if s else 0
                if m_info is not None:
                    out.metrics[gid] = self.file(m_file).path

    def _check_metrics(self, gid: str, cells_meta: Mapping[str, str]) -> tuple[str | None, pafs.FileInfo | None]:
        """A group's metrics file against what its cells file recorded of it: (why it is damaged or
        None, its listing or None when absent)."""
        rel = f"metrics/{gid}.parquet"
        info = self.listing("metrics").get(gid)
        if info is None:
            return f"{rel} is missing (its cells file records it)", None
        m = check_parquet(self.file(rel), info)
        rows, size = cells_meta.get("sweeper.metrics_rows"), cells_meta.get("sweeper.metrics_bytes")
        if m.problem:
            return f"{rel}: {m.problem}", info
        if rows is not None and rows != str(m.rows):
            return f"{rel}: holds {m.rows} rows, {clip(rows)} were written", info
        if size is not None and size != str(info.size):
            return f"{rel}: {info.size:,} bytes, {clip(size)} were written", info
        return None, info

    def _scan_probes(self, out: Scan, only: Collection[str] | None) -> None:
        for name, info in self.listing("probes").items():
            if only is not None and name not in only:
                continue
            rel = f"probes/{name}.parquet"
            p = check_parquet(self.file(rel), info)
            if p.problem:
                out.damage.append(Damage(self.run_id, rel, p.problem, (rel,)))
            else:
                out.probes.append(self.file(rel).path)

    def files(self, kind: str, only: Collection[str] | None = None) -> list[str]:
        """The sound `samples`, `cells` or `probes` files (paths on `fs`), by name; of the groups or
        probes named in `only` when given."""
        scan = self.scan(groups=kind != "probes", probes=kind == "probes", manifest=False, only=only)
        if kind == "probes":
            return sorted(scan.probes)
        if kind == "metrics":
            return [path for _, path in sorted(scan.metrics.items())]
        index = KINDS.index(kind)
        return [paths[index] for _, paths in sorted(scan.groups.items())]

    def done_groups(self) -> set[str]:
        """Groups whose results are complete and sound (the cells file is written after the samples file)."""
        return set(self.scan(probes=False, manifest=False).groups)

    def recorded_manifests(self) -> list[Manifest]:
        """The manifests (all but the matrix; a value too large to keep is None) that the cells files
        recorded when written, from every cells file whose footer reads: what a lost manifest is
        rebuilt from."""
        out = []
        for name, info in self.listing("cells").items():
            raw = check_parquet(self.file("cells", f"{name}.parquet"), info).meta.get("sweeper.run")
            try:
                data = json.loads(raw) if raw else None
                if isinstance(data, dict):
                    out.append(from_json(data))
            except (ValueError, RecursionError, StoreError):
                continue  # a copy that does not read is no evidence
        return out

    def read_bytes(self, *parts: str, limit: int | None = None) -> bytes:
        return self.file(*parts).read_bytes(limit)

    def read_json(self, *parts: str) -> Any:
        """A JSON file of the run; None when absent or unreadable."""
        try:
            return json.loads(self.read_bytes(*parts, limit=_MANIFEST_LIMIT).decode())
        except (FileNotFoundError, StoreError, UnicodeDecodeError, ValueError, RecursionError):
            return None

    def read_manifest(self) -> Manifest:
        where = self.manifest_file.shown
        fix = f"`sweep runs repair {self.run_id}` rebuilds it"
        try:
            raw = self.manifest_file.read_bytes(_MANIFEST_LIMIT)
        except FileNotFoundError:
            raise DamagedManifest(f"{self.uri}: not a run, or its manifest.json is lost ({fix})") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise DamagedManifest(f"{where}: damaged manifest, not JSON ({one_line(str(exc))[:80]}); {fix}") \
                from None
        if not isinstance(data, dict):
            raise DamagedManifest(f"{where}: damaged manifest, a JSON {type(data).__name__} where an object "
                                  f"belongs; {fix}")
        version = data.get("schema_version")
        if isinstance(version, bool) or version not in READABLE:
            raise StoreError(f"{where}: results of schema version {clip(version)}, this sweep reads "
                             f"{_readable()}; use the sweeper version that wrote them")
        try:
            manifest = from_json(data)
        except RecordError as exc:
            raise DamagedManifest(f"{where}: damaged manifest, {exc}; {fix}") from None
        except StoreError as exc:
            raise StoreError(f"{where}: {exc}") from None
        self._identity = _identity(manifest)
        return manifest

    def manifest_problem(self) -> str | None:
        """Why manifest.json cannot be read (lost, not JSON, not an object, fitting no manifest version),
        or None."""
        try:
            self.read_manifest()
        except DamagedManifest as exc:
            return str(exc)
        except StoreError:
            return None  # readable, of another schema version: not damage
        return None

    def manifest_or_none(self) -> Manifest | None:
        """The manifest, or None when it is damaged (readers that can do without it)."""
        try:
            return self.read_manifest()
        except DamagedManifest:
            return None

    # ---- writing -------------------------------------------------------------------------------

    def write_group(self, group_id: str, samples: pa.Table, cells: pa.Table, metrics: pa.Table | None = None) -> None:
        """A finished group's files: samples, then its bench's metrics (when it has rows), then the
        cells file, which marks the group done and records the other two's row counts and sizes."""
        _check_schema(samples, SAMPLE_SCHEMA, "samples")
        _check_schema(cells, CELL_SCHEMA, "cells")
        data = parquet_bytes(samples, {"group": group_id})
        catalogue = self.catalogue()
        self.samples_path(group_id).write_atomic(data)
        extra: dict[str, Any] = {"group": group_id, "samples_rows": samples.num_rows, "samples_bytes": data.size}
        if metrics is not None and metrics.num_rows:
            _check_schema(metrics, METRICS_SCHEMA, "metrics")
            written = parquet_bytes(metrics, {"group": group_id, "table": TABLE})
            self.metrics_path(group_id).write_atomic(written)
            extra.update(metrics_rows=metrics.num_rows, metrics_bytes=written.size)
        if self._identity is not None:
            extra["run"] = self._identity
        self.cells_path(group_id).write_atomic(parquet_bytes(cells, extra))
        catalogue.add("samples", group_id, self._as_listed("samples", group_id), keys_of(samples))
        catalogue.add("cells", group_id, self._as_listed("cells", group_id), keys_of(cells))
        catalogue.save()

    def write_table(self, rel: str, tbl: pa.Table) -> None:
        parts = rel.split("/")
        indexed = len(parts) == 2 and parts[0] in INDEXED and parts[1].endswith(".parquet")
        catalogue = self.catalogue() if indexed else None
        self.file(*parts).write_atomic(parquet_bytes(tbl))
        if catalogue is not None:
            name = parts[1][:-len(".parquet")]
            catalogue.add(parts[0], name, self._as_listed(parts[0], name), keys_of(tbl))
            catalogue.save()

    def _as_listed(self, kind: str, name: str) -> pafs.FileInfo:
        """A file just written, as a listing shows it: readers compare the catalogue with a listing,
        and on an object store a request for the one object need not report the same time."""
        where = self.file(kind, f"{name}.parquet")
        if self.local:
            return where.info()
        return self.listing(kind).get(name) or where.info()

    def catalogue(self) -> RunCatalogue:
        """The run's catalogue as this writer keeps it: read and brought in line with the listing once
        (a resumed run, or one written before catalogues), then updated after each file it writes."""
        if self._catalogue is None:
            self._catalogue = RunCatalogue.current(self.location, save=False)
        return self._catalogue

    def matching(self, wanted: Wanted, kinds: Iterable[str]) -> dict[str, list[str]]:
        """Per kind, the names of this run's files that hold a wanted experiment, as a reader sees them:
        the stored catalogue brought in line with the listing now, and saved where it can be."""
        return RunCatalogue.current(self.location).matching(wanted, kinds)

    def write_json(self, rel: str, data: Any) -> None:
        write_json_atomic(data, self.file(*rel.split("/")))

    def write_log(self, name: str, text: str) -> None:
        """A server's log (`logs/<name>.log`), as its group's result brought it back: written here by
        the driver, never on a worker, wherever the run is."""
        self.file("logs", f"{name}.log").write_atomic(text.encode("utf-8"))

    def write_manifest(self, manifest: Manifest) -> None:
        """manifest.json, atomically. `created`, `sweeper` and `host` left None are stamped: now, this
        sweeper, this machine."""
        # A manifest written again (each bisect round, a resumed run) keeps the run's creation time:
        # "the latest run" is the one created last, not the one touched last.
        created = manifest.created or self._created() or now_utc().isoformat()
        manifest = dataclasses.replace(manifest, created=created,
                                       sweeper=manifest.sweeper or __version__, host=manifest.host or host_info())
        write_json_atomic({**to_json(manifest), "schema_version": SCHEMA_VERSION}, self.manifest_file)
        self._identity = _identity(manifest)

    def _created(self) -> str | None:
        """The creation time the run's manifest already records, if it has a readable one."""
        try:
            return self.read_manifest().created
        except StoreError:
            return None

    def created(self) -> datetime | None:
        """When the run was made: its manifest's `created`, else (no readable manifest, or one written
        before that key) the time its folder or manifest was last written; None when neither reads."""
        stamp = self._created()
        if stamp:
            try:
                when = datetime.fromisoformat(stamp)
                return when if when.tzinfo else when.replace(tzinfo=UTC)
            except ValueError:
                pass
        for loc in (self.manifest_file, self.location):
            try:
                info = loc.info()
            except StoreError:
                continue
            if info.type != pafs.FileType.NotFound and info.mtime_ns:
                return datetime.fromtimestamp(info.mtime_ns / 1e9, UTC)
        return None

    def record_retry(self, group_id: str, attempt: int, error: str) -> None:
        """A group lost with its node or worker and submitted again: the sweep's manifest lists it."""
        manifest = self.read_manifest()
        if not isinstance(manifest, SweepManifest):
            raise StoreError(f"{self.manifest_file.shown}: a {manifest.kind} run records no retried groups")
        retry = Retry(group_id, attempt, error, now_utc().isoformat())
        self.write_manifest(dataclasses.replace(manifest, retried=(*manifest.retried, retry)))

    def read_log(self, name: str) -> str | None:
        """A server log's text (`name` without `.log`), wherever the run is; None when absent."""
        try:
            return self.read_bytes("logs", f"{name}.log").decode(errors="replace")
        except (FileNotFoundError, StoreError):
            return None

    def move_aside(self, damage: list[Damage]) -> list[str]:
        """Damaged files to `damaged/<time>/…` of the run (never deleted); returns where they went."""
        stamp = now_utc().strftime("%Y%m%dT%H%M%S.%fZ")
        moved = []
        indexed = False
        for part in damage:
            for rel in part.files:
                src = self.file(*rel.split("/"))
                if src.exists():
                    dst = self.file("damaged", stamp, *rel.split("/"))
                    src.move(dst)
                    moved.append(f"{rel} -> damaged/{stamp}/{rel}")
                    kind, _, name = rel.partition("/")
                    if kind in INDEXED and name.endswith(".parquet"):
                        self.catalogue().forget(kind, name[:-len(".parquet")])
                        indexed = True
        if indexed:
            self.catalogue().save()
        return moved

    def clean_temp(self) -> None:
        """Temporary files of writes that a killed driver never finished (the driver is the only writer)."""
        for folder in ("", *KINDS, "metrics", "logs"):
            for info in self.file(folder).listing() if folder else self.location.listing():
                if info.type == pafs.FileType.File and is_temp_name(info.base_name):
                    self.fs.delete_file(info.path)


def _identity(manifest: Manifest) -> dict[str, Any]:
    out = {}
    for key, value in {**to_json(manifest), "schema_version": SCHEMA_VERSION}.items():
        if key == "matrix":
            continue
        if len(json.dumps(value, default=str)) <= _IDENTITY_LIMIT:
            out[key] = value
    return out


def _check_schema(tbl: pa.Table, schema: pa.Schema, what: str) -> None:
    if not tbl.schema.equals(schema, check_metadata=False):
        raise ValueError(f"{what} table does not match the declared schema")


def open_run(runs_dir: str | os.PathLike[str] | Location, run_id: str, *, create: bool) -> RunDir:
    """The run `run_id` under `runs_dir` (made now when `create`, refused when it exists): one `RunDir`
    that holds its location and opens its catalogue; StoreError when it is not there."""
    if not RUN_ID_RE.match(run_id):
        raise StoreError(f"invalid run id {clip(run_id)}: expected letters, digits, '.', '_' or '-'")
    base = Location.parse(runs_dir)
    root = base.join(run_id)
    if create:
        if root.listing():
            raise StoreError(f"{root} already exists: pick another --run-id, or --resume {run_id}")
        root.make_dir()
    elif not root.is_dir():
        raise StoreError(f"no run {run_id!r} under {base}")
    return RunDir(root)


def host_info() -> Host:
    return Host(socket.gethostname(), __version__)


def now_utc() -> datetime:
    return datetime.now(UTC)
