"""Failures counted per server start. One start draws its own failure rate, so its samples are not
independent draws: for a split of the starts into two groups (a conjunction's inside and outside),
learn the intra-class correlation from how the starts of each group disagree, and weigh each start's
counts down to what they are worth at that dispersion. Pure: numpy and scipy.

The model is the per-start one the bisect uses too (`sweeper.judge.start_model`): a start of n
samples at rate r fails k times with a beta-binomial law of mean r and intra-class correlation rho;
each group has its own rate (integrated over the rate prior) and the two share rho (the discrete
dispersion prior). A
start of n samples then counts as n / (1 + (n - 1) * rho) samples (the design effect), its failures
in the same proportion. At rho = 0 the effective counts are the raw ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sweeper.judge.start_model import RHO_CREDIBLE, StartPrior, logsumexp, start_loglik

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# The default per-start prior (the bisect's), with its dispersion grid carried on to 0.9: identical replays of a request on
# one server mostly repeat its outcome, so a start of such replays is worth little more than one draw
# per distinct request; the bisect's top of 0.35 would still count it as two or three. Explain keeps
# the atom at 0 (a cell that never fails is a cell without the mode) that the bisect's prior dropped:
# its calibration (BENCHMARKS.md) was measured with it.
PRIOR = StartPrior.default(zero_mass=0.5, rhos=(0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.35, 0.5, 0.7, 0.9))
HIGH_RHO = 0.05  # a dispersion worth saying: a start of 20 samples counts as about 10


@dataclass(frozen=True)
class Dispersion:
    """Per split: the posterior mean rho, and the largest rho the data leave credible."""

    mean: FloatArray
    high: FloatArray
    mode: FloatArray | None = None  # the rho of most posterior mass (0 where the data cannot tell, by the prior)


def loglik(failures: npt.ArrayLike, samples: npt.ArrayLike) -> FloatArray:
    """Each start's log-likelihood over the prior's (rate, rho) grid: shape (starts, rates, rhos)."""
    return start_loglik(failures, samples, PRIOR)


def dispersion(ll: FloatArray, inside: BoolArray, within: BoolArray | None = None) -> Dispersion:
    """The rho posterior of each split, `inside` of shape (splits, starts), over the starts of
    `within` (default: all): two groups, each with its own rate (integrated out under the rate prior)."""
    within = np.ones(ll.shape[0], dtype=bool) if within is None else within
    return grouped(ll, [inside & within[None, :], ~inside & within[None, :]])


def grouped(ll: FloatArray, groups: list[BoolArray]) -> Dispersion:
    """The rho posterior of each split into the given groups (each of shape (splits, starts)); each
    group has its own rate, the groups share rho."""
    s, r, p = ll.shape
    flat = ll.reshape(s, r * p)
    log_w = PRIOR.log_w[None, :, None]
    joint = np.broadcast_to(PRIOR.log_w_rho[None, :], (groups[0].shape[0], p)).copy()
    for group in groups:
        joint += logsumexp((group.astype(np.float64) @ flat).reshape(-1, r, p) + log_w, axis=1)
    post = np.exp(joint - logsumexp(joint, axis=1)[:, None])
    mean = post @ PRIOR.rhos
    high = np.max(np.where(post >= RHO_CREDIBLE, PRIOR.rhos[None, :], 0.0), axis=1)
    mode = PRIOR.rhos[np.argmax(post, axis=1)]
    return Dispersion(mean.astype(np.float64), high.astype(np.float64), mode.astype(np.float64))


def within_settings(ll: FloatArray, setting: npt.ArrayLike, within: BoolArray) -> Dispersion:
    """The rho posterior when every setting (a cell: integer labels per start) has its own rate:
    what starts of the same settings disagree by. Settings with one start leave it to the prior."""
    labels = np.asarray(setting)[within]
    _, r, p = ll.shape
    sums = np.zeros((int(labels.max()) + 1 if labels.size else 0, r, p))
    np.add.at(sums, labels, ll[within])
    joint = logsumexp(sums + PRIOR.log_w[None, :, None], axis=1).sum(axis=0) + PRIOR.log_w_rho
    post = np.exp(joint - logsumexp(joint))
    high = float(np.max(np.where(post >= RHO_CREDIBLE, PRIOR.rhos, 0.0)))
    return Dispersion(np.array([post @ PRIOR.rhos]), np.array([high]))


def weights(samples: npt.ArrayLike, rho: npt.ArrayLike) -> FloatArray:
    """What one sample of each start is worth at each rho: shape (len(rho), starts)."""
    n = np.asarray(samples, dtype=np.float64)[None, :]
    rho_col = np.asarray(rho, dtype=np.float64).reshape(-1, 1)
    w: FloatArray = 1.0 / (1.0 + np.maximum(n - 1.0, 0.0) * rho_col)
    return w


def worth(samples: npt.ArrayLike, rho: float) -> float:
    """The effective sample size of these starts at one rho."""
    n = np.asarray(samples, dtype=np.float64)
    return float((n * weights(n, [rho])[0]).sum())


@dataclass(frozen=True)
class Replays:
    """Per start, what its samples are worth once identical replays are weighed, and the replays'
    correlation (0 where no request is sent twice to one server)."""

    samples: FloatArray
    failures: FloatArray
    rho: float


def replay_correlation(start: npt.ArrayLike, request: npt.ArrayLike, failed: npt.ArrayLike) -> float:
    """How much the outcomes of one request sent again to the same server agree beyond the rate of
    their start: the pairwise (moment) estimate of the intra-class correlation of replays, each
    start centred on its own rate, pooled over the starts that both pass and fail. 0 to 1."""
    s, r = np.asarray(start, dtype=np.int64), np.asarray(request, dtype=np.int64)
    y = np.asarray(failed, dtype=np.float64)
    if s.size == 0:
        return 0.0
    n_s, k_s = np.bincount(s), np.bincount(s, weights=y)
    p_s = np.divide(k_s, n_s, out=np.zeros_like(k_s), where=n_s > 0)
    _, cluster = np.unique(np.stack([s, r]), axis=1, return_inverse=True)
    cluster = cluster.reshape(-1)
    m_c, k_c = np.bincount(cluster), np.bincount(cluster, weights=y)
    start_of = np.zeros(m_c.size, dtype=np.int64)
    start_of[cluster] = s
    pairs = m_c * (m_c - 1.0)
    p = p_s[start_of]
    den = float((p * (1 - p) * pairs).sum())
    if den <= 0:
        return 0.0
    num = float((k_c * (k_c - 1.0) - p * p * pairs).sum())
    # Each start's rate is read off the same samples, which pulls the estimate down a little (most
    # where a start holds few requests): replays are then counted as worth somewhat more, not less.
    return float(np.clip(num / den, 0.0, 1.0))


def replays(start: npt.ArrayLike, request: npt.ArrayLike, failed: npt.ArrayLike, n_starts: int) -> Replays:
    """Weigh each sample of a request sent m times to one server start by 1 / (1 + (m - 1) rho),
    rho the replays' correlation: m identical replays that mostly repeat one outcome count as about
    one draw, m that disagree as they would by chance count as m. Sums per start (`n_starts`)."""
    s, r = np.asarray(start, dtype=np.int64), np.asarray(request, dtype=np.int64)
    y = np.asarray(failed, dtype=np.float64)
    rho = replay_correlation(s, r, y)
    if s.size == 0:
        return Replays(np.zeros(n_starts), np.zeros(n_starts), rho)
    _, cluster = np.unique(np.stack([s, r]), axis=1, return_inverse=True)
    cluster = cluster.reshape(-1)
    m = np.bincount(cluster)[cluster].astype(np.float64)
    w = 1.0 / (1.0 + (m - 1.0) * rho)
    samples = np.bincount(s, weights=w, minlength=n_starts).astype(np.float64)
    failures = np.bincount(s, weights=w * y, minlength=n_starts).astype(np.float64)
    return Replays(samples, failures, rho)
