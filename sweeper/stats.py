"""Statistics for failure rates and the noisy bisect: Wilson intervals, Wald's sequential
test, and the vectorised posterior over the position of a step in failure rate.

Pure: numpy and the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Stands in for log(0) so that 0 * log(0) stays 0 in vectorised products.
_LOG_ZERO = -1.0e6


def z_for(confidence: float) -> float:
    """Two-sided normal quantile: z_for(0.95) == 1.96."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k failures in n samples; (0, 1) when n == 0."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def kl_bernoulli(p: float, q: float) -> float:
    """KL(Bernoulli(p) || Bernoulli(q)) in nats; q is clipped away from 0 and 1."""
    q = min(max(q, 1e-12), 1 - 1e-12)
    out = 0.0
    if p > 0:
        out += p * math.log(p / q)
    if p < 1:
        out += (1 - p) * math.log((1 - p) / (1 - q))
    return out


def samples_to_decide(p_good: float, p_bad: float, confidence: float) -> int:
    """Expected samples for a sequential test to tell p_good from p_bad at `confidence`.

    Wald: log-odds needed / information per sample, taking the slower of the two
    directions. With p_good == 0 this is log(1 - conf) / log(1 - p_bad): the clean run
    needed to call a commit good.
    """
    if p_bad <= p_good:
        raise ValueError(f"p_bad ({p_bad}) must exceed p_good ({p_good})")
    need = math.log(confidence / (1 - confidence))
    info = min(kl_bernoulli(p_good, p_bad), kl_bernoulli(p_bad, p_good))
    return max(1, math.ceil(need / max(info, 1e-12)))


class Decision(Enum):
    GOOD = "good"
    BAD = "bad"
    CONTINUE = "continue"


def sprt(failures: int, samples: int, p_good: float, p_bad: float,
         confidence: float = 0.99) -> Decision:
    """Wald's sequential probability ratio test: is this commit failing at p_good or p_bad?"""
    if not 0 <= p_good < p_bad <= 1:
        raise ValueError(f"need 0 <= p_good < p_bad <= 1, got {p_good}, {p_bad}")
    passes = samples - failures
    llr = 0.0  # log P(data | bad) - log P(data | good)
    if failures:
        llr += failures * (math.log(p_bad) - (math.log(p_good) if p_good > 0 else -math.inf))
    if passes:
        llr += passes * ((math.log1p(-p_bad) if p_bad < 1 else -math.inf) - math.log1p(-p_good))
    bound = math.log(confidence / (1 - confidence))
    if llr >= bound:
        return Decision.BAD
    if llr <= -bound:
        return Decision.GOOD
    return Decision.CONTINUE


def logsumexp(a: FloatArray, axis: int = -1) -> FloatArray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out: FloatArray = np.log(np.sum(np.exp(a - m), axis=axis)) + np.squeeze(m, axis=axis)
    return out


@dataclass(frozen=True)
class RatePrior:
    """A grid of failure rates with prior weights for the baseline and for the regression.

    The baseline ("good") rate has an atom at exactly 0 (flawless commits are common) and a
    log-uniform spread up to `good_max`; the regressed ("bad") rate is logit-uniform from
    `bad_min` to nearly 1. The model requires bad > min_ratio * good: a regression at
    least doubles the failure rate (by default). That makes a step identifiable, lets a
    single failure settle a commit when the baseline is clean, and lets "both endpoints
    fail alike" become evidence for no culprit instead of a tiny step.
    """

    rates: FloatArray
    log_r: FloatArray
    log_1mr: FloatArray
    log_w_good: FloatArray
    log_w_bad: FloatArray
    n_good_below: npt.NDArray[np.intp]  # per bad rate: how many grid rates may be the baseline
    first_bad_above: npt.NDArray[np.intp]  # per baseline rate: the first grid rate that may be bad

    @classmethod
    def default(cls, *, points: int = 48, zero_mass: float = 0.3, good_max: float = 0.5,
                bad_min: float = 0.005, min_ratio: float = 2.0) -> RatePrior:
        eps = 1e-4
        lo, hi = math.log(eps / (1 - eps)), math.log((1 - eps) / eps)
        grid = 1.0 / (1.0 + np.exp(-np.linspace(lo, hi, points)))
        rates = np.concatenate([[0.0], grid])
        with np.errstate(divide="ignore"):
            log_r = np.where(rates > 0, np.log(np.maximum(rates, 1e-300)), _LOG_ZERO)
        log_1mr = np.log1p(-rates)
        w_good = np.zeros_like(rates)
        w_good[0] = zero_mass
        spread = (rates > 0) & (rates <= good_max)
        w_good[spread] = (1 - zero_mass) / spread.sum()
        w_bad = np.where(rates >= bad_min, 1.0, 0.0)
        w_bad /= w_bad.sum()
        allowed = rates[None, :] > min_ratio * rates[:, None]  # [good, bad]
        n_good_below = allowed.sum(axis=0)  # allowed baselines form a prefix of the grid
        first_bad_above = np.argmax(allowed, axis=1)
        first_bad_above[~allowed.any(axis=1)] = rates.size
        with np.errstate(divide="ignore"):
            return cls(rates, log_r, log_1mr, np.log(w_good), np.log(w_bad), n_good_below,
                       first_bad_above)


@dataclass(frozen=True)
class StepPosterior:
    """Posterior over the first bad position j in 1..M (M = number of commits): commits
    before j fail at the baseline rate, commits from j on at the regressed rate; j == M
    means no commit regressed ("no culprit")."""

    log_post: FloatArray  # index j-1 for j in 1..M
    p_good: float  # posterior-mean rates at the most likely position
    p_bad: float

    @property
    def post(self) -> FloatArray:
        out: FloatArray = np.exp(self.log_post)
        return out


def step_posterior(failures: npt.ArrayLike, samples: npt.ArrayLike, log_prior: FloatArray,
                   prior: RatePrior) -> StepPosterior:
    """Posterior over the step position given per-commit failure counts (oldest first).

    The rates are integrated out over the grid with the constraint bad > good; prefix
    sums make every position's likelihood one row of an (M x grid) array, so the cost
    is O(M * grid) per update.
    """
    k = np.asarray(failures, dtype=np.float64)
    n = np.asarray(samples, dtype=np.float64)
    f = n - k
    m = k.size
    ck = np.concatenate([[0.0], np.cumsum(k)])
    cf = np.concatenate([[0.0], np.cumsum(f)])
    kg, fg = ck[1:], cf[1:]  # position j (1..m): commits 0..j-1 are good
    kb, fb = ck[-1] - kg, cf[-1] - fg
    a = kg[:, None] * prior.log_r + fg[:, None] * prior.log_1mr + prior.log_w_good
    a_max = a.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        cum_a = np.log(np.cumsum(np.exp(a - a_max), axis=1)) + a_max
    # Sum over the baseline rates each bad rate allows (a prefix of the grid).
    padded = np.concatenate([np.full((m, 1), -np.inf), cum_a], axis=1)
    below = padded[:, prior.n_good_below]
    b = kb[:, None] * prior.log_r + fb[:, None] * prior.log_1mr + prior.log_w_bad
    joint = b + below
    log_lik = logsumexp(joint, axis=1)
    log_post = log_lik + log_prior
    log_post = log_post - logsumexp(log_post, axis=0)
    top = int(np.argmax(log_post[: m - 1])) if m > 1 else 0
    p_good, p_bad = _rates_at(a[top], b[top], joint[top], log_lik[top], prior)
    return StepPosterior(log_post, p_good, p_bad)


def _rates_at(a: FloatArray, b: FloatArray, joint: FloatArray, log_lik: float,
              prior: RatePrior) -> tuple[float, float]:
    """Posterior means of the baseline and regressed rates at one step position."""
    p_bad = float(np.sum(np.exp(joint - log_lik) * prior.rates))
    b_max = b.max()
    tail = np.concatenate([np.cumsum(np.exp(b - b_max)[::-1])[::-1], [0.0]])  # sum over b >= index
    above = tail[prior.first_bad_above]
    with np.errstate(divide="ignore"):
        log_above = np.log(above) + b_max
    p_good = float(np.sum(np.exp(a + log_above - log_lik) * prior.rates))
    return p_good, p_bad
