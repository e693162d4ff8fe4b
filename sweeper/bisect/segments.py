"""The posterior of one failure mode's rate along a commit range: piecewise constant, a few
unknown change points, and variation between server starts. Pure: numpy and scipy only.

Model, for the commits c_0 .. c_N of a first-parent range:

* Each position j in 1..N is a change point (c_j is the first commit with a new rate) with
  prior probability `1 - (1 - 1/N) ** expected_changes`-ish: independent per position, about
  `expected_changes` in the whole range. Several changes are allowed; a rise followed by a fall
  is a regression and its fix.
* Each segment between change points draws its own rate from a broad prior: a logit-uniform
  spread over (1e-4, 1 - 1e-4), and optionally an atom at 0 (`zero_mass`, none by default). A
  clean stretch is evidence of a low rate, not of a zero one: with an atom holding half the prior,
  forty clean samples of a 3 % rate "proved" it zero, and the first failing commit after them was
  pinned as the change with near certainty. Independent segment rates favour large changes without
  forbidding small ones: a small change is just less likely a priori and needs more samples, never
  a hard cut.
* One server start (a probe) of n samples at a commit of rate r fails k times with a beta-binomial
  law of mean r and intra-class correlation rho: a start draws its own rate around r (the per-start
  model, `sweeper.judge.start_model`, which holds the rate and dispersion priors' grids). rho is
  unknown, with a discrete prior that puts 40 % on 0, and is learned from the data of the mode
  (repeated starts of a commit, and commits of one segment, disagree more than binomially when
  rho > 0). The posterior mixes over rho; a gap's change is also given at each rho the data leave
  credible, and the search claims the lowest of those (a few odd starts under a high rho look like
  a change under a low one).

Only commits with samples ("points") enter the likelihood; a change between two neighbouring
points can lie anywhere in the gap between them. The exact posterior over all segmentations of
the points is a forward-backward recursion (a product-partition model, O(L^2 * grid) for L
points), which gives for each gap the probability that the rate changes inside it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sweeper.judge.start_model import RHO_CREDIBLE, FloatArray, StartPrior, logsumexp, start_loglik
from sweeper.judge.stats import wilson

# Odds within this factor of each other are one rate to the change-point model (`Prior.same_within`).
SAME_WITHIN = 1.15

__all__ = ["RHO_CREDIBLE", "SAME_WITHIN", "FloatArray", "ModePosterior", "Prior", "Rate", "Segment", "Start",
           "posterior"]


@dataclass(frozen=True)
class Prior(StartPrior):
    """The per-start prior (`sweeper.judge.start_model`) and the change rate along the range."""

    expected_changes: float
    # A single cut between segment rates whose odds differ by at most this factor is no change: a
    # step that small is below what the search resolves (it plans for `min_contrast` steps), and a
    # continuous prior always leaves some mass on one too small for any amount of data to rule out.
    same_within: float = 1.0

    @classmethod
    def default(cls, *, points: int = 64, zero_mass: float = 0.0, expected_changes: float = 1.0,
                rhos: Sequence[float] = (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.35),
                rho_zero_mass: float = 0.4, same_within: float = SAME_WITHIN) -> Prior:
        start = StartPrior.default(points=points, zero_mass=zero_mass, rhos=rhos, rho_zero_mass=rho_zero_mass)
        return cls(start.rates, start.log_w, start.rhos, start.log_w_rho, expected_changes, same_within)

    def change_probability(self, n_positions: int) -> float:
        """Prior probability that one given position is a change point."""
        return min(0.5, self.expected_changes / max(1, n_positions))


@dataclass(frozen=True)
class Start:
    """One server start at commit `index`: `failures` of `samples` in this mode."""

    index: int
    failures: int
    samples: int


@dataclass(frozen=True)
class Rate:
    """Pooled failures of some starts, and the rate they show."""

    failures: int
    samples: int
    starts: int
    rate: float  # pooled failures / samples
    low: float  # 95 % interval (Wilson, on the effective sample size given the learned rho)
    high: float


@dataclass(frozen=True)
class Segment(Rate):
    """A run of points between likely change points, with its pooled rate."""

    first: int  # commit index of its first and last point
    last: int


@dataclass(frozen=True)
class ModePosterior:
    """For the sorted points x_0 < ... < x_{L-1}: P(change inside the gap (x_a, x_{a+1}]) per
    gap, P(no change at all), the dispersion posterior, and the segments of the likely changes."""

    points: tuple[int, ...]
    gap_change: FloatArray  # length L - 1
    no_change: float
    rho_post: FloatArray
    rho: float  # posterior mean intra-class correlation
    segments: tuple[Segment, ...]
    # Per gap, the lowest P(change inside it) given any dispersion the data leave credible
    # (posterior >= RHO_CREDIBLE): the mixture can be sure of a location only a low dispersion
    # supports, where a few odd starts under a higher one would explain the same counts.
    gap_change_low: FloatArray

    def segment_at(self, index: int) -> Segment:
        for seg in self.segments:
            if seg.first <= index <= seg.last:
                return seg
        raise ValueError(f"{index} is not a point of this mode")


def posterior(starts: Sequence[Start], n_positions: int, prior: Prior) -> ModePosterior:
    """The change-point posterior of one mode; `n_positions` = N (commits c_1..c_N may change)."""
    if not starts:
        raise ValueError("a mode needs at least one start")
    points = sorted({s.index for s in starts})
    where = {x: i for i, x in enumerate(points)}
    n_pts = len(points)
    # The quadrature of the rate prior, dense where these counts need it (`Prior.refined`).
    at = [where[s.index] for s in starts]
    prior = prior.refined(np.bincount(at, [s.failures for s in starts], n_pts),
                          np.bincount(at, [s.samples for s in starts], n_pts))
    # Starts repeat their counts (a fixed number of samples, few failures): each distinct (k, n) is
    # evaluated once, and a point's log-likelihood is its starts' sum, an (points x counts) product.
    counts, which = np.unique(np.array([[s.failures, s.samples] for s in starts], dtype=np.float64),
                              axis=0, return_inverse=True)
    ll = start_loglik(counts[:, 0], counts[:, 1], prior)
    tally = np.bincount(np.asarray(at) * counts.shape[0] + which.ravel(),
                        minlength=n_pts * counts.shape[0]).reshape(n_pts, -1).astype(np.float64)
    per_point = (tally @ ll.reshape(counts.shape[0], -1)).reshape(n_pts, prior.rates.size, prior.rhos.size)
    cum = np.concatenate([np.zeros((1, *per_point.shape[1:])), np.cumsum(per_point, axis=0)])
    # seg[a, b, rho] = log ∫ prior(r) Π_{points a..b} lik(r) dr, for a <= b. Split into "rate exactly
    # 0" and "rate > 0": a change must change the rate, and two neighbouring segments that both never
    # fail are one segment, not a change. The positive rates are summed one first point a at a time,
    # over b >= a only: the whole (points, points, rates, rhos) array is hundreds of MB on a fine grid.
    zero = cum[None, 1:, 0, :] - cum[:-1, None, 0, :] + prior.log_w[0]
    positive = np.full((n_pts, n_pts, prior.rhos.size), -np.inf)
    log_w_pos = prior.log_w[None, 1:, None]
    for a in range(n_pts):
        positive[a, a:] = logsumexp(cum[a + 1:, 1:, :] - cum[a, None, 1:, :] + log_w_pos, axis=1)
    seg = np.stack([zero, positive], axis=2)
    valid = np.triu(np.ones((n_pts, n_pts), dtype=bool))
    seg = np.where(valid[:, :, None, None], seg, -np.inf)  # (a, b, zero|positive, rho)

    pi = prior.change_probability(n_positions)
    gaps = np.diff(np.asarray(points, dtype=np.float64))
    log_q = np.log1p(-np.exp(gaps * math.log1p(-pi)))  # some change in the gap
    log_stay = gaps * math.log1p(-pi)  # no change in the gap
    cum_stay = np.concatenate([[0.0], np.cumsum(log_stay)])
    # No change inside a..b: the sum of log_stay over the gaps a..b-1.
    inside = cum_stay[None, :] - cum_stay[:, None]
    inside = np.where(valid, inside, -np.inf)
    block = seg + inside[:, :, None, None]  # (a, b, state, rho)

    n_rho = prior.rhos.size
    # fwd[b, z]: segmentations of points 0..b whose last segment ends at b in state z;
    # bwd[a, z]: segmentations of points a..L-1 whose first segment starts at a in state z.
    # A zero-rate segment may only neighbour a positive one.
    fwd = np.full((n_pts, 2, n_rho), -np.inf)
    for b in range(n_pts):
        terms = block[: b + 1, b].copy()  # (a, state, rho)
        if b > 0:
            prev = fwd[:b] + log_q[:b, None, None]
            terms[1:, 0] += prev[:, 1]
            terms[1:, 1] += logsumexp(prev, axis=1)
        fwd[b] = logsumexp(terms, axis=0)
    bwd = np.full((n_pts, 2, n_rho), -np.inf)
    for a in range(n_pts - 1, -1, -1):
        terms = block[a, a:].copy()  # (b, state, rho)
        if a < n_pts - 1:
            nxt = bwd[a + 1:] + log_q[a:, None, None]
            terms[:-1, 0] += nxt[:, 1]
            terms[:-1, 1] += logsumexp(nxt, axis=1)
        bwd[a] = logsumexp(terms, axis=0)
    log_z_rho = logsumexp(fwd[-1], axis=0)
    log_joint_rho = log_z_rho + prior.log_w_rho
    log_z = float(logsumexp(log_joint_rho))
    rho_post = np.exp(log_joint_rho - log_z)
    no_change = float(np.exp(logsumexp(logsumexp(block[0, -1], axis=0) + prior.log_w_rho) - log_z))
    if n_pts > 1:
        left, right = fwd[:-1] + log_q[:, None, None], bwd[1:]
        pairs = np.stack([left[:, 0] + right[:, 1], left[:, 1] + right[:, 0], left[:, 1] + right[:, 1]], axis=1)
        per_gap = logsumexp(pairs, axis=1) + prior.log_w_rho[None, :]
        # Independent segment rates let one "change" land on (or next to) the rate it left: the
        # data cannot tell it from none, and it capped P(no change) near 1 - E[changes] / grid
        # points however many samples agreed. A single cut between rates whose odds are within
        # `same_within` of each other counts as no change.
        # The first segment ending at each point, and the last starting after it: (gaps, rates, rhos).
        same = _one_cut_same_rate(cum, prior)
        same = same + (log_q + float(cum_stay[-1]) - log_stay)[:, None] + prior.log_w_rho[None, :]
        same_gap = np.exp(same - log_joint_rho[None, :])  # (gaps, rhos), given rho
        given_rho = np.exp(per_gap - log_joint_rho[None, :]) - same_gap  # P(change in gap | rho)
        gap_change = given_rho @ rho_post
        gap_change_low = np.min(given_rho[:, rho_post >= RHO_CREDIBLE], axis=1)
        no_change += float(np.sum(same_gap @ rho_post))
    else:
        gap_change = gap_change_low = np.zeros(0)
    segments = _segments(points, np.clip(gap_change, 0, 1), starts, rho_post, prior)
    return ModePosterior(tuple(points), np.clip(gap_change, 0.0, 1.0), min(1.0, no_change), rho_post,
                         float(np.dot(rho_post, prior.rhos)), segments, np.clip(gap_change_low, 0.0, 1.0))


def _one_cut_same_rate(cum: FloatArray, prior: Prior) -> FloatArray:
    """Per gap and rho: log ∫∫ of the likelihood of one cut there, the two segments' rates within
    `prior.same_within` of each other in odds (the points before the gap on one rate, those after on
    the other): the part of a "change" that is none at the search's resolution."""
    # The first segment ending at each point, and the last starting after it: (gaps, rates, rhos).
    head = cum[1:-1, 1:, :] - cum[0, None, 1:, :] + prior.log_w[None, 1:, None]
    tail = cum[-1, None, 1:, :] - cum[1:-1, 1:, :] + prior.log_w[None, 1:, None]
    x = np.log(prior.rates[1:] / (1 - prior.rates[1:]))
    near = (np.abs(x[:, None] - x[None, :]) <= math.log(max(1.0, prior.same_within)) + 1e-9).astype(np.float64)
    top_h, top_t = head.max(axis=1, keepdims=True), tail.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        # (gaps, rhos, rates) @ (rates, rates): a matrix product, not einsum's unblocked loop.
        paired = np.matmul(np.exp(head - top_h).transpose(0, 2, 1), near).transpose(0, 2, 1)
        out: FloatArray = np.log(np.sum(paired * np.exp(tail - top_t), axis=1)) + top_h[:, 0] + top_t[:, 0]
    return out


def _segments(points: list[int], gap_change: FloatArray, starts: Sequence[Start],
              rho_post: FloatArray, prior: Prior) -> tuple[Segment, ...]:
    """Split the points at gaps more likely changed than not; pool each run's counts."""
    cuts = [0, *[a + 1 for a in range(len(gap_change)) if gap_change[a] > 0.5], len(points)]
    rho = float(np.dot(rho_post, prior.rhos))
    out = []
    for lo, hi in itertools.pairwise(cuts):
        first, last = points[lo], points[hi - 1]
        mine = [s for s in starts if first <= s.index <= last]
        k, n = sum(s.failures for s in mine), sum(s.samples for s in mine)
        # Samples of one start are correlated: the interval uses the effective sample size.
        per_start = n / max(1, len(mine))
        n_eff = n / (1 + max(0.0, per_start - 1) * rho) if n else 0.0
        low, high = wilson(min(n_eff, k * n_eff / n) if n else 0.0, n_eff)
        out.append(Segment(k, n, len(mine), k / n if n else 0.0, low, high, first, last))
    return tuple(out)
