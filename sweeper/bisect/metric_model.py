"""The posterior of a continuous metric along a commit range: piecewise constant on a log scale, a
few unknown change points, a spread between server starts learned from the data, and heavy tails.
Pure: numpy and scipy only.

Model, for the commits c_0 .. c_N of a first-parent range (a probed commit is a "point"):

* One server start s at commit i reports a value v_s > 0 and the standard error se_s of that value
  within the start (e.g. mean TPOT over 200 requests and its SE). On the log scale, y_s = log v_s and
  its within-start error is se_s / v_s, so every effect is relative.
* The commit has a level mu_i (log of its typical value). A start draws its own deviation from it: y_s
  follows a Student-t of `nu` degrees of freedom (heavy tails: a throttled GPU, a noisy neighbour),
  centred on mu_i, of scale sqrt(tau^2 + se_s^2). tau, the spread between starts, is unknown: a
  discrete grid (`taus`) with a flat prior, learned from the data (repeated starts of one commit and
  commits of one segment disagree by it), the analogue of the failure search's ICC.
* The level is piecewise constant in the commit index. Each position j in 1..N is a change point
  with probability pi = expected_changes / N; several changes are allowed, and a gap between two
  neighbouring points holds a change with probability 1 - (1 - pi)^gap (changes inside one gap net to
  one). The first level is uniform over centre +- `width`. A change moves the level by a step whose
  size is about log-uniform from `resolution` to `max_step` (a 3 % step as likely as a 30 % one, per
  log unit of size; as a mixture of `bands` uniform bands), up or down alike. A step under
  `resolution` is no change to the model: a prior reaching down to 0 always leaves mass on a step too
  small for any amount of data to rule out.
* The levels are marginalised on a grid (`LevelGrid`): uniform steps over the range the data can
  support, each weighted by the prior mass it stands for. The posterior is exact for that grid: a
  hidden Markov chain over the points whose state is the level (stay, or step), forward-backward,
  O(points x grid^2 x taus), one matrix product per transition (a grid holds a few hundred points).

What comes out (`MetricPosterior`): per gap between neighbouring points, P(a change inside it) and
P(a change of at least `material` inside it); P(no change at all) and P(no change of `material` or
more anywhere) (or of any other size: `no_material_at`, a forward pass whose steps stay under it); the
posterior of tau; each point's level; per gap,
the level distributions the planning needs (the left side given a change, the right side given a
change, the shared level given none); and, on demand, a change's size with its interval (`effect`).
tests/test_metric_search.py checks it against every segmentation and every level enumerated.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import gammaln

FloatArray = npt.NDArray[np.float64]

DEFAULT_TAUS = (0.003, 0.007, 0.013, 0.022, 0.035, 0.055)
# Grid steps: at most this coarse, at least this fine (log units: 0.4 % and 0.02 %).
MAX_STEP = 0.004
MIN_STEP = 0.0002
# The grid step, in posterior sds of the narrowest level the data could show (all starts in one
# segment, at 0.7 of their spread): a sum over a Gaussian bump at a step of 2.5 sds is its integral to
# within 4 % (the error of the trapezoid rule is about 2 exp(-2 pi^2 (sd / step)^2)), 0.04 in a log
# evidence where a claim at 0.99 needs 4.6.
STEP_IN_SDS = 2.5


@dataclass(frozen=True)
class MetricPrior:
    """The model's fixed choices (log scale: 0.03 is a 3 % step)."""

    expected_changes: float = 1.0
    resolution: float = 0.015  # the smallest step a change makes
    material: float = 0.03  # the size a change must reach to matter (min_effect)
    width: float = 0.5  # the first level: uniform over centre +- width
    max_step: float = 0.5  # the largest step a change makes
    bands: int = 4  # uniform bands of the step's size, geometric from resolution to max_step
    taus: tuple[float, ...] = DEFAULT_TAUS
    nu: float = 3.0

    def change_probability(self, n_positions: int) -> float:
        """Prior probability that one given position is a change point."""
        return min(0.5, self.expected_changes / max(1, n_positions))

    def band_weights(self) -> tuple[FloatArray, FloatArray]:
        """The step's size as a mixture of uniforms over [resolution, edge_m) (either sign): the edges and
        weights that make its density a staircase through 1 / size (equal mass in each band)."""
        edges = np.geomspace(self.resolution, self.max_step, self.bands + 1)
        width = np.diff(edges)
        density = (1.0 / self.bands) / (2 * width)  # per unit of step, both signs
        nxt = np.concatenate([density[1:], [0.0]])
        weights = 2 * (edges[1:] - self.resolution) * (density - nxt)
        return edges[1:], weights


@dataclass(frozen=True)
class LevelGrid:
    """Uniform level points `mu` (log scale), `step` apart, each with prior mass step / (2 width)."""

    mu: FloatArray
    step: float
    centre: float
    width: float

    @property
    def weight(self) -> float:
        return self.step / (2 * self.width)

    def window(self, delta: float) -> int:
        """Grid steps r such that |i - i'| <= r means |mu_i - mu_i'| < delta."""
        return max(0, math.ceil(delta / self.step - 1e-9) - 1)


def grid_needs(y: FloatArray, se: FloatArray, index: Sequence[int], prior: MetricPrior) -> tuple[float, float, float]:
    """What a grid needs for these starts: (its largest step, the lowest and the highest level it must
    hold). From the lowest to the highest commit median, with a margin of two spreads and `material`
    either side (single outlying starts need no grid of their own: a t-likelihood is flat far from
    them), at a step of `STEP_IN_SDS` of the narrowest level posterior the data could show."""
    idx = np.asarray(index)
    order = np.lexsort((y, idx))
    ys, ids = y[order], idx[order]
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    count = np.diff(np.r_[first, ids.size])
    medians = (ys[first + (count - 1) // 2] + ys[first + count // 2]) / 2
    spread = _spread(ys, se, first, count, medians)
    narrow = max(0.7 * spread, float(np.median(se)), prior.taus[0]) / math.sqrt(max(1, y.size))
    step = float(np.clip(narrow * STEP_IN_SDS, MIN_STEP, MAX_STEP))
    # A commit of one start may be one outlying start: it widens the grid by at most three spreads
    # beyond the commits of several (its level alone is a flat t-likelihood that far out).
    core = medians[count >= 2] if np.any(count >= 2) else medians
    lo = max(float(medians.min()), float(core.min()) - 3 * spread)
    hi = min(float(medians.max()), float(core.max()) + 3 * spread)
    margin = 2 * spread + prior.material
    return step, lo - margin, hi + margin


def make_grid(centre: float, step: float, lo: float, hi: float, prior: MetricPrior) -> LevelGrid:
    """Points centre + k step (the same lattice for the same step, whatever the range) from lo to hi,
    within the first level's prior."""
    lo, hi = max(lo, centre - prior.width), min(hi, centre + prior.width)
    k_lo, k_hi = math.floor((lo - centre) / step), math.ceil((hi - centre) / step)
    return LevelGrid(centre + step * np.arange(k_lo, k_hi + 1, dtype=np.float64), step, centre, prior.width)


def level_grid(y: FloatArray, se: FloatArray, index: Sequence[int], prior: MetricPrior, centre: float) -> LevelGrid:
    """A grid dense and wide enough for these starts (`grid_needs`)."""
    step, lo, hi = grid_needs(y, se, index, prior)
    return make_grid(centre, step, lo, hi, prior)


def _spread(ys: FloatArray, se: FloatArray, first: npt.NDArray[np.int_], count: npt.NDArray[np.int_],
            medians: FloatArray) -> float:
    """A robust per-start spread: the median absolute deviation of starts from their commit's median
    (commits with two or more starts), else the within-start errors."""
    floor = float(np.median(se)) if se.size else 0.0
    rep = np.repeat(np.arange(first.size), count)
    dev = np.abs(ys - medians[rep])[count[rep] >= 2]
    if dev.size >= 3:
        return max(1.4826 * float(np.median(dev)) * 1.2, floor, 1e-4)
    return max(floor, 0.01)


def start_loglik(y: FloatArray, se: FloatArray, grid: LevelGrid, prior: MetricPrior) -> FloatArray:
    """log t_nu(y_s | mu, sqrt(tau^2 + se_s^2)) for every start, level and tau: (starts, grid, taus)."""
    nu = prior.nu
    scale = np.sqrt(np.asarray(prior.taus)[None, None, :] ** 2 + se[:, None, None] ** 2)
    z2 = ((y[:, None, None] - grid.mu[None, :, None]) / scale) ** 2
    const = gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * math.log(nu * math.pi)
    out: FloatArray = const - np.log(scale) - (nu + 1) / 2 * np.log1p(z2 / nu)
    return out


@dataclass(frozen=True)
class Kernel:
    """The step's kernel on a grid: band m puts `mass[m]` on each offset d with r0 < |d| <= radius[m]."""

    r0: int
    radius: tuple[int, ...]
    mass: tuple[float, ...]

    @classmethod
    def on(cls, grid: LevelGrid, prior: MetricPrior) -> Kernel:
        return _kernel_on(grid.step, prior)

    def offsets(self, n: int) -> FloatArray:
        """Its mass at offsets d = -(n - 1) .. n - 1."""
        d = np.abs(np.arange(-(n - 1), n))
        out = np.zeros(d.size)
        for r, m in zip(self.radius, self.mass, strict=True):
            out += np.where((d > self.r0) & (d <= r), m, 0.0)
        return out

    def apply(self, v: FloatArray, *, below: int | None = None, above: int | None = None) -> FloatArray:
        """sum over mu of v(mu) K(mu' - mu) along axis 0 (the kernel is symmetric, so this is also its
        transpose), for steps of at most `below` grid steps (|d| <= below), or more than `above`."""
        out: FloatArray = _kernel_matrix(self, v.shape[0], below, above) @ v
        return out


@functools.lru_cache(maxsize=16)
def _kernel_on(step: float, prior: MetricPrior) -> Kernel:
    def window(delta: float) -> int:  # as LevelGrid.window
        return max(0, math.ceil(delta / step - 1e-9) - 1)

    r0 = window(prior.resolution)
    edges, weights = prior.band_weights()
    radius, mass = [], []
    for e, w in zip(edges, weights, strict=True):
        r = max(r0 + 1, window(e))
        radius.append(r)
        mass.append(float(w) / (2 * (r - r0)))
    return Kernel(r0, tuple(radius), tuple(mass))


@functools.lru_cache(maxsize=16)
def _kernel_matrix(kernel: Kernel, n: int, below: int | None, above: int | None) -> FloatArray:
    """The kernel on n grid points as a matrix, M[i, j] = K(j - i) (symmetric); restricted to steps of
    at most `below` grid steps, or more than `above`. A grid holds a few hundred points, so one matrix
    product per transition is cheaper than any sum of window sums in numpy's per-call overhead."""
    d = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])
    out = np.zeros((n, n))
    for r, m in zip(kernel.radius, kernel.mass, strict=True):
        lo, hi = kernel.r0, r
        if below is not None:
            hi = min(hi, below)
        if above is not None:
            lo = max(lo, above)
        if hi > lo:
            out += np.where((d > lo) & (d <= hi), m, 0.0)
    return out


@dataclass(frozen=True)
class Moments:
    """Mean and variance of a level distribution (log scale), per gap."""

    mean: FloatArray
    var: FloatArray


@dataclass(frozen=True)
class MetricPosterior:
    """The posterior over the sorted points x_0 < ... < x_{L-1} (commit indices)."""

    points: tuple[int, ...]
    gap_change: FloatArray  # P(a change inside the gap (x_a, x_{a+1}]), length L - 1
    gap_material: FloatArray  # P(a change of at least `material` inside it)
    gap_change_by_tau: FloatArray  # (taus, L - 1): the same at each tau
    tau_post: FloatArray
    taus: FloatArray
    level_mean: FloatArray  # each point's level, posterior mean (log scale)
    left: Moments  # per gap: level at x_a given a change in the gap (data up to x_a)
    right: Moments  # level at x_{a+1} given a change in the gap (data from x_{a+1} on)
    shared: Moments  # the level both share given no change in the gap
    grid: LevelGrid
    prior: MetricPrior
    log_evidence: float
    # Kept for `effect` and `no_material_at`: forward messages (L, grid, taus), emission times backward
    # messages (L, grid, taus), the gaps' stay probabilities, the shifted emissions, the evidence per
    # tau less the emission shifts.
    _alpha: FloatArray
    _u: FloatArray
    _stay: FloatArray
    _emit: FloatArray
    _log_z: FloatArray

    @property
    def tau(self) -> float:
        """Posterior mean of the between-start spread."""
        return float(np.dot(self.tau_post, self.taus))

    def credible_taus(self, mass: float = 0.05) -> npt.NDArray[np.bool_]:
        return self.tau_post >= mass

    def effect(self, gap: int) -> tuple[float, float, float]:
        """The log step mu_{x_{a+1}} - mu_{x_a} given a change in gap `gap`: posterior median and 95 %
        interval, mixed over tau."""
        g = self.grid
        n = g.mu.size
        kernel = Kernel.on(g, self.prior).offsets(n)
        total = np.zeros(2 * n - 1)
        for t in range(self.taus.size):
            # d = j - i over all pairs (i left, j right): b convolved with a reversed, at index d + n - 1.
            dist = np.convolve(self._u[gap + 1, :, t], self._alpha[gap, ::-1, t]) * kernel
            s = dist.sum()
            if s > 0:
                total += dist / s * self.tau_post[t] * float(self.gap_change_by_tau[t, gap])
        if total.sum() <= 0:
            return 0.0, 0.0, 0.0
        cdf = np.cumsum(total) / total.sum()
        steps = np.arange(-(n - 1), n) * g.step

        def q(p: float) -> float:
            return float(steps[min(int(np.searchsorted(cdf, p)), steps.size - 1)])

        return q(0.5), q(0.025), q(0.975)

    @functools.cached_property
    def no_change(self) -> float:
        """P(no change anywhere)."""
        return _only_stay(self._emit, self._stay, self.grid, self._log_z, self.tau_post)

    @functools.cached_property
    def no_material(self) -> float:
        """P(no change of `material` or more anywhere)."""
        return self.no_material_at(self.prior.material)

    def no_material_at(self, size: float) -> float:
        """P(no change of at least `size` (log) anywhere)."""
        return _no_change_above(self._emit, self._stay, self.grid, self.prior, size, log_z=self._log_z,
                                tau_post=self.tau_post)


def _logsumexp(a: FloatArray, axis: int) -> FloatArray:
    m = np.max(a, axis=axis, keepdims=True)
    out: FloatArray = np.squeeze(np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m, axis=axis)
    return out


def point_loglik(y: FloatArray, se: FloatArray, grid: LevelGrid, prior: MetricPrior) -> FloatArray:
    """The log-likelihood of one commit's starts at each level and tau, (grid, taus)."""
    out: FloatArray = start_loglik(y, se, grid, prior).sum(axis=0)
    return out


def _forward(emit: FloatArray, stay: FloatArray, grid: LevelGrid, kernel: Kernel,
             below: int | None) -> tuple[FloatArray, FloatArray]:
    """Scaled forward messages (L, grid, taus) and log scale factors (L, taus); steps of at most `below`
    grid steps, if given."""
    step = _kernel_matrix(kernel, emit.shape[1], below, None)
    alpha = np.empty_like(emit)
    c = np.empty((emit.shape[0], emit.shape[2]))
    a = grid.weight * emit[0]
    c[0] = np.maximum(a.sum(axis=0), 1e-300)
    alpha[0] = a / c[0]
    for k in range(1, emit.shape[0]):
        prev = alpha[k - 1]
        a = (stay[k - 1] * prev + (1 - stay[k - 1]) * (step @ prev)) * emit[k]
        c[k] = np.maximum(a.sum(axis=0), 1e-300)
        alpha[k] = a / c[k]
    return alpha, np.log(c)


def posterior(index: Sequence[int], values: Sequence[float] | FloatArray, se: Sequence[float] | FloatArray,
              n_positions: int, prior: MetricPrior, *, centre: float | None = None,
              grid: LevelGrid | None = None) -> MetricPosterior:
    """The change-point posterior of the starts (commit index, log value, log-scale SE), with
    `n_positions` = N (commits c_1..c_N may change)."""
    y = np.asarray(values, dtype=np.float64)
    s = np.asarray(se, dtype=np.float64)
    if y.size == 0:
        raise ValueError("a posterior needs at least one start")
    if grid is None:
        grid = level_grid(y, s, index, prior, float(np.median(y)) if centre is None else centre)
    idx = np.asarray(index)
    points = sorted(set(index))
    log_emit = np.stack([point_loglik(y[idx == x], s[idx == x], grid, prior) for x in points])
    return posterior_of_points(points, log_emit, n_positions, prior, grid)


def posterior_of_points(points: Sequence[int], log_emit: FloatArray, n_positions: int, prior: MetricPrior,
                        grid: LevelGrid) -> MetricPosterior:
    """The posterior from each point's log-likelihood on `grid` ((L, grid, taus), `point_loglik`), the
    points their commit indices, increasing."""
    shift = log_emit.max(axis=1)  # (L, taus)
    emit = np.exp(log_emit - shift[:, None, :])
    n_pts, _, n_tau = emit.shape
    kernel = Kernel.on(grid, prior)
    r1 = grid.window(prior.material)
    pi = prior.change_probability(n_positions)
    gaps = np.diff(np.asarray(points, dtype=np.float64))
    stay = np.exp(gaps * math.log1p(-pi))  # P(no change in the gap)

    alpha, log_c = _forward(emit, stay, grid, kernel, None)
    log_z = log_c.sum(axis=0)  # per tau, less the shifts

    # Backward, scaled so that sum(alpha_k * beta_k) = 1; u_k = emit_k * beta_k.
    step = _kernel_matrix(kernel, emit.shape[1], None, None)
    c = np.exp(log_c)
    beta = np.ones_like(emit)
    u = np.empty_like(emit)
    u[-1] = emit[-1]
    back = np.empty((n_pts - 1, *emit.shape[1:]))  # J^T u_{k+1}
    for k in range(n_pts - 2, -1, -1):
        back[k] = step @ u[k + 1]
        beta[k] = (stay[k] * u[k + 1] + (1 - stay[k]) * back[k]) / c[k + 1]
        u[k] = emit[k] * beta[k]
    # P(a step in gap k) = (1 - stay) sum alpha_k J^T u_{k+1} / c_{k+1}; of `material` or more, the same
    # with the kernel cut below it.
    scale = (1 - stay)[:, None] / c[1:]  # (gaps, taus)
    jump_p = (scale * np.einsum("kgt,kgt->kt", alpha[:-1], back)).T
    big = np.matmul(_kernel_matrix(kernel, emit.shape[1], None, r1), u[1:])
    mat_p = (scale * np.einsum("kgt,kgt->kt", alpha[:-1], big)).T

    log_joint = log_z + shift.sum(axis=0) - math.log(n_tau)
    top = float(log_joint.max())
    log_evidence = top + math.log(float(np.exp(log_joint - top).sum()))
    tau_post = np.exp(log_joint - log_evidence)

    # Each point's level: alpha * beta normalised is its marginal (alpha * u / emit, without dividing).
    gamma = alpha * beta
    level_mean = _moments(gamma[None], grid, tau_post).mean[0]
    left, right, shared = _gap_moments(alpha, u, grid, tau_post)
    return MetricPosterior(
        tuple(points), tau_post @ jump_p, tau_post @ mat_p, jump_p, tau_post,
        np.asarray(prior.taus, dtype=np.float64), level_mean, left, right, shared, grid, prior,
        log_evidence, alpha, u, stay, emit, log_z)


def _no_change_above(emit: FloatArray, stay: FloatArray, grid: LevelGrid, prior: MetricPrior, size: float, *,
                     log_z: FloatArray, tau_post: FloatArray) -> float:
    """P(every change is smaller than `size`): a forward pass whose steps stay under it. `log_z` is the
    evidence per tau less the emission shifts (the same shifts cancel here)."""
    kernel = Kernel.on(grid, prior)
    below = grid.window(size)
    if below <= kernel.r0:
        return _only_stay(emit, stay, grid, log_z, tau_post)
    _, log_c = _forward(emit, stay, grid, kernel, below)
    return float(np.sum(tau_post * np.exp(np.minimum(log_c.sum(axis=0) - log_z, 0.0))))


def _only_stay(emit: FloatArray, stay: FloatArray, grid: LevelGrid, log_z: FloatArray,
               tau_post: FloatArray) -> float:
    """P(no change anywhere): every point at one level."""
    log_stay_all = float(np.log(stay).sum()) if stay.size else 0.0
    log_prod = np.log(np.maximum(emit, 1e-300)).sum(axis=0)  # (grid, taus)
    log_none = _logsumexp(log_prod + math.log(grid.weight), axis=0) + log_stay_all
    return float(np.sum(tau_post * np.exp(np.minimum(log_none - log_z, 0.0))))


def _moments(dist: FloatArray, grid: LevelGrid, tau_post: FloatArray) -> Moments:
    """Moments of level distributions (..., points, grid, taus), each normalised per tau, mixed over tau:
    means and variances of shape (..., points)."""
    d = dist / np.maximum(dist.sum(axis=-2, keepdims=True), 1e-300)
    mixed = d @ tau_post  # (..., points, grid)
    mean = mixed @ grid.mu
    var = np.maximum(mixed @ grid.mu**2 - mean**2, grid.step**2)
    return Moments(mean, var)


def _gap_moments(alpha: FloatArray, u: FloatArray, grid: LevelGrid,
                 tau_post: FloatArray) -> tuple[Moments, Moments, Moments]:
    """Per gap, the left level given a change in it (alpha at its left point), the right level given
    one (u at its right point: its prior is a step from the left level, which its data dominate, and
    the planning needs no more than moments), and the level both share given none (their product)."""
    m = _moments(np.stack([alpha[:-1], u[1:], alpha[:-1] * u[1:]]), grid, tau_post)
    return Moments(m.mean[0], m.var[0]), Moments(m.mean[1], m.var[1]), Moments(m.mean[2], m.var[2])
