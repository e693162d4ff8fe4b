"""`sweep report A --against B --metrics`: did a metric change from run B to run A? Pure.

Per matched cell (same settings, the commit aside; `sweeper.judge.metric_starts`), load point and
metric: the change A vs B as a ratio with its 95 % interval over server starts, and a verdict.

**The test.** A start is the unit (performance varies between starts more than within one), so
each side is its list of per-start values. Latencies and throughputs are positive and their noise is
multiplicative (a slower machine stretches every time by a factor), so the values are compared on a
log scale: the change is exp(mean log A − mean log B) − 1, a ratio that reads the same whichever way
round and is symmetric on that scale. The interval and test are Welch's t on the per-start logs
(each side its own variance, Welch–Satterthwaite degrees of freedom). Welch is exact under normal
noise for any sizes and stays at or below its level with heavy-tailed noise (an outlier start
inflates the variance it is judged by), which is what 2–10 starts per side need: no large-sample
approximation, no assumption that A and B are equally noisy. Each side's variance is floored at
the mean squared relative within-start standard error (the `_se` columns): two starts that agree
by chance cannot make a figure more certain than one start's own noise allows. A side with one
start borrows the other side's variance (and its degrees of freedom); one start on each side
decides nothing. A metric with a zero or negative value (an acceptance rate of 0) is compared on
its own scale instead, the change relative to B's mean.

**The verdict.**
* SAME: the change is inside ± `min_effect` (default 5 %, on the log scale ±log(1 + min_effect)),
  shown by two one-sided tests at `alpha` (TOST: the 90 % interval inside the margin). A change
  smaller than the minimum effect is no change, even when it is significant.
* DIFFERENT: the 95 % interval excludes no change and the Benjamini–Hochberg q over the matched
  cells and load points of that metric is below `alpha` (a report of many cells would otherwise call
  one in twenty different by chance; with one cell q = p). `worse` says whether it went the bad way
  (`sweeper.judge.metric_names`: direction).
* UNKNOWN: neither. `starts_needed` is the number of starts per side that would decide at 80 %
  power if the estimated change and the pooled between-start spread are the truth: enough to tell
  the change from zero when it is at least half the margin, enough to show it inside the margin
  otherwise (the cheaper of the two when both apply). None when no spread is known.

Calibrated on an independent generator (`benchmarks/metric_compare.py`: log-normal and gamma
per-start noise at 1–5 % CV, outlier starts, 2–10 starts per side).
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import false_discovery_control
from scipy.stats import t as student_t

from sweeper.judge import metric_starts as ms
from sweeper.judge.metric_names import METRICS

MIN_EFFECT = 0.05
ALPHA = 0.05
POWER = 0.8
MAX_STARTS = 1000
TEST = "Welch t on per-start log values; SAME by TOST at ± the minimum effect; DIFFERENT at BH q < alpha"


class MetricVerdict(enum.StrEnum):
    DIFFERENT = "DIFFERENT"
    SAME = "SAME"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class Test:
    """Two lists of per-start values, judged (see the module docstring)."""

    change: float | None  # A vs B, relative (0.1 = A is 10 % higher)
    low: float | None  # 95 % interval of `change`
    high: float | None
    p: float | None  # two-sided, no change
    same: bool  # TOST: inside ± the minimum effect
    starts_needed: int | None  # per side, for UNKNOWN
    scale: str  # "log" or "linear"
    spread: float | None  # the between-start standard deviation used (log: ≈ the CV)


def _var(values: np.ndarray, floor: float) -> float | None:
    return max(float(values.var(ddof=1)), floor) if len(values) > 1 else None


def _t(q: float, df: float) -> float:
    return float(student_t.ppf(q, df))


@functools.cache
def _crit(q: float) -> np.ndarray:
    """(t_q + t_POWER) at the degrees of freedom of n = 2 … MAX_STARTS starts per side."""
    df = 2 * np.arange(2, MAX_STARTS + 1) - 2
    out: np.ndarray = (student_t.ppf(q, df) + student_t.ppf(POWER, df)) * np.sqrt(2 / np.arange(2, MAX_STARTS + 1))
    return out


def _needed(d: float, s: float, margin: float, alpha: float, have: int) -> int | None:
    """Starts per side that decide at POWER if the change is `d` and the spread `s` (both on the test's scale)."""
    if s <= 0:
        return have + 1
    goals = []
    if abs(d) >= margin / 2:
        goals.append((abs(d), 1 - alpha / 2))  # tell it from zero
    if abs(d) < margin:
        goals.append((margin - abs(d), 1 - alpha))  # show it inside the margin
    best: int | None = None
    for gap, q in goals:
        enough = np.nonzero(_crit(q) * s <= gap)[0]
        if len(enough):
            n = int(enough[0]) + 2
            best = n if best is None else min(best, n)
    return None if best is None else max(best, have + 1)


def welch(a: Sequence[float], b: Sequence[float], *, se_a: Sequence[float | None] = (),
          se_b: Sequence[float | None] = (), min_effect: float = MIN_EFFECT, alpha: float = ALPHA) -> Test:
    """The change from per-start values `b` to `a` (see the module docstring); `se_*`: within-start SEs."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(xa) == 0 or len(xb) == 0:
        return Test(None, None, None, None, False, None, "log", None)
    log = bool((xa > 0).all() and (xb > 0).all())

    def floor(x: np.ndarray, se: Sequence[float | None]) -> float:
        known = [(s / v if log else s) ** 2 for s, v in zip(se, x, strict=False) if s is not None and v]
        return float(np.mean(known)) if known else 0.0

    ya, yb = (np.log(xa), np.log(xb)) if log else (xa, xb)
    base = float(xb.mean())
    margin = math.log1p(min_effect) if log else min_effect * abs(base)
    d = float(ya.mean() - yb.mean())
    va, vb = _var(ya, floor(xa, se_a)), _var(yb, floor(xb, se_b))
    if va is None and vb is None:
        # One start each: the between-start spread is unknown, whatever the within-start errors say.
        return Test(_rel(d, log, base), None, None, None, False, 2, "log" if log else "linear", None)
    if va is None or vb is None:
        v = va if va is not None else vb
        assert v is not None
        df = float((len(xa) if va is not None else len(xb)) - 1)
        se = math.sqrt(v / len(xa) + v / len(xb))
        spread2 = v
    else:
        ga, gb = va / len(xa), vb / len(xb)
        se = math.sqrt(ga + gb)
        df = (ga + gb) ** 2 / (ga ** 2 / (len(xa) - 1) + gb ** 2 / (len(xb) - 1)) if ga + gb > 0 else float(len(xa) + len(xb) - 2)
        spread2 = (va + vb) / 2
    if se == 0:
        p = 0.0 if d else 1.0
        low = high = d
        same = abs(d) < margin
    else:
        p = float(2 * student_t.sf(abs(d) / se, df))
        half = _t(1 - alpha / 2, df) * se
        low, high = d - half, d + half
        tost = _t(1 - alpha, df) * se
        same = d - tost > -margin and d + tost < margin
    needed = None if same else _needed(d, math.sqrt(spread2), margin, alpha, max(len(xa), len(xb)))
    return Test(_rel(d, log, base), _rel(low, log, base), _rel(high, log, base), p, same, needed,
                "log" if log else "linear", math.sqrt(spread2))


def _rel(d: float, log: bool, base: float) -> float:
    if log:
        return math.expm1(d)
    return d / abs(base) if base else math.copysign(math.inf, d) if d else 0.0


@dataclass(frozen=True)
class MetricChange:
    settings: ms.Settings
    load_point: str
    metric: str
    mean_a: float | None
    mean_b: float | None
    n_a: int  # valid starts
    n_b: int
    invalid_a: int
    invalid_b: int
    test: Test
    q: float | None
    verdict: MetricVerdict
    worse: bool | None  # for DIFFERENT: whether A is worse than B by the metric's direction

    @property
    def label(self) -> str:
        return ms.label(self.settings)


@dataclass(frozen=True)
class MetricComparison:
    run_a: str
    run_b: str
    changes: tuple[MetricChange, ...]
    only_a: tuple[str, ...]  # settings labels (with load point) without a partner
    only_b: tuple[str, ...]
    min_effect: float
    alpha: float


def compare_metrics(metrics_a: pd.DataFrame, metrics_b: pd.DataFrame, *, run_a: str = "A", run_b: str = "B",
                    names: Sequence[str] | None = None, min_effect: float = MIN_EFFECT,
                    alpha: float = ALPHA) -> MetricComparison:
    """Every metric of every matched (cell, load point) of two metrics tables (see the module docstring).
    `names`: the metrics to judge (default: every one of `METRICS` both tables hold a value of)."""
    rows_a, rows_b = ms.records(metrics_a), ms.records(metrics_b)
    with_commit = ms.several_commits(rows_a) or ms.several_commits(rows_b)
    keyed_a, keyed_b = ms.group(rows_a, with_commit=with_commit), ms.group(rows_b, with_commit=with_commit)
    wanted = list(names) if names is not None else [
        m for m in METRICS if _present(metrics_a, m) and _present(metrics_b, m)]
    matched = [k for k in keyed_a if k in keyed_b]
    changes: list[MetricChange] = []
    for metric in wanted:
        name = METRICS[metric]
        found: list[tuple[tuple[ms.Settings, str], ms.Figure, ms.Figure, Test]] = []
        for key in matched:
            fa, fb = ms.figure(keyed_a[key], metric, name.se), ms.figure(keyed_b[key], metric, name.se)
            if not fa.n and not fb.n and not fa.invalid and not fb.invalid:
                continue  # the metric is not defined for this cell (no speculative decoding)
            found.append((key, fa, fb, welch(fa.values, fb.values, se_a=fa.ses, se_b=fb.ses,
                                             min_effect=min_effect, alpha=alpha)))
        tested = [i for i, f in enumerate(found) if f[3].p is not None]
        qs = false_discovery_control([found[i][3].p for i in tested]) if tested else []
        qmap = {i: float(q) for i, q in zip(tested, qs, strict=True)}
        for i, (key, fa, fb, test) in enumerate(found):
            q = qmap.get(i)
            excludes = test.low is not None and test.high is not None and (test.low > 0 or test.high < 0)
            if test.same:
                verdict = MetricVerdict.SAME
            elif excludes and q is not None and q < alpha:
                verdict = MetricVerdict.DIFFERENT
            else:
                verdict = MetricVerdict.UNKNOWN
            worse = None
            if verdict == MetricVerdict.DIFFERENT and test.change is not None:
                worse = (test.change < 0) if name.higher_is_better else (test.change > 0)
            changes.append(MetricChange(key[0], key[1], metric, _mean(fa), _mean(fb), fa.n, fb.n, fa.invalid,
                                        fb.invalid, test, q, verdict, worse))
    order = {MetricVerdict.DIFFERENT: 0, MetricVerdict.UNKNOWN: 1, MetricVerdict.SAME: 2}
    changes.sort(key=lambda c: (order[c.verdict], not c.worse, -abs(c.test.change or 0.0)))

    def label(k: tuple[ms.Settings, str]) -> str:
        return f"{ms.label(k[0])} @ {k[1]}" if k[1] else ms.label(k[0])
    return MetricComparison(run_a, run_b, tuple(changes), tuple(label(k) for k in keyed_a if k not in keyed_b),
                            tuple(label(k) for k in keyed_b if k not in keyed_a), min_effect, alpha)


def _present(df: pd.DataFrame, column: str) -> bool:
    return column in df.columns and bool(pd.to_numeric(df[column], errors="coerce").notna().any())


def _mean(f: ms.Figure) -> float | None:
    return float(np.mean(f.values)) if f.values else None


def as_json(cmp: MetricComparison) -> dict[str, Any]:
    """The comparison as plain data (`sweep report A --against B --metrics --json`)."""
    def num(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else x
    return {"run_a": cmp.run_a, "run_b": cmp.run_b, "min_effect": cmp.min_effect, "alpha": cmp.alpha,
            "test": TEST, "only_a": list(cmp.only_a), "only_b": list(cmp.only_b),
            "changes": [{"settings": dict(c.settings), "load_point": c.load_point, "metric": c.metric,
                         "mean_a": num(c.mean_a), "mean_b": num(c.mean_b), "starts_a": c.n_a, "starts_b": c.n_b,
                         "invalid_a": c.invalid_a, "invalid_b": c.invalid_b, "change": num(c.test.change),
                         "low": num(c.test.low), "high": num(c.test.high), "p": num(c.test.p), "q": num(c.q),
                         "verdict": str(c.verdict), "worse": c.worse, "starts_needed": c.test.starts_needed,
                         "scale": c.test.scale} for c in cmp.changes]}


def render(cmp: MetricComparison, *, width: int = 100) -> list[str]:
    """Plain lines: one per (cell, load point, metric), DIFFERENT first, each fitting `width` columns."""
    out = [f"metrics: run {cmp.run_a} against {cmp.run_b}"[:width],
           f"  change = A vs B with its 95 % interval over starts; SAME within ±{100 * cmp.min_effect:g} %"]
    if cmp.only_a or cmp.only_b:
        out.append(f"  unmatched: {len(cmp.only_a)} only in {cmp.run_a}, {len(cmp.only_b)} only in {cmp.run_b}"[:width])
    if not cmp.changes:
        out.append("  no metric measured in both runs")
    last: tuple[ms.Settings, str] | None = None
    for c in sorted(cmp.changes, key=lambda c: (c.label, c.load_point)):
        if (c.settings, c.load_point) != last:
            out.append(f"  {c.label} @ {c.load_point}"[:width])
            last = (c.settings, c.load_point)
        out.append(_line(c)[:width])
    return out


def _line(c: MetricChange) -> str:
    t = c.test

    def pct(x: float | None) -> str:
        return "?" if x is None else f"{100 * x:+.1f}%"
    change = "—" if t.change is None else (f"{pct(t.change)} [{pct(t.low)}, {pct(t.high)}]" if t.low is not None
                                           else pct(t.change))
    verdict = str(c.verdict)
    if c.verdict == MetricVerdict.DIFFERENT:
        verdict += " (worse)" if c.worse else " (better)"
    elif c.verdict == MetricVerdict.UNKNOWN and t.starts_needed is not None:
        verdict += f" (~{t.starts_needed} starts/side)"
    elif c.verdict == MetricVerdict.UNKNOWN:
        verdict += " (too few starts)"
    bad = f" {c.invalid_a}+{c.invalid_b} invalid" if c.invalid_a or c.invalid_b else ""
    return f"    {c.metric:<29} {_short(c.mean_b)}→{_short(c.mean_a)} n={c.n_b}/{c.n_a}{bad} {change} {verdict}"


def _short(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"

