"""stats: intervals, sequential tests and the step posterior against brute force."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from sweeper.stats import (
    Decision,
    RatePrior,
    kl_bernoulli,
    samples_to_decide,
    sprt,
    step_posterior,
    wilson,
    z_for,
)


def test_wilson() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert wilson(0, 100)[0] == 0.0 and wilson(0, 100)[1] == pytest.approx(0.037, abs=1e-3)
    assert wilson(100, 100)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_z_and_sample_sizes() -> None:
    assert z_for(0.95) == pytest.approx(1.95996, abs=1e-4)
    # Clean baseline: log(1 - conf) / log(1 - p_bad) clean samples call a commit good.
    assert samples_to_decide(0.0, 0.05, 0.99) == math.ceil(math.log(99) / -math.log(0.95))
    assert samples_to_decide(0.0, 1.0, 0.99) == 1
    assert samples_to_decide(0.02, 0.05, 0.99) > 200  # close rates need many samples
    assert kl_bernoulli(0.3, 0.3) == 0.0
    with pytest.raises(ValueError):
        samples_to_decide(0.1, 0.1, 0.99)


def test_sprt() -> None:
    assert sprt(1, 1, 0.0, 0.3) is Decision.BAD  # one failure on a clean baseline
    assert sprt(0, 5, 0.0, 0.3) is Decision.CONTINUE
    assert sprt(0, 20, 0.0, 0.3) is Decision.GOOD
    assert sprt(3, 100, 0.02, 0.2) is Decision.GOOD
    assert sprt(20, 100, 0.02, 0.2) is Decision.BAD


def _brute_force(k: list[int], n: list[int], log_prior: np.ndarray, prior: RatePrior) -> np.ndarray:
    rates, m = prior.rates, len(k)
    w_g, w_b = np.exp(prior.log_w_good), np.exp(prior.log_w_bad)
    lik = np.zeros(m)
    for j in range(1, m + 1):
        for gi, g in enumerate(rates):
            for bi, b in enumerate(rates):
                if bi >= prior.n_good_below.size or gi >= prior.n_good_below[bi]:
                    continue
                p = np.array([g if i < j else b for i in range(m)])
                with np.errstate(divide="ignore", invalid="ignore"):
                    ll = np.sum(np.where(np.array(k) > 0, np.array(k) * np.log(p), 0.0)
                                + np.where(np.array(n) - np.array(k) > 0,
                                           (np.array(n) - np.array(k)) * np.log1p(-p), 0.0))
                lik[j - 1] += w_g[gi] * w_b[bi] * np.exp(ll)
    post = lik * np.exp(log_prior)
    return post / post.sum()


def test_step_posterior_matches_brute_force() -> None:
    prior = RatePrior.default(points=12)
    k, n = [0, 1, 0, 3, 4], [10, 20, 5, 10, 8]
    log_prior = np.log(np.array([0.2, 0.2, 0.2, 0.3, 0.1]))
    post = step_posterior(k, n, log_prior, prior)
    assert np.allclose(post.post, _brute_force(k, n, log_prior, prior), atol=1e-9)
    assert post.p_good < 0.1 < post.p_bad


def test_step_posterior_scales_to_3000_commits() -> None:
    rng = np.random.default_rng(0)
    m = 3001
    n = rng.integers(0, 50, m)
    k = rng.binomial(n, np.where(np.arange(m) >= 1700, 0.3, 0.0))
    prior = RatePrior.default()
    log_prior = np.full(m, -math.log(m))
    start = time.perf_counter()
    for _ in range(20):
        post = step_posterior(k, n, log_prior, prior)
    assert (time.perf_counter() - start) / 20 < 0.05
    assert abs(int(np.argmax(post.post)) + 1 - 1700) <= 50
    assert np.isclose(post.post.sum(), 1.0)
