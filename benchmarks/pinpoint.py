"""Chromium Pinpoint's performance bisection, written from its sources for the metric bisect benchmark.

Read (never copied) from catapult's `dashboard/dashboard/pinpoint/models/`: `job_state.py` (how a job
adds attempts and changes), `exploration.py` (the bisection), `compare/compare.py` and
`compare/thresholds.py` (the decision), `compare/thresholds_performance.py` (how the thresholds were
made), `compare/mann_whitney_u.py`, `compare/kolmogorov_smirnov.py` and `dashboard/common/math_utils.py`
(the tests and the IQR). The procedure:

* A job starts with two changes (the good and the bad commit), each given 10 attempts (one attempt is
  one run of the benchmark; here, one server start and its value).
* When every attempt has finished, `Explore` walks the adjacent pairs of changes in commit order and
  compares each: DIFFERENT → up to three new changes between them, the midpoints of two levels of a
  binary search (the middle, then the middles of both halves), 10 attempts each; UNKNOWN → 10 more
  attempts for the change of the pair with fewer; SAME → nothing. Repeat until nothing is added.
* `Compare`: the p-value is the smaller of a Mann–Whitney U (normal approximation, tie and continuity
  corrections) and a two-sample Kolmogorov–Smirnov test of the two changes' attempt values (the mean
  of each attempt). p ≤ 0.01 → DIFFERENT; p above the "high threshold" → SAME; between → UNKNOWN. The
  high threshold depends on the magnitude looked for, in IQRs (the job's magnitude divided by the
  larger IQR of the two samples; 1.0 without one) and on the attempt count (the mean of the two):
  it is the 99th percentile of the Mann–Whitney p-value between two normal samples that far apart at
  that sample size, so a real difference of that magnitude is called SAME at most 1 % of the time; it
  falls with the sample size until it crosses 0.01, where every comparison is decided (about 35
  attempts a side for one IQR, 120 for half an IQR). The thresholds are regenerated here by that
  procedure (`high_thresholds`), not read from the table.
* The culprits: adjacent changes (neighbouring commits) whose comparison is DIFFERENT; the later one
  is the culprit.

Two details follow the current source rather than one of its versions: the magnitude row is the
magnitude rounded down to 0.1 IQR, clipped to 0.3–4.0 (one version indexed the table five rows off
its labels), and the "new" thresholds the source only logs (`_MIN_*_THRESHOLDS_FUNCTIONAL`) are not
used. Pinpoint runs all of a round's attempts at once; the benchmark counts GPU time, not rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import erfc

REPEAT_COUNT_INCREASE = 10
SPECULATION_LEVELS = 2
LOW_THRESHOLD = 0.01
DISTANCES = tuple(round(0.3 + 0.1 * i, 1) for i in range(38))  # 0.3 .. 4.0 IQR
_SIMULATIONS = 4000
_MAX_SAMPLE = 480
_THRESHOLDS: dict[float, np.ndarray] = {}
SD_PER_IQR = 1.3489795003921634  # the IQR of a normal distribution, in standard deviations

DIFFERENT, SAME, UNKNOWN = "different", "same", "unknown"


# ---- the tests -----------------------------------------------------------------------------------


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann–Whitney U p-value, normal approximation with tie and continuity corrections (U
    counted by binary search: the pairs where a is greater, ties by half)."""
    x, y = np.asarray(a, dtype=float), np.sort(np.asarray(b, dtype=float))
    n1, n2 = x.size, y.size
    below, upto = np.searchsorted(y, x, side="left"), np.searchsorted(y, x, side="right")
    u = float(np.sum(below + 0.5 * (upto - below)))
    both = np.sort(np.concatenate([x, y]))
    size = both.size
    tie = 1.0
    if size >= 2 and np.any(both[1:] == both[:-1]):
        _, counts = np.unique(both, return_counts=True)
        tie = 1.0 - float(np.sum(counts**3 - counts)) / (size**3 - size)
    if tie == 0:
        return 1.0
    sd = math.sqrt(tie * n1 * n2 * (n1 + n2 + 1) / 12.0)
    z = (max(u, n1 * n2 - u) - n1 * n2 / 2.0 - 0.5) / sd
    return min(1.0, math.erfc(abs(z) / math.sqrt(2)))


def ks_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample Kolmogorov–Smirnov p-value: the asymptotic distribution at (en + 0.12 + 0.11/en) d."""
    x, y = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    n1, n2 = x.size, y.size
    allv = np.concatenate([x, y])
    d = float(np.max(np.abs(np.searchsorted(x, allv, side="right") / n1
                            - np.searchsorted(y, allv, side="right") / n2)))
    en = math.sqrt(n1 * n2 / (n1 + n2))
    lam = (en + 0.12 + 0.11 / en) * d
    if lam < 1.1e-16:
        return 1.0
    k = np.arange(1, 101)
    p = 2 * float(np.sum((-1.0) ** (k - 1) * np.exp(-2 * k * k * lam * lam)))
    return min(1.0, max(0.0, p))


def iqr(values: Sequence[float]) -> float:
    """Interquartile range, quartiles interpolated between closest ranks at index n p - 1/2."""
    v = np.sort(np.asarray(values, dtype=float))

    def pct(p: float) -> float:
        index = v.size * p - 0.5
        lo, hi = max(math.floor(index), 0), min(math.ceil(index), v.size - 1)
        if lo == hi:
            return float(v[lo])
        return float(v[lo] + (v[hi] - v[lo]) * (index - lo))

    return pct(0.75) - pct(0.25)


# ---- the high thresholds -------------------------------------------------------------------------


def _running_mwu_p(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mann–Whitney p-values of a[:, :n] against b[:, :n] for every n, for many simulations at once
    (continuous data: no ties). U counts pairs with b > a; it grows by the new pairs at each n."""
    sims, m = a.shape
    u = np.zeros(sims)
    out = np.empty((sims, m))
    for n in range(1, m + 1):
        an, bn = a[:, n - 1:n], b[:, n - 1:n]
        # New pairs: (a_n, b_j<=n) and (a_i<n, b_n).
        u += np.sum(b[:, :n] > an, axis=1) + np.sum(bn > a[:, :n - 1], axis=1)
        big = np.maximum(u, n * n - u)
        sd = math.sqrt(n * n * (2 * n + 1) / 12.0)
        z = (big - n * n / 2.0 - 0.5) / sd
        out[:, n - 1] = np.minimum(1.0, erfc(np.abs(z) / math.sqrt(2)))
    return out


def high_thresholds(simulations: int = _SIMULATIONS, seed: int = 0) -> dict[float, np.ndarray]:
    """Per distance (IQR), the high threshold at each sample size from 1: the 99th percentile of the
    Mann–Whitney p-value between two normal samples that far apart, up to the size where it falls
    below the low threshold (the table's last entry)."""
    if _THRESHOLDS:
        return _THRESHOLDS
    rng = np.random.default_rng(seed)
    for d in DISTANCES:
        shift = d * SD_PER_IQR
        size = 40
        while True:
            a = rng.standard_normal((simulations, size))
            b = rng.standard_normal((simulations, size)) + shift
            p = _running_mwu_p(a, b)
            t = np.percentile(p, 99, axis=0)
            below = np.flatnonzero(t <= LOW_THRESHOLD)
            if below.size or size >= _MAX_SAMPLE:
                end = int(below[0]) + 1 if below.size else size
                _THRESHOLDS[d] = t[:end]
                break
            size = min(_MAX_SAMPLE, size * 2)
    return _THRESHOLDS


def high_threshold(magnitude_iqr: float, attempt_count: int) -> float:
    table = high_thresholds()
    d = min(max(math.floor(magnitude_iqr * 10 + 1e-9) / 10, DISTANCES[0]), DISTANCES[-1])
    row = table[round(d, 1)]
    return float(row[min(attempt_count, row.size) - 1])


def compare(values_a: Sequence[float], values_b: Sequence[float], attempt_count: int,
            magnitude_iqr: float) -> str:
    if not values_a or not values_b:
        return UNKNOWN
    p = min(ks_p(values_a, values_b), mann_whitney_p(values_a, values_b))
    if p <= LOW_THRESHOLD:
        return DIFFERENT
    if p <= high_threshold(magnitude_iqr, attempt_count):
        return UNKNOWN
    return SAME


# ---- the job -------------------------------------------------------------------------------------


@dataclass
class PinpointJob:
    """A performance bisect over commits 0 .. n; `magnitude`: the size of change looked for, in the
    metric's unit (None: one IQR)."""

    n: int
    magnitude: float | None = None
    changes: list[int] = field(default_factory=list)
    values: dict[int, list[float]] = field(default_factory=dict)
    scheduled: dict[int, int] = field(default_factory=dict)  # attempts asked for per change
    _seen: dict[tuple[int, int, int, int], str] = field(default_factory=dict)  # comparisons made

    def __post_init__(self) -> None:
        for c in (0, self.n):
            self._add_change(c)

    def _add_change(self, c: int) -> None:
        self.changes.append(c)
        self.changes.sort()
        self.values.setdefault(c, [])
        self.scheduled[c] = self.scheduled.get(c, 0) + REPEAT_COUNT_INCREASE

    def pending(self) -> dict[int, int]:
        """Attempts still to run, per change."""
        return {c: s - len(self.values[c]) for c, s in self.scheduled.items() if s > len(self.values[c])}

    def tell(self, c: int, value: float) -> None:
        self.values[c].append(value)

    def _compare(self, a: int, b: int) -> str:
        va, vb = self.values[a], self.values[b]
        key = (a, b, len(va), len(vb))
        if key not in self._seen:
            self._seen[key] = self._compare_now(va, vb)
        return self._seen[key]

    def _compare_now(self, va: list[float], vb: list[float]) -> str:
        count = (len(va) + len(vb)) // 2
        if self.magnitude:
            widest = max(iqr(va), iqr(vb))
            magnitude = abs(self.magnitude / widest) if widest else 1000.0
        else:
            magnitude = 1.0
        return compare(va, vb, count, magnitude)

    def explore(self) -> bool:
        """One `Explore` once every attempt is done: returns whether it added work."""
        if self.pending():
            raise RuntimeError("explore with attempts still running")
        refine: list[int] = []
        added: list[int] = []
        for a, b in zip(self.changes, self.changes[1:], strict=False):
            result = self._compare(a, b)
            if result == UNKNOWN:
                refine.append(a if len(self.values[a]) <= len(self.values[b]) else b)
            elif result == DIFFERENT:
                for m in _speculate(a, b, SPECULATION_LEVELS):
                    if m not in added and m not in self.changes:
                        added.append(m)
        for c in refine:
            self.scheduled[c] += REPEAT_COUNT_INCREASE
        for c in added:
            self._add_change(c)
        return bool(refine or added)

    def culprits(self) -> list[tuple[int, int]]:
        """Adjacent changes of neighbouring commits compared DIFFERENT: (before, culprit)."""
        return [(a, b) for a, b in zip(self.changes, self.changes[1:], strict=False)
                if b - a == 1 and self._compare(a, b) == DIFFERENT]

    @property
    def attempts(self) -> int:
        return sum(len(v) for v in self.values.values())


def _midpoint(a: int, b: int) -> int | None:
    return (a + b) // 2 if b - a > 1 else None


def _speculate(a: int, b: int, levels: int) -> list[int]:
    """The midpoints of `levels` levels of a binary search between a and b, in commit order."""
    if levels == 0:
        return []
    m = _midpoint(a, b)
    if m is None:
        return []
    return [*_speculate(a, m, levels - 1), m, *_speculate(m, b, levels - 1)]
