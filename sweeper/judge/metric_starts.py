"""Rows of the metrics table as per-start figures: the unit every metric verdict is judged on. Pure.

The metrics table (`runs/README.md`, "The metrics table") has one row per (cell, server start, load
point). Performance varies more between server starts than within one, so a start is the unit: a
metric of a cell at a load point is the list of its per-start values, shown as their mean with a
95 % t interval over starts. Rows marked invalid (`valid` false: the server stalled, crashed, failed
requests, /metrics went backwards) never give a figure; they are counted, with their reasons.

Cells are matched across runs by their settings (every axis but the commit), as
`sweeper.reports.compare` matches them; a run holding several commits of the same settings is
matched commit by commit too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from sweeper.judge.axis_levels import COMMIT, axes_map, value_text

Settings = tuple[tuple[str, str], ...]


def number(value: Any) -> float | None:
    """A finite float, or None for a missing value (null, NaN, inf)."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def settings(row: Mapping[str, Any], *, with_commit: bool = False) -> Settings:
    """The (axis, value) pairs of a row's cell, in the matrix's axis order; the commit only if asked."""
    axes = axes_map(row.get("axes"))
    out = []
    for name, value in axes.items():
        text = value_text(value)
        if text is not None and (with_commit or name != COMMIT):
            out.append((name, text))
    return tuple(out)


def label(pairs: Settings) -> str:
    return " ".join(f"{a.removeprefix('env.').removeprefix('request.')}={v}" for a, v in pairs) or "(one cell)"


def is_valid(row: Mapping[str, Any]) -> bool:
    value = row.get("valid", True)
    return bool(value) if value is not None and not (isinstance(value, float) and math.isnan(value)) else False


def records(metrics: pd.DataFrame) -> list[dict[str, Any]]:
    return [] if metrics is None or metrics.empty else metrics.to_dict("records")


def several_commits(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some settings hold more than one commit (then cells are matched commit by commit)."""
    seen: dict[Settings, set[str]] = {}
    for r in rows:
        seen.setdefault(settings(r), set()).add(str(r.get(COMMIT)))
    return any(len(v) > 1 for v in seen.values())


def start_id(row: Mapping[str, Any]) -> str:
    """A server start's identity: its run, group and start index (a cell's rows of one start)."""
    return f"{row.get('run_id') or ''}/{row.get('group_id') or row.get('cell_id')}/{row.get('start')}"


@dataclass(frozen=True)
class Figure:
    """One metric of one cell at one load point over its valid starts."""

    values: tuple[float, ...]  # per valid start
    ses: tuple[float | None, ...]  # within-start standard errors, where the table has them
    invalid: int  # starts whose row is marked invalid

    @property
    def n(self) -> int:
        return len(self.values)

    def mean_interval(self, confidence: float = 0.95) -> tuple[float, float, float] | None:
        """Mean with a t interval over starts (one start: the interval from its within-start SE, if any)."""
        if not self.values:
            return None
        arr = np.asarray(self.values)
        mean = float(arr.mean())
        if len(arr) > 1:
            half = float(student_t.ppf(0.5 + confidence / 2, len(arr) - 1) * arr.std(ddof=1) / math.sqrt(len(arr)))
        else:
            se = self.ses[0]
            half = float(1.959963984540054 * se) if se is not None else math.inf
        return mean, mean - half, mean + half


def figure(rows: Sequence[Mapping[str, Any]], metric: str, se_column: str | None) -> Figure:
    values: list[float] = []
    ses: list[float | None] = []
    invalid = 0
    for r in rows:
        if not is_valid(r):
            invalid += 1
            continue
        value = number(r.get(metric))
        if value is None:
            continue
        values.append(value)
        ses.append(number(r.get(se_column)) if se_column else None)
    return Figure(tuple(values), tuple(ses), invalid)


def group(rows: Sequence[Mapping[str, Any]], *, with_commit: bool) -> dict[tuple[Settings, str], list[Mapping[str, Any]]]:
    """Rows by (settings, load point), in first-seen order."""
    out: dict[tuple[Settings, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault((settings(r, with_commit=with_commit), str(r.get("load_point") or "")), []).append(r)
    return out
