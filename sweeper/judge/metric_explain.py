"""`sweep report RUN --explain --metric NAME`: the smallest setting conjunction that moves a metric. Pure.

The unit is the server start: each valid (cell, start) row of the metrics table at one load point is
one value, compared on a log scale (`sweeper.judge.metric_compare`: changes are ratios). Levels are
the effective values `sweeper.judge.axis_levels` reads (the value that ran where the cell asked for
another, the version's default resolved, `unset` where an include rule left an axis out); the
commit is no dimension (the commit is what a bisect explains).

* **Candidates.** Every conjunction of at most `max_terms` (axis = level) terms on distinct axes,
  each tested with Welch's t on the per-start logs inside against outside; p-values Holm-corrected
  over every conjunction tried.
* **Fits.** A conjunction fits when it is significant after Holm, its effect (exp of the mean log
  difference, minus 1) is at least `min_effect`, and it is homogeneous: no one-term refinement
  splits its inside into parts that credibly differ (Welch, Bonferroni over the refinements). So
  "async off" alone is rejected when only its mtp half is slower, and "mtp ∧ async off" is reached.
* **The explanation** is the smallest fitting conjunction, ties to the smaller p; conjunctions of
  that size selecting exactly the same starts are listed as aliases (the design cannot tell them
  apart). The effect comes with its 95 % Welch interval. None fits: nothing in the matrix moves the
  metric by `min_effect` that these starts can show.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from sweeper.judge import metric_starts as ms
from sweeper.judge.axis_levels import COMMIT, axes_map, units
from sweeper.judge.explain import holm


@dataclass(frozen=True)
class MetricExplanation:
    metric: str
    load_point: str
    terms: tuple[tuple[str, str], ...]  # () when nothing fits
    effect: float | None  # inside vs outside, relative
    low: float | None
    high: float | None
    p_adjusted: float | None
    tried: int
    starts_inside: int
    starts_outside: int
    aliases: tuple[tuple[tuple[str, str], ...], ...] = ()

    @property
    def conjunction(self) -> str:
        return " ∧ ".join(f"{a}={v}" for a, v in self.terms) if self.terms else "(none)"

    def line(self) -> str:
        if not self.terms or self.effect is None:
            return f"{self.metric} @ {self.load_point}: no setting conjunction moves it ({self.tried} tried)"
        return (f"{self.metric} @ {self.load_point}: {self.conjunction}: {100 * self.effect:+.1f}% "
                f"[{100 * (self.low or 0):+.1f}, {100 * (self.high or 0):+.1f}] "
                f"({self.starts_inside} starts inside, {self.starts_outside} outside; Holm p "
                f"{self.p_adjusted:.2g} over {self.tried})")


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(difference of means, its standard error, degrees of freedom); inf SE when a side has < 2."""
    if len(a) < 2 or len(b) < 2:
        return float(a.mean() - b.mean()) if len(a) and len(b) else 0.0, math.inf, 1.0
    ga, gb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(ga + gb)
    df = (ga + gb) ** 2 / (ga ** 2 / (len(a) - 1) + gb ** 2 / (len(b) - 1)) if ga + gb > 0 else len(a) + len(b) - 2.0
    return float(a.mean() - b.mean()), se, float(df)


def _p(a: np.ndarray, b: np.ndarray) -> float:
    d, se, df = _welch(a, b)
    if not math.isfinite(se):
        return 1.0
    if se == 0:
        return 0.0 if d else 1.0
    return float(2 * student_t.sf(abs(d) / se, df))


def explain_metric(metrics: pd.DataFrame, metric: str, *, load_point: str | None = None,
                   cells: pd.DataFrame | None = None, max_terms: int = 2, alpha: float = 0.05,
                   min_effect: float = 0.05) -> MetricExplanation:
    """The smallest conjunction that moves `metric` at `load_point` (default: the first); `cells`:
    the run's cells table, for effective values."""
    rows = [r for r in ms.records(metrics) if ms.is_valid(r)]
    points = list(dict.fromkeys(str(r.get("load_point") or "") for r in rows))
    point = load_point if load_point is not None else (points[0] if points else "")
    picked = [(r, v) for r in rows if str(r.get("load_point") or "") == point
              and (v := ms.number(r.get(metric))) is not None and v > 0]
    if not picked:
        return MetricExplanation(metric, point, (), None, None, None, None, 0, 0, 0)
    keys = [(str(r["cell_id"]), ms.start_id(r)) for r, _ in picked]
    axes = {str(r["cell_id"]): axes_map(r.get("axes")) for r, _ in picked}
    commit = {str(r["cell_id"]): str(r.get(COMMIT)) for r, _ in picked}
    effective: Mapping[str, Mapping[str, Any]] = {}
    if cells is not None and not cells.empty:
        effective = {str(c["cell_id"]): c for c in cells.drop_duplicates("cell_id").to_dict("records")}
    table = units(keys, axes, commit, effective)
    y = np.log(np.array([v for _, v in picked]))
    dims = {d: levels for d, levels in table.dims.items() if len({x for x in levels if x is not None}) > 1}
    conjs = []
    for size in range(1, max_terms + 1):
        for names in itertools.combinations(sorted(dims), size):
            for values in itertools.product(*(sorted({x for x in dims[n] if x is not None}) for n in names)):
                mask = np.ones(len(y), dtype=bool)
                for n, level in zip(names, values, strict=True):
                    mask &= np.array([x == level for x in dims[n]])
                if 0 < mask.sum() < len(y):
                    conjs.append((tuple(zip(names, values, strict=True)), mask))
    if not conjs:
        return MetricExplanation(metric, point, (), None, None, None, None, 0, len(y), 0)
    p_raw = np.array([_p(y[m], y[~m]) for _, m in conjs])
    p_adj = holm(p_raw)

    def homogeneous(terms: tuple[tuple[str, str], ...], mask: np.ndarray) -> bool:
        used = {a for a, _ in terms}
        splits = [(n, v) for n in dims if n not in used for v in sorted({x for x in dims[n] if x is not None})]
        parts = [np.array([x == v for x in dims[n]]) & mask for n, v in splits]
        parts = [p for p in parts if 0 < p.sum() < mask.sum()]
        return all(_p(y[p], y[mask & ~p]) >= alpha / max(1, len(parts)) for p in parts)

    fitting = []
    for i, (terms, mask) in enumerate(conjs):
        effect = math.expm1(float(y[mask].mean() - y[~mask].mean()))
        if p_adj[i] < alpha and abs(effect) >= min_effect and homogeneous(terms, mask):
            fitting.append(i)
    if not fitting:
        return MetricExplanation(metric, point, (), None, None, None, None, len(conjs), len(y), 0)
    best = min(fitting, key=lambda i: (len(conjs[i][0]), p_raw[i]))
    terms, mask = conjs[best]
    d, se, df = _welch(y[mask], y[~mask])
    half = float(student_t.ppf(0.975, df) * se) if math.isfinite(se) else math.inf
    aliases = tuple(conjs[i][0] for i in range(len(conjs)) if i != best and len(conjs[i][0]) == len(terms)
                    and np.array_equal(conjs[i][1], mask))
    return MetricExplanation(metric, point, terms, math.expm1(d), math.expm1(d - half), math.expm1(d + half),
                             float(p_adj[best]), len(conjs), int(mask.sum()), int((~mask).sum()), aliases)


def explain_lines(metrics: pd.DataFrame, metric: str, *, cells: pd.DataFrame | None = None,
                  points: Sequence[str] | None = None) -> list[str]:
    """One line per load point (see `MetricExplanation.line`)."""
    found = points or list(dict.fromkeys(str(r.get("load_point") or "") for r in ms.records(metrics)))
    return [explain_metric(metrics, metric, load_point=p, cells=cells).line() for p in found]
