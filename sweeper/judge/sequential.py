"""When a cell's verdict is settled: Wald's sequential probability ratio test on its failures, and a
time-uniform confidence sequence for its rate. Pure: the standard library only.

A cell's samples on one server start are judged as they come, in rounds. The test weighs
"the rate is at most `threshold`" (H0) against "the rate is at least `detect`" (H1):

- `failing`: H1 accepted, the rate is credibly above `threshold` (a cell whose rate is at most
  `threshold` is called failing with probability at most 1 - confidence);
- `clean`: H0 accepted, the rate is credibly below `detect` (a cell failing at `detect` or more is
  called clean with probability at most 1 - confidence);
- `width`: (when asked) the confidence sequence of the rate is at most `width` wide;
- otherwise the cell goes on, and a suite that runs out first is `exhausted`: its verdict is
  what the whole replay shows, as without `--adaptive`.

Both bounds hold under optional stopping by construction: Wald's test is a sequential test, its
likelihood ratio a martingale under each hypothesis (Ville's inequality), looked at after every
round however many rounds there are; it is not a fixed-sample test peeked at. Rates between
`threshold` and `detect` are the test's indifference zone: either verdict may come, and none is an
error. The confidence sequence is Robbins' beta-binomial mixture (its set {p : M_n(p) < 1/alpha} holds
the true rate at every n at once with probability 1 - alpha); the width stop spends its own alpha,
so with both on the total error is at most twice 1 - confidence.

Samples that vary between server starts: the test speaks of the rate of this start (what the
samples are drawn from, independent given the start), which is what a full replay of the same start
would estimate too; across starts a cell's rate is another question (the explanation and the bisect
model start-to-start variation). A suite mixes cases of different rates: replaying them interleaved
(`interleave`) makes every prefix a stratified sample of the suite, under which the ratio is still a
supermartingale under each hypothesis (the factor per sample is linear in its rate, so over a round
of cases whose mean rate is at most p0 the product is at most one, by the arithmetic-geometric mean).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar


class Stop(StrEnum):
    """Why a cell stopped sending requests."""

    CLEAN = "clean"
    FAILING = "failing"
    WIDTH = "width"
    EXHAUSTED = "exhausted"  # the whole suite was sent without a verdict settling
    SERVER = "server"  # the server stopped answering (crash, hang, deadline): its status says which


@dataclass(frozen=True)
class Rule:
    """The stopping rule. `threshold` < `detect`, both rates in (0, 1)."""

    threshold: float = 0.01
    detect: float = 0.10
    confidence: float = 0.95
    width: float | None = None
    round: int = 8  # samples per cell per round

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < self.detect < 1.0:
            raise ValueError(f"need 0 < threshold < detect < 1, got {self.threshold}, {self.detect}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.width is not None and not 0.0 < self.width <= 1.0:
            raise ValueError(f"width must be in (0, 1], got {self.width}")
        if self.round < 1:
            raise ValueError(f"round must be at least 1, got {self.round}")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    def bounds(self) -> tuple[float, float]:
        """Wald's boundaries on the log likelihood ratio: (accept H0 at or below, accept H1 at or above)."""
        a = b = self.alpha
        return math.log(b / (1.0 - a)), math.log((1.0 - b) / a)

    def llr(self, failed: int, n: int) -> float:
        """log P(data | detect) / P(data | threshold) for `failed` failures in `n` samples."""
        p0, p1 = self.threshold, self.detect
        return failed * math.log(p1 / p0) + (n - failed) * math.log((1.0 - p1) / (1.0 - p0))

    def decide(self, failed: int, n: int) -> Stop | None:
        """The verdict after `n` samples with `failed` failures, or None: go on."""
        if n <= 0:
            return None
        low, high = self.bounds()
        ratio = self.llr(failed, n)
        if ratio >= high:
            return Stop.FAILING
        if ratio <= low:
            return Stop.CLEAN
        if self.width is not None:
            lo, hi = confidence_sequence(failed, n, self.alpha)
            if hi - lo <= self.width:
                return Stop.WIDTH
        return None

    def clean_after(self) -> int:
        """Samples without a failure that settle a cell clean: the fewest an adaptive cell sends."""
        low, _ = self.bounds()
        per = math.log((1.0 - self.detect) / (1.0 - self.threshold))
        return max(1, math.ceil(low / per - 1e-9))

    def expected_samples(self, full: int) -> int:
        """What the planner budgets for an adaptive cell of a `full`-sample suite: whole rounds up to
        the clean verdict (the common case, and the slowest of the quick ones), at most `full`."""
        rounds = math.ceil(self.clean_after() / self.round)
        return min(full, rounds * self.round)


def confidence_sequence(failed: int, n: int, alpha: float, a: float = 0.5, b: float = 0.5) -> tuple[float, float]:
    """A (1 - alpha) confidence sequence for a Bernoulli rate after `failed` of `n`: Robbins' mixture
    of likelihood ratios under a Beta(a, b) prior; valid at every n simultaneously."""
    if n < 0 or not 0 <= failed <= n:
        raise ValueError(f"need 0 <= failed <= n, got {failed}, {n}")
    if n == 0:
        return (0.0, 1.0)
    log_mix = _log_beta(a + failed, b + n - failed) - _log_beta(a, b)
    limit = math.log(1.0 / alpha)

    def excluded(p: float) -> bool:
        # log M_n(p) = log mixture - log likelihood at p; p is out when M_n(p) >= 1/alpha.
        like = (failed * math.log(p) if failed else 0.0) + ((n - failed) * math.log1p(-p) if n - failed else 0.0)
        return log_mix - like >= limit

    centre = failed / n
    # log M_n is convex in p with its minimum at the MLE: each side is one bisection.
    lo = 0.0 if failed == 0 or not excluded(1e-15) else _edge(excluded, 1e-15, max(centre, 1e-15))
    hi = 1.0 if failed == n or not excluded(1 - 1e-15) else _edge(excluded, 1 - 1e-15, min(centre, 1 - 1e-15))
    return (lo, hi)


def _edge(excluded: Callable[[float], bool], out: float, inside: float) -> float:
    """The boundary between `out` (excluded) and `inside` (not), by bisection."""
    for _ in range(60):
        mid = (out + inside) / 2.0
        if excluded(mid):
            out = mid
        else:
            inside = mid
    return inside


def _log_beta(x: float, y: float) -> float:
    return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)


@dataclass(frozen=True)
class Verdict:
    """A cell's settled verdict: why it stopped and after how many samples."""

    stop: Stop
    samples: int
    failed: int


def run(rule: Rule, outcomes: Sequence[bool], full: int | None = None) -> Verdict:
    """Apply `rule` round by round to `outcomes` (True = failed), in order; what an adaptive replay
    of these samples would decide, and how many it would send (`full`: the suite's size, default
    all of `outcomes`)."""
    total = len(outcomes) if full is None else min(full, len(outcomes))
    n = failed = 0
    while n < total:
        step = outcomes[n:min(total, n + rule.round)]
        failed += sum(step)
        n += len(step)
        stop = rule.decide(failed, n)
        if stop is not None:
            return Verdict(stop, n, failed)
    return Verdict(Stop.EXHAUSTED, n, failed)


T = TypeVar("T", bound=Hashable)


def interleave(items: Sequence[tuple[T, int]], seed: int = 0) -> list[tuple[T, int]]:
    """(case, repeat) pairs in an order whose every prefix samples each case in proportion to its
    repeats: each case's repeats spread evenly over the replay (stride scheduling), each case at a
    seeded offset so that no case is always first. Stable for the same input and seed."""
    counts: dict[T, int] = {}
    for key, _ in items:
        counts[key] = counts.get(key, 0) + 1
    rng = random.Random(seed)
    offset = {key: rng.random() for key in counts}
    seen: dict[T, int] = {}
    keyed = []
    for i, (key, r) in enumerate(items):
        k = seen.get(key, 0)
        seen[key] = k + 1
        keyed.append(((k + offset[key]) / counts[key], i, (key, r)))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [item for _, _, item in keyed]
