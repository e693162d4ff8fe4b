"""The change-point posterior of one failure mode against brute-force enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.special import betaln

from sweeper.bisect.segments import Prior, Start, posterior


def _start_lik(k: int, n: int, r: float, rho: float) -> float:
    if r == 0:
        return 1.0 if k == 0 else 0.0
    if rho == 0:
        return r**k * (1 - r) ** (n - k)
    s = (1 - rho) / rho
    return math.exp(betaln(k + r * s, n - k + (1 - r) * s) - betaln(r * s, (1 - r) * s))


def _brute(starts: list[Start], n_positions: int, prior: Prior) -> tuple[np.ndarray, float]:
    """Every segmentation of the points, every zero/positive state, every rate and rho, summed; a
    single cut between equal rates counted as no change."""
    points = sorted({s.index for s in starts})
    pi = prior.change_probability(n_positions)
    w, w_rho = np.exp(prior.log_w), np.exp(prior.log_w_rho)
    gaps = np.diff(points)
    total, gap_mass, no_change = 0.0, np.zeros(len(points) - 1), 0.0
    for cuts in itertools.product([False, True], repeat=len(points) - 1):
        weight = math.prod(1 - (1 - pi) ** g if c else (1 - pi) ** g for c, g in zip(cuts, gaps, strict=True))
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], len(points)]
        segs = list(itertools.pairwise(bounds))
        for ri, rho in enumerate(prior.rhos):
            # Per segment: (marginal if its rate is 0, marginal if positive).
            parts, liks = [], []
            for lo, hi in segs:
                mine = [s for s in starts if points[lo] <= s.index <= points[hi - 1]]
                lik = [math.prod(_start_lik(s.failures, s.samples, r, rho) for s in mine) for r in prior.rates]
                parts.append((w[0] * lik[0], float(np.dot(w[1:], lik[1:]))))
                liks.append(np.array(lik))
            if len(segs) == 2:
                # One cut between (positive) rates whose odds are within `same_within` is no change.
                x = np.log(prior.rates[1:] / (1 - prior.rates[1:]))
                near = np.abs(x[:, None] - x[None, :]) <= math.log(prior.same_within) + 1e-9
                same = weight * w_rho[ri] * float(np.sum(near * np.outer(w[1:] * liks[0][1:], w[1:] * liks[1][1:])))
                gap_mass -= same * np.array(cuts, dtype=float)
                no_change += same
            for states in itertools.product([0, 1], repeat=len(segs)):
                if any(a == 0 and b == 0 for a, b in itertools.pairwise(states)):
                    continue  # two zero-rate neighbours are one segment
                mass = weight * w_rho[ri] * math.prod(p[z] for p, z in zip(parts, states, strict=True))
                total += mass
                gap_mass += mass * np.array(cuts, dtype=float)
                if not any(cuts):
                    no_change += mass
    return gap_mass / total, no_change / total


@pytest.mark.parametrize("starts", [
    [Start(0, 0, 20), Start(3, 2, 20), Start(7, 9, 30), Start(9, 8, 25)],
    [Start(0, 0, 20), Start(0, 0, 20), Start(4, 6, 20), Start(6, 0, 20), Start(9, 0, 15)],  # rise and fix
    [Start(0, 3, 20), Start(2, 4, 20), Start(5, 3, 20), Start(9, 5, 20)],  # no change
])
@pytest.mark.parametrize("zero_mass", [0.0, 0.5])
@pytest.mark.parametrize("same_within", [1.0, 10.0])
def test_posterior_matches_brute_force(starts: list[Start], zero_mass: float, same_within: float) -> None:
    prior = Prior.default(points=10, rhos=(0.0, 0.1, 0.3), zero_mass=zero_mass, same_within=same_within)
    post = posterior(starts, 9, prior)
    # The posterior integrates on the grid refined for these counts (`Prior.refined`): so does this.
    by_commit = sorted({s.index for s in starts})
    refined = prior.refined([sum(s.failures for s in starts if s.index == i) for i in by_commit],
                            [sum(s.samples for s in starts if s.index == i) for i in by_commit])
    assert refined.rates.size > prior.rates.size  # 10 grid points are coarser than these counts
    gaps, none = _brute(starts, 9, refined)
    assert np.allclose(post.gap_change, gaps, atol=1e-9)
    assert post.no_change == pytest.approx(none, abs=1e-9)


def test_a_clear_step_is_located_and_neighbours_of_equal_rate_are_not_changes() -> None:
    starts = [Start(0, 0, 100), Start(0, 0, 100), Start(4, 0, 100), Start(5, 30, 100), Start(9, 31, 100),
              Start(9, 29, 100)]
    post = posterior(starts, 9, Prior.default())
    assert post.points == (0, 4, 5, 9)
    assert post.gap_change[1] > 0.99
    # 0/100 at commit 4 still allows a tiny positive rate there; 30% and 30% are one rate.
    assert post.gap_change[0] < 0.2 and post.gap_change[2] < 0.05
    before, after = post.segment_at(4), post.segment_at(5)
    assert before.failures == 0 and after.failures == 90 and after.samples == 300
    assert after.low < 0.3 < after.high


def test_dispersion_is_learned_from_starts_that_disagree() -> None:
    alike = [Start(i, 15, 50) for i in (0, 0, 0, 9, 9, 9)]
    apart = [Start(i, k, 50) for i, k in ((0, 0), (0, 30), (0, 14), (9, 1), (9, 29), (9, 16))]
    prior = Prior.default()
    assert posterior(alike, 9, prior).rho < 0.05
    assert posterior(apart, 9, prior).rho > 0.15
