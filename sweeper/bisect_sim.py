"""Simulated regression histories: a known culprit, flaky rates and untestable commits, for
testing and calibrating `sweeper.bisect`. Pure: samples come from a seeded numpy Generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sweeper.bisect import BisectResult, ProbeOutcome, ProbeRequest, Search, Verdict, run


@dataclass(frozen=True)
class History:
    n: int  # candidates are c_0 .. c_n
    culprit: int | None  # index of the first bad commit; None: no regression
    p_good: float
    p_bad: float
    skipped: frozenset[int]

    @property
    def commits(self) -> list[str]:
        return [f"c{i}" for i in range(self.n + 1)]

    def rate(self, i: int) -> float:
        return self.p_bad if self.culprit is not None and i >= self.culprit else self.p_good

    def is_right(self, result: BisectResult) -> bool:
        if self.culprit is None:
            return result.kind is Verdict.NO_CULPRIT
        return result.kind is Verdict.CULPRIT and f"c{self.culprit}" in result.candidates


def random_history(rng: np.random.Generator, *, n_min: int = 10, n_max: int = 3000,
                   skip_fraction: float = 0.05) -> History:
    """N log-uniform in [n_min, n_max], p_bad uniform in [0.05, 1], p_good 0 half the time
    and uniform in [0, 0.02] otherwise; interior commits untestable with `skip_fraction`."""
    n = round(math.exp(rng.uniform(math.log(n_min), math.log(n_max))))
    culprit = int(rng.integers(1, n + 1))
    p_bad = float(rng.uniform(0.05, 1.0))
    p_good = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.0, 0.02))
    interior = np.arange(1, n)
    skipped = frozenset(int(i) for i in interior[rng.random(interior.size) < skip_fraction])
    return History(n, culprit, p_good, p_bad, skipped)


def draw(rng: np.random.Generator, p: float, req: ProbeRequest) -> ProbeOutcome:
    """Run req.samples Bernoulli(p) samples, stopping at the requested failure count."""
    if p <= 0:
        return ProbeOutcome(0, req.samples)
    if req.stop_after_failures is None:
        return ProbeOutcome(int(rng.binomial(req.samples, p)), req.samples)
    # Failure positions of a Bernoulli process are cumulative geometric gaps.
    at = np.cumsum(rng.geometric(p, size=req.stop_after_failures))
    if at[-1] <= req.samples:
        return ProbeOutcome(req.stop_after_failures, int(at[-1]))
    return ProbeOutcome(int(np.sum(at <= req.samples)), req.samples)


def simulate(history: History, rng: np.random.Generator, *, parallel: int = 1,
             **search_kwargs: object) -> BisectResult:
    def probe(req: ProbeRequest) -> ProbeOutcome:
        if req.index in history.skipped:
            return ProbeOutcome.skip("server_failed")
        return draw(rng, history.rate(req.index), req)

    search = Search(history.commits, **search_kwargs)  # type: ignore[arg-type]
    return run(search, probe, parallel=parallel)
