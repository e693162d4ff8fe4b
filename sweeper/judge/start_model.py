"""The per-start model of a failure rate: one server start of n samples at a rate r fails k times
with a beta-binomial law of mean r and intra-class correlation rho (a start draws its own rate
around r), under a prior over (r, rho) held as a grid. Pure: numpy and scipy only.

The bisect's change-point posterior (`sweeper.bisect.segments`) and explain's dispersion of a split
(`sweeper.judge.overdispersion`) both weigh a start's counts by this likelihood; the bisect's
`Prior` is this one plus the rate at which the rate changes along a range.

* The rate prior: a logit-uniform spread over (1e-4, 1 - 1e-4), and optionally an atom at 0
  (`zero_mass`, none by default). A clean stretch is evidence of a low rate, not of a zero one.
* The dispersion prior: a discrete grid of rho that puts `rho_zero_mass` (40 %) on 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Self

import numpy as np
import numpy.typing as npt
from scipy.special import betaln

FloatArray = npt.NDArray[np.float64]

RHO_CREDIBLE = 0.05  # a dispersion with this much posterior mass is one the data have not ruled out
_LOG_ZERO = -1.0e6  # log(0) that keeps 0 * log(0) finite in vectorised sums
_EPS = 1e-4


def logsumexp(a: FloatArray, axis: int | None = None) -> FloatArray:
    """log(sum(exp(a))) along `axis`; scipy's version costs ~0.5 ms a call in overhead alone."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out: FloatArray = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis) if axis is not None else out.reshape(())


@dataclass(frozen=True)
class StartPrior:
    """The rate grid with its weights, and the dispersion grid with its weights (all as logs)."""

    rates: FloatArray
    log_w: FloatArray
    rhos: FloatArray
    log_w_rho: FloatArray

    @classmethod
    def default(cls, *, points: int = 64, zero_mass: float = 0.0,
                rhos: Sequence[float] = (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.35),
                rho_zero_mass: float = 0.4) -> StartPrior:
        lo, hi = math.log(_EPS / (1 - _EPS)), math.log((1 - _EPS) / _EPS)
        grid = 1.0 / (1.0 + np.exp(-np.linspace(lo, hi, points)))
        rates = np.concatenate([[0.0], grid])
        w = np.concatenate([[zero_mass], np.full(points, (1 - zero_mass) / points)])
        r = np.asarray(rhos, dtype=np.float64)
        w_rho = np.where(r == 0, rho_zero_mass, (1 - rho_zero_mass) / max(1, int((r > 0).sum())))
        with np.errstate(divide="ignore"):  # no atom at 0: its weight's log is -inf
            log_w = np.log(w)
        return StartPrior(rates, log_w, r, np.log(w_rho / w_rho.sum()))

    def refined(self, failures: npt.ArrayLike, samples: npt.ArrayLike, *, max_points: int = 256) -> Self:
        """The same prior on a grid dense enough for these per-commit counts: extra rates between the
        lowest and the highest rate the commits show, spaced at the logit standard error of all samples
        pooled (a rate off a grid point by half that costs an eighth of a log unit; at most `max_points`
        of them), each weighted by the logit width it stands for.

        A grid far coarser than the likelihood is a poor quadrature: a segment's marginal is then that
        of the nearest grid rate, and pooled counts lying between two grid rates fit better split in two
        (two segments, each nearer a rate of its own) than whole. With 10^5 samples of one constant rate
        that gap was tens of log units, and a "change" was claimed at 0.9999 where none was."""
        k = np.asarray(failures, dtype=np.float64)
        n = np.asarray(samples, dtype=np.float64)
        keep = n > 0
        k, n = k[keep], n[keep]
        positive = self.rates[self.rates > 0]
        if n.size == 0 or positive.size < 2:
            return self
        x = np.log(positive / (1 - positive))
        lo_x, hi_x = float(x[0]), float(x[-1])
        step = float(np.max(np.diff(x)))
        pooled = float(k.sum() / n.sum())
        p = min(max(pooled, 1.0 / n.sum()), 1 - 1.0 / n.sum())
        fine = 1.0 / math.sqrt(float(n.sum()) * p * (1 - p))
        if fine >= step:  # the likelihood is wider than the grid's step: the grid will do
            return self
        # Each commit's rate, pulled off 0 and 1 by half a failure, bounds the window.
        r = np.clip((k + 0.5) / (n + 1.0), positive[0], positive[-1])
        xr = np.log(r / (1 - r))
        a, b = float(xr.min()) - step, float(xr.max()) + step
        a, b = max(a, lo_x), min(b, hi_x)
        count = min(max_points, math.ceil((b - a) / fine) + 1)
        xs = np.union1d(x, np.linspace(a, b, count))
        # Cell widths in logit (the midpoints between neighbours; the ends reach the prior's range).
        mid = (xs[1:] + xs[:-1]) / 2
        width = np.diff(np.concatenate([[lo_x - step / 2], mid, [hi_x + step / 2]]))
        zero_w = math.exp(float(self.log_w[0])) if self.rates[0] == 0 else 0.0
        w = (1 - zero_w) * width / width.sum()
        rates = np.concatenate([[0.0], 1 / (1 + np.exp(-xs))])
        with np.errstate(divide="ignore"):
            log_w = np.log(np.concatenate([[zero_w], w]))
        return replace(self, rates=rates, log_w=log_w)


def start_loglik(failures: npt.ArrayLike, samples: npt.ArrayLike, prior: StartPrior) -> FloatArray:
    """log P(k | n, rate, rho) without the binomial coefficient (it cancels between models),
    for every start, rate and rho: shape (starts, rates, rhos)."""
    k = np.asarray(failures, dtype=np.float64)[:, None, None]
    n = np.asarray(samples, dtype=np.float64)[:, None, None]
    r = prior.rates[None, :, None]
    rho = prior.rhos[None, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_r = np.where(r > 0, np.log(np.maximum(r, 1e-300)), _LOG_ZERO)
        binom = k * log_r + (n - k) * np.log1p(-r)
        s = np.where(rho > 0, (1 - rho) / np.maximum(rho, 1e-12), 1.0)
        a, b = r * s, (1 - r) * s
        bb = betaln(k + a, n - k + b) - betaln(a, b)
    out = np.where(rho > 0, bb, binom)
    # Rate 0 allows no failure at all, whatever the dispersion.
    out = np.where(r == 0, np.where(k > 0, _LOG_ZERO, 0.0), out)
    return np.broadcast_to(out, (k.shape[0], prior.rates.size, prior.rhos.size)).astype(np.float64)
