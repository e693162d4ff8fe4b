"""stats: Wilson intervals and Wald's sample counts."""

from __future__ import annotations

import math

import pytest

from sweeper.judge.stats import kl_bernoulli, samples_to_decide, wilson, z_for


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
