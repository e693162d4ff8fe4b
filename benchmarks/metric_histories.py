"""Simulated metric histories for the metric bisect benchmark, written apart from the search.

Nothing here comes from `sweeper`: the families, the effect sizes and the noise are chosen without
looking at the search's model (a log-scale Student-t around a piecewise-constant level), so a search
tuned to its own assumptions cannot pass by grading itself. Here, instead:

* a start's own draw of the level is a gamma factor (mean 1, the family's between-start coefficient
  of variation: skewed, light-tailed), not a t;
* the start's value is the mean of `requests` per-request values (each a gamma draw around the start's
  level with a per-request CV of 10-25 %, as TPOT over 200 requests), and its standard error is that
  sample's own (sd / sqrt(n)), as a benchmark client would report it;
* 5 % of starts are outliers: the value moved by 15 % up or down (a throttled GPU, a noisy neighbour);
* the level is piecewise constant (steps multiply it), or ramps linearly over a stretch (a drift).

A history has commits c0 .. cN (c0 good, cN bad). `MetricHistory.truth` lists the true changes as
(index of the first commit at the new level, relative effect, "regression" | "improvement") — in a
drift, every commit of the ramp, each a small step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

REGRESSION, IMPROVEMENT = "regression", "improvement"
OUTLIER_RATE = 0.05
OUTLIER_SIZE = 0.15

# (name, higher is better, typical level): the metrics of vLLM's bench the bisect is asked about.
METRICS = (("mean_tpot_ms", False, 25.0), ("output_throughput", True, 1800.0),
           ("spec_decode_acceptance_length", True, 2.6), ("mean_ttft_ms", False, 120.0))


@dataclass(frozen=True)
class MetricHistory:
    family: str
    n: int  # commits c0 .. cn
    metric: str
    higher_is_better: bool
    base: float  # level at c0
    steps: tuple[tuple[int, float], ...] = ()  # (first commit at the new level, factor), increasing
    ramp: tuple[int, int, float] | None = None  # (first commit of the ramp, width, total relative change)
    cv: float = 0.02  # between-start coefficient of variation
    request_cv: float = 0.2
    requests: int = 200
    outlier_rate: float = OUTLIER_RATE
    params: dict[str, object] = field(default_factory=dict)

    @property
    def commits(self) -> list[str]:
        return [f"c{i}" for i in range(self.n + 1)]

    def level(self, i: int) -> float:
        v = self.base
        for j, f in self.steps:
            if i >= j:
                v *= f
        if self.ramp is not None:
            a, w, total = self.ramp
            v *= 1 + total * min(1.0, max(0.0, (i - a + 1) / w))
        return v

    def _start_level(self, rng: np.random.Generator, i: int) -> float:
        shape = 1 / self.cv**2
        level = self.level(i) * rng.gamma(shape, 1 / shape)
        if rng.random() < self.outlier_rate:
            level *= 1 + OUTLIER_SIZE * (1 if rng.random() < 0.5 else -1)
        return level

    def start(self, rng: np.random.Generator, i: int) -> tuple[float, float]:
        """One server start at commit i: (value, its standard error within the start)."""
        level = self._start_level(rng, i)
        k = 1 / self.request_cv**2
        x = rng.gamma(k, level / k, size=self.requests)
        n = self.requests
        total, squares = float(x.sum()), float(np.dot(x, x))
        var = max(0.0, (squares - total * total / n) / (n - 1))
        return total / n, math.sqrt(var / n)

    def value(self, rng: np.random.Generator, i: int) -> float:
        """One server start's value alone, for a procedure that reads no standard error: the same
        distribution as `start`'s (the mean of n gamma draws of shape k is a gamma of shape n k)."""
        level = self._start_level(rng, i)
        nk = self.requests / self.request_cv**2
        return float(rng.gamma(nk, level / nk))

    def _direction(self, factor: float) -> str:
        return IMPROVEMENT if (factor > 1) == self.higher_is_better else REGRESSION

    @property
    def truth(self) -> list[tuple[int, float, str]]:
        out = [(j, f - 1, self._direction(f)) for j, f in self.steps]
        if self.ramp is not None:
            a, w, _ = self.ramp
            for t in range(w):
                before, after = self.level(a + t - 1), self.level(a + t)
                out.append((a + t, after / before - 1, self._direction(after / before)))
        return sorted(out)


# ---- drawing helpers ---------------------------------------------------------------------------


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _base(rng: np.random.Generator, family: str, n: int, **kw: object) -> MetricHistory:
    name, higher, typical = METRICS[int(rng.integers(len(METRICS)))]
    cv = float(kw.pop("cv", rng.uniform(0.01, 0.05)))  # type: ignore[arg-type]
    return MetricHistory(family, n, name, higher, typical * rng.uniform(0.7, 1.3), cv=cv,
                         request_cv=float(rng.uniform(0.1, 0.25)), requests=int(rng.choice([100, 200, 400])),
                         **kw)  # type: ignore[arg-type]


def _n(rng: np.random.Generator, lo: int = 30, hi: int = 300) -> int:
    return round(_loguniform(rng, lo, hi))


def _factor(rng: np.random.Generator, effect: float | None = None) -> float:
    """A step of 2-20 % (log-uniform), up or down."""
    e = _loguniform(rng, 0.02, 0.2) if effect is None else effect
    return 1 + e if rng.random() < 0.5 else 1 / (1 + e)


def _with(h: MetricHistory, **params: object) -> MetricHistory:
    return MetricHistory(h.family, h.n, h.metric, h.higher_is_better, h.base, h.steps, h.ramp, h.cv, h.request_cv,
                         h.requests, h.outlier_rate,
                         {"n": h.n, "cv": h.cv, "requests": h.requests, "request_cv": h.request_cv, **params})


# ---- families ------------------------------------------------------------------------------------


def one_change(rng: np.random.Generator) -> MetricHistory:
    n = _n(rng)
    j = int(rng.integers(1, n + 1))
    f = _factor(rng)
    h = _base(rng, "one change", n, steps=((j, f),))
    return _with(h, j=j, effect=f - 1)


def two_changes(rng: np.random.Generator) -> MetricHistory:
    n = _n(rng)
    a, b = sorted(int(x) for x in rng.choice(np.arange(1, n + 1), size=2, replace=False))
    fa, fb = _factor(rng), _factor(rng)
    h = _base(rng, "two changes", n, steps=((a, fa), (b, fb)))
    return _with(h, a=a, b=b, effects=(fa - 1, fb - 1))


def slow_drift(rng: np.random.Generator) -> MetricHistory:
    """The level moves linearly by 6-20 % over 15-60 commits: no commit makes more than a sliver."""
    n = _n(rng, 60, 300)
    width = int(rng.integers(15, min(60, n // 2) + 1))
    a = int(rng.integers(1, n - width + 2))
    total = float(rng.uniform(0.06, 0.2)) * (1 if rng.random() < 0.5 else -1)
    h = _base(rng, "slow drift", n, ramp=(a, width, total))
    return _with(h, a=a, width=width, total=total)


def no_change(rng: np.random.Generator) -> MetricHistory:
    n = _n(rng)
    return _with(_base(rng, "no change", n))


def five_at_cv2(rng: np.random.Generator) -> MetricHistory:
    n = _n(rng)
    j = int(rng.integers(1, n + 1))
    f = _factor(rng, 0.05)
    return _with(_base(rng, "5 % at CV 2 %", n, steps=((j, f),), cv=0.02), j=j, effect=f - 1)


def three_at_cv3(rng: np.random.Generator) -> MetricHistory:
    n = _n(rng)
    j = int(rng.integers(1, n + 1))
    f = _factor(rng, 0.03)
    return _with(_base(rng, "3 % at CV 3 %", n, steps=((j, f),), cv=0.03), j=j, effect=f - 1)


FAMILIES: dict[str, Callable[[np.random.Generator], MetricHistory]] = {
    "one change": one_change,
    "two changes": two_changes,
    "slow drift": slow_drift,
    "no change": no_change,
    "5 % at CV 2 %": five_at_cv2,
    "3 % at CV 3 %": three_at_cv3,
}
DRIFT = ("slow drift",)
