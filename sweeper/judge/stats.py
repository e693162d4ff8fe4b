"""Statistics for failure rates: Wilson intervals and Wald's sample counts. Pure: the standard
library only. The bisect's change-point posterior lives in `sweeper.bisect.segments`.
"""

from __future__ import annotations

import math
from statistics import NormalDist


def z_for(confidence: float) -> float:
    """Two-sided normal quantile: z_for(0.95) == 1.96, the `z` that `wilson` takes for an interval at
    another confidence (`wilson(k, n, z_for(0.99))`)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k failures in n samples; (0, 1) when n == 0. Real-valued counts
    are allowed: effective sample sizes of correlated samples."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(max(0.0, p * (1 - p) / n + z2 / (4 * n * n))) / (1 + z2 / n)
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
