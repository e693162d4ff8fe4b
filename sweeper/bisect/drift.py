"""Lack of fit of the piecewise-constant model: a failure rate that drifts instead of stepping. Pure.

The change-point model cuts a rate that climbs steadily over many commits into a staircase of
confident steps, each "located" between two neighbouring probes although no single commit made
it. The check here looks at every run of two or more consecutive changes of one mode in the same
direction (the segments between them rise, or fall, monotonically) and compares two fits of the
probed counts over that run's window:

* the staircase: one rate per segment, the change points where the posterior put them
  (2m - 1 parameters for m segments);
* a ramp: a flat rate up to commit A, a straight line from A to B, a flat rate after B
  (4 parameters: two rates, two commits).

Both are maximum-likelihood binomial fits of the pooled counts per commit, the log-likelihood
divided by the design effect of the learned per-start correlation (a start of n samples is worth
n / (1 + (n - 1) rho) independent ones). The run is a drift when the ramp, with fewer parameters,
fits about as well: its penalised deficit (AIC) is no worse than the staircase's. A true two-step
history has a plateau between its steps that a ramp cannot follow once a few probes sit on it.

A lone change is checked too when the search has done all it may on it (`lone`: narrowed to
neighbouring probed commits, one of them at its cap of starts, and still short of the confidence):
the drift's other signature, each step of a ramp too small for any number of samples to call. A
step and a ramp then differ by one parameter, and a step whose sides are noisy can favour the ramp
by chance, so the ramp must win by LONE_MARGIN (a likelihood ratio of e^2 after the penalties).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sweeper.bisect.segments import FloatArray

_GRID = 28  # rates tried for each end of a ramp
MIN_POINTS = 4  # probed commits a window needs before a ramp is worth fitting
# The margin a ramp needs over a lone step. Measured on the calibration benchmark's families (100
# histories each): at 0 a step family was flagged a drift up to 5 % of the time, at 2 at most 1 %.
LONE_MARGIN = 2.0
LONE_REACH = 8  # probed commits on either side of a lone step where its ramp may start or end


@dataclass(frozen=True)
class PointCounts:
    """Pooled counts of one probed commit."""

    index: int
    failures: int
    samples: int


@dataclass(frozen=True)
class Drift:
    """The rate drifts between commit indices `first` and `last` (probed commits on either side of
    the ramp), from about `rate_from` to about `rate_to`; `changes` the staircase's steps it replaces
    (gap numbers of the mode's posterior), `margin` the penalised log-likelihood by which the ramp wins."""

    first: int
    last: int
    rate_from: float
    rate_to: float
    gaps: tuple[int, ...]
    margin: float


def _ll(k: FloatArray, n: FloatArray, r: FloatArray) -> FloatArray:
    r = np.clip(r, 1e-9, 1 - 1e-9)
    out: FloatArray = np.sum(k * np.log(r) + (n - k) * np.log1p(-r), axis=-1)
    return out


def staircase_ll(points: Sequence[PointCounts], cuts: Sequence[int]) -> float:
    """Binomial log-likelihood (no coefficient) of one ML rate per run of points; `cuts` are the
    positions in `points` where a new segment starts."""
    bounds = [0, *cuts, len(points)]
    total = 0.0
    for lo, hi in itertools.pairwise(bounds):
        k = float(sum(p.failures for p in points[lo:hi]))
        n = float(sum(p.samples for p in points[lo:hi]))
        if n > 0:
            total += float(_ll(np.array([k]), np.array([n]), np.array([k / n])))
    return total


def ramp_fit(points: Sequence[PointCounts], starts: Sequence[int] | None = None,
             ends: Sequence[int] | None = None) -> tuple[float, int, int, float, float]:
    """The best ramp: (log-likelihood, A, B, rate at and before A, rate at and after B), A and B
    probed commits (positions in `points`: any, or those of `starts` and `ends`)."""
    x = np.array([p.index for p in points], dtype=np.float64)
    k = np.array([p.failures for p in points], dtype=np.float64)
    n = np.array([p.samples for p in points], dtype=np.float64)
    pooled = np.where(n > 0, k / np.maximum(n, 1), 0.0)
    lo = max(1e-4, 0.5 * float(np.min(pooled[pooled > 0])) if np.any(pooled > 0) else 1e-4)
    hi = min(0.999, 2.0 * float(np.max(pooled)) + 1e-3)
    grid = np.geomspace(lo, max(hi, 1.01 * lo), _GRID)
    ra, rb = grid[:, None, None], grid[None, :, None]
    # The points up to A sit at A's rate and those from B on at B's: their part of the likelihood is
    # their pooled counts' at each end rate (prefix sums), and only the points inside the ramp are
    # summed one by one.
    k_cum, n_cum = np.concatenate([[0.0], np.cumsum(k)]), np.concatenate([[0.0], np.cumsum(n)])
    log_r, log_1r = np.log(grid), np.log1p(-grid)
    best = (-np.inf, int(x[0]), int(x[-1]), float(grid[0]), float(grid[0]))
    for i in (range(len(x)) if starts is None else starts):
        for j in (range(len(x)) if ends is None else ends):
            if j <= i:
                continue
            k_a, n_a = k_cum[i + 1], n_cum[i + 1]
            k_b, n_b = k_cum[-1] - k_cum[j], n_cum[-1] - n_cum[j]
            t = ((x[i + 1:j] - x[i]) / (x[j] - x[i]))[None, None, :]
            ll = (_ll(k[i + 1:j], n[i + 1:j], ra + (rb - ra) * t)
                  + (k_a * log_r + (n_a - k_a) * log_1r)[:, None] + (k_b * log_r + (n_b - k_b) * log_1r)[None, :])
            at = np.unravel_index(int(np.argmax(ll)), ll.shape)
            if float(ll[at]) > best[0]:
                best = (float(ll[at]), int(x[i]), int(x[j]), float(grid[at[0]]), float(grid[at[1]]))
    return best


def find_drifts(points: Sequence[PointCounts], changes: Sequence[tuple[int, bool]], *,
                design_effect: float = 1.0, lone: frozenset[int] = frozenset()) -> list[Drift]:
    """Drifts among `changes` = (gap number, rises) of one mode, oldest first; gap a lies between
    points[a] and points[a + 1]. A change with no same-direction neighbour is checked only when its
    gap is in `lone`."""
    out: list[Drift] = []
    run: list[tuple[int, bool]] = []
    for ch in [*changes, (-1, False)]:
        if run and (ch[0] < 0 or ch[1] != run[-1][1]):
            if len(run) >= 2 or run[0][0] in lone:
                d = _check(points, changes, run, design_effect)
                if d is not None:
                    out.append(d)
            run = []
        if ch[0] >= 0:
            run.append(ch)
    return out


def _check(points: Sequence[PointCounts], changes: Sequence[tuple[int, bool]], run: list[tuple[int, bool]],
           design_effect: float) -> Drift | None:
    gaps = [a for a, _ in changes]
    first_gap, last_gap = run[0][0], run[-1][0]
    # The window: the segment before the run's first change to the segment after its last.
    before = [a for a in gaps if a < first_gap]
    after = [a for a in gaps if a > last_gap]
    lo = before[-1] + 1 if before else 0
    hi = after[0] + 1 if after else len(points)
    window = list(points[lo:hi])
    if len(window) < MIN_POINTS:
        return None
    cuts = [a + 1 - lo for a, _ in run]
    stair = staircase_ll(window, cuts) / design_effect
    # The ramp starts a few probes before the first step at most and ends a few after the last; a
    # lone step's ramp may reach further, its neighbours being the ramp's own small steps.
    reach = 3 if len(run) >= 2 else LONE_REACH
    ramp, a_at, b_at, r_a, r_b = ramp_fit(window, range(max(0, cuts[0] - reach), cuts[0]),
                                          range(cuts[-1], min(len(window), cuts[-1] + reach)))
    ramp /= design_effect
    stair_params, ramp_params = 2 * (len(run) + 1) - 1, 4
    margin = (ramp - ramp_params) - (stair - stair_params)  # AIC / -2
    if margin < (0.0 if len(run) >= 2 else LONE_MARGIN):
        return None
    return Drift(a_at, b_at, r_a, r_b, tuple(a for a, _ in run), margin)
