"""The `expect:` section of a matrix: bounds on serving metrics that make a start outside them a failure.

    expect:
      spec_decode_acceptance_length: {min: 2.5}           # absolute bounds, in the metric's unit
      mean_tpot_ms: {max: 40}
      output_throughput: {max_change: 5%, against: {commit: v0.27.0}}   # relative to a baseline commit

A metric is one of `sweeper.judge.metric_names.METRICS` (vLLM's `vllm bench serve` names), handed
in by the loader as `known` (spec/ is below judge/: it takes the names as values). `min`
and `max` bound each start's value at each load point; `max_change` bounds how much worse than the
baseline commit's same settings (the mean over its starts, at the same load point) a start may be,
in the metric's bad direction (slower, lower throughput), as a fraction or a percentage (`5%`,
`0.05`); `against.commit` must be a commit of the matrix's commit axis. Parsed with positions: bad
input is one line naming the file, line and key, before anything starts. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.errors import clip
from sweeper.spec.yamlfile import PathKey, Positions

SECTION = "expect"
KEYS = ("min", "max", "max_change", "against")
PERCENT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*%\s*")
MODE_PREFIX = "expect:"


@dataclass(frozen=True)
class Expectation:
    """One bound on one metric: absolute (`low`/`high`) or relative to a baseline commit."""

    metric: str
    low: float | None = None
    high: float | None = None
    max_change: float | None = None  # a fraction: 0.05 for 5 %
    against: str | None = None  # the baseline commit, as the matrix's commit axis names it
    higher_is_better: bool = False  # the metric's direction: what "worse" means for max_change

    @property
    def mode(self) -> str:
        """The failure mode a start outside this bound shows: `expect:mean_tpot_ms<=40`."""
        if self.max_change is not None:
            bound = f">=-{100 * self.max_change:g}%" if self.higher_is_better else f"<=+{100 * self.max_change:g}%"
            return f"{MODE_PREFIX}{self.metric} change{bound} vs {self.against}"
        parts = []
        if self.low is not None:
            parts.append(f"{self.metric}>={self.low:g}")
        if self.high is not None:
            parts.append(f"{self.metric}<={self.high:g}")
        return MODE_PREFIX + ",".join(parts)


def _number(value: Any, pos: Positions, path: PathKey) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise pos.error(path, f"expected a number, got {clip(value)}")
    return float(value)


def _fraction(value: Any, pos: Positions, path: PathKey) -> float:
    if isinstance(value, str) and (found := PERCENT.fullmatch(value)):
        out = float(found.group(1)) / 100
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        out = float(value)
    else:
        raise pos.error(path, f"expected a change as a percentage (5%) or a fraction (0.05), got {clip(value)}")
    if not 0 < out < 10:
        raise pos.error(path, f"expected a change above 0 % and below 1000 %, got {clip(value)}")
    return out


def parse_expect(raw: Any, pos: Positions, commits: Sequence[str], known: Mapping[str, bool]) -> tuple[Expectation, ...]:
    """The section's bounds; `commits`: the matrix's commit axis (what `against.commit` may name);
    `known`: the metrics a bound may name, each with whether higher is better."""
    if raw is None:
        return ()
    where: PathKey = (SECTION,)
    if not isinstance(raw, dict):
        raise pos.error(where, "expected a mapping of metric names to bounds ({min: N}, {max: N}, "
                               "{max_change: 5%, against: {commit: C}})")
    out = []
    for metric, bounds in raw.items():
        path = (*where, metric)
        if metric not in known:
            raise pos.error(path, f"unknown metric {clip(metric)}; expected one of {', '.join(known)}")
        if not isinstance(bounds, dict) or not bounds:
            raise pos.error(path, "expected bounds: {min: N}, {max: N} or {max_change: 5%, against: {commit: C}}")
        for key in bounds:
            if key not in KEYS:
                raise pos.error((*path, key), f"unknown bound; expected {', '.join(KEYS)}")
        low = _number(bounds["min"], pos, (*path, "min")) if "min" in bounds else None
        high = _number(bounds["max"], pos, (*path, "max")) if "max" in bounds else None
        if low is not None and high is not None and low > high:
            raise pos.error((*path, "min"), f"min ({low:g}) is above max ({high:g})")
        change = _fraction(bounds["max_change"], pos, (*path, "max_change")) if "max_change" in bounds else None
        against = _against(bounds.get("against"), pos, (*path, "against"), commits) if "against" in bounds else None
        if (change is None) != (against is None):
            missing = "against: {commit: C}" if against is None else "max_change"
            raise pos.error((*path, "max_change" if change is not None else "against"),
                            f"a relative bound needs both max_change and against; {missing} is missing")
        if change is not None and (low is not None or high is not None):
            raise pos.error((*path, "max_change"), "a relative bound stands alone: give min/max as another entry")
        out.append(Expectation(str(metric), low, high, change, against, known[metric]))
    return tuple(out)


def _against(value: Any, pos: Positions, path: PathKey, commits: Sequence[str]) -> str:
    if not isinstance(value, Mapping) or set(value) != {"commit"}:
        raise pos.error(path, f"expected {{commit: C}}, got {clip(value)}")
    commit = value["commit"]
    if not isinstance(commit, str) or commit not in commits:
        listed = ", ".join(commits) if commits else "(no commit axis)"
        raise pos.error((*path, "commit"), f"{clip(commit)} is not a commit of this matrix; its commits: {listed}")
    return commit


def from_matrix(raw: Mapping[str, Any] | None, known: Mapping[str, bool]) -> tuple[Expectation, ...]:
    """A stored run's expectations, from its manifest's matrix data (checked when the run started)."""
    if not raw or not raw.get(SECTION):
        return ()
    axes = raw.get("axes") or {}
    commits = [str(c) for c in axes.get("commit") or ()]
    return parse_expect(raw[SECTION], Positions("matrix", {}), commits, known)
