"""How many samples one server start of the failure search gets. Pure.

Each probe asks for the Wald sample count that tells the rates on either side of its gap apart at
the confidence, planning for at least a `min_contrast` change, inflated for the learned per-start
variation up to the count past which another server start is the cheaper way to buy information.
"""

from __future__ import annotations

import math

from sweeper.bisect.options import SearchOptions
from sweeper.judge.stats import samples_to_decide


def batch(options: SearchOptions, p_lo: float, p_hi: float, rho: float) -> int:
    """Samples for one start: the Wald count that tells the two rates apart (planning for at
    least `min_contrast`, the smallest change the search is after), as far as samples are
    the cheaper way to buy it."""
    o = options
    lo, hi = sorted((p_lo, p_hi))
    hi = max(hi, o.min_contrast * lo, lo + o.min_rate / 4)
    need = wald(o, lo, hi)
    # Design effect: a start of n samples is worth n / (1 + (n - 1) rho) independent ones.
    if rho > 0:
        # GPU-seconds per independent sample, (start_s + n request_s) (1 + (n - 1) rho) / n,
        # are least at n = sqrt(start_s (1 - rho) / (request_s rho)): past it, another start
        # buys more than more samples on this one.
        # A request stated free (`cost: {request_s: 0}`) makes samples the cheaper way, as far as
        # one start's draw of the rate allows.
        cheapest = math.sqrt(o.start_s * (1 - rho) / (o.request_s * rho)) if o.request_s > 0 else math.inf
        one_start = need * (1 - rho) / (1 - need * rho) if need * rho < 0.5 else math.inf
        best = min(one_start, cheapest)
        need = math.ceil(best) if math.isfinite(best) else o.max_batch
    return int(min(o.max_batch, max(o.min_batch, need)))


def wald(options: SearchOptions, lo: float, hi: float) -> int:
    """Wald's expected samples to tell rate `lo` from `hi` (> lo) at the confidence; rates at
    or next to 1 are told apart by a handful."""
    hi = min(hi, 1 - 1e-6)
    if hi <= lo:
        return options.min_batch
    return samples_to_decide(lo, hi, options.confidence)


def bump_batch(options: SearchOptions, r: float, rho: float) -> int:
    """Samples to see a bump of three times the rate `r` around it (and `min_rate` over a clean one)."""
    return batch(options, r, 3 * r + options.min_rate, rho)
