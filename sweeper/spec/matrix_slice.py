"""A slice of a matrix: its cells at one commit, or only some of its cells (those `--where
AXIS=VALUE` pairs pick, `matching`). Pure.

A triage sweeps a matrix at its `bad` commit, then its `good` commit on the cells that failed: the
same matrix file (so every relative path in it keeps its meaning), with the commit axis replaced by
one ref and the cells narrowed to chosen settings. Include and exclude rules that name another
commit are dropped with that commit; the rest apply as written.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.errors import ConfigError
from sweeper.spec.matrix import Cell, Matrix, build_matrix, canonical
from sweeper.spec.yamlfile import Positions


@dataclass(frozen=True)
class Slice:
    """`commit`: the one ref the commit axis holds (None: the matrix's own axis); `settings`: the
    settings keys (a cell's settings without the commit) of the cells kept (None: every cell)."""

    commit: str | None = None
    settings: frozenset[str] | None = None

    def record(self) -> dict[str, Any]:
        return {"commit": self.commit, "settings": sorted(self.settings) if self.settings is not None else None}


def at_commit(data: Mapping[str, Any], ref: str) -> dict[str, Any]:
    """The matrix data with its commit axis replaced by `ref` (rules naming other commits dropped)."""
    out = copy.deepcopy(dict(data))
    axes = dict(out.get("axes") or {})
    axes["commit"] = [ref]
    out["axes"] = axes
    for kind in ("include", "exclude"):
        rules = out.get(kind)
        if isinstance(rules, list):
            out[kind] = [r for r in rules if not isinstance(r, dict) or "commit" not in r or str(r["commit"]) == ref]
    # A triage chooses the design of each phase itself.
    out.pop("design", None)
    return out


def apply(matrix: Matrix, data: Mapping[str, Any], pos: Positions, s: Slice) -> Matrix:
    """`matrix` (parsed from `data`) cut to `s`: parsed again at its commit with the install kinds' facts
    it was parsed with."""
    if s.commit is not None:
        matrix = build_matrix(at_commit(data, s.commit), pos, matrix.path, matrix.kinds)
    if s.settings is not None:
        kept = tuple(c for c in matrix.cells if c.settings_key in s.settings)
        if not kept:
            raise ConfigError("none of the chosen cells is in the matrix any more", file=matrix.path)
        matrix = dataclasses.replace(matrix, cells=kept)
    return matrix


def matching(matrix: Matrix, where: Sequence[str]) -> tuple[Cell, ...]:
    """The cells (commit included) whose every `AXIS=VALUE` of `where` holds, in the matrix's order.
    A value is written as the dry run and the table show it (`mtp`, `4`, `true`; `null` where the
    axis does not apply). ConfigError naming the axis or value that no cell has, and what there is."""
    wanted: dict[str, str] = {}
    for item in where:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"expected AXIS=VALUE, got {item!r}", key="--where")
        wanted[key.strip()] = value.strip()
    axes = [n for n, _ in matrix.axes]
    axes += sorted({k for c in matrix.cells for k in c.values} - set(axes))
    for key, value in wanted.items():
        if key not in axes:
            raise ConfigError(f"{key} is not an axis of {matrix.path}; axes: {', '.join(axes)}", key="--where")
        values = list(dict.fromkeys(value_text(c.values.get(key)) for c in matrix.cells))
        if value not in values:
            raise ConfigError(f"no cell has {key}={value}; its values: {', '.join(values)}", key="--where")
    cells = tuple(c for c in matrix.cells if all(value_text(c.values.get(k)) == v for k, v in wanted.items()))
    if not cells:
        raise ConfigError(f"no cell of {matrix.path} has {' and '.join(f'{k}={v}' for k, v in wanted.items())} "
                          "(each value exists, not together)", key="--where")
    return cells


def value_text(value: Any) -> str:
    """An axis value as `--where` takes it: strings as they are, anything else as canonical JSON."""
    return value if isinstance(value, str) else canonical(value)
