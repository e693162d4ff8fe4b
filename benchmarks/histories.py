"""Simulated commit histories for calibrating a bisect, written apart from the search.

Nothing here comes from `sweeper`: the families, rate ranges and noise model are chosen
without looking at the search's prior, so a search tuned to its own assumptions cannot pass
by grading itself.

A history has commits c0 .. cN (c0 the good endpoint, cN the bad one) and one or more
failure modes. Each mode's true failure rate is piecewise constant over the commits; a
change point is the index j of the first commit with the new rate. Some interior commits
are untestable (the server does not start). One probe is one server start of n samples at
one commit: each mode's rate for that start is drawn from a Beta distribution with the
true rate as mean and intra-class correlation `icc` (0: every start alike), then the n
samples are split multinomially over the modes and "pass" (a sample fails in at most one
mode).

Every family is a function of a numpy Generator and returns a `History`; `FAMILIES` maps
family names to them. `History.truth` lists the true changes as (mode, index, direction).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

REGRESSION, FIX = "regression", "fix"

# Mode names look like the ones the real driver derives from check sets; only their
# distinctness matters.
_MODE_NAMES = ("fsm_log", "ws_tail", "think_budget", "tool_json", "eos_early", "garbled", "stop_seq")


@dataclass(frozen=True)
class Change:
    mode: str
    index: int
    direction: str  # REGRESSION or FIX


@dataclass(frozen=True)
class History:
    family: str
    n: int  # commits c0 .. cn
    # mode -> ((first index, rate), ...), first index 0 first, increasing, no repeated rate
    segments: dict[str, tuple[tuple[int, float], ...]]
    untestable: frozenset[int] = frozenset()
    icc: float = 0.0
    params: dict[str, object] = field(default_factory=dict)  # what the family drew, for reports

    @property
    def commits(self) -> list[str]:
        return [f"c{i}" for i in range(self.n + 1)]

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.segments)

    def rate(self, mode: str, i: int) -> float:
        current = 0.0
        for start, r in self.segments[mode]:
            if start > i:
                break
            current = r
        return current

    def rates(self, i: int) -> np.ndarray:
        return np.array([self.rate(m, i) for m in self.modes])

    @property
    def truth(self) -> list[Change]:
        out = []
        for mode, segs in self.segments.items():
            for (_, before), (j, after) in pairwise(segs):
                out.append(Change(mode, j, REGRESSION if after > before else FIX))
        return out

    def _start_rates(self, rng: np.random.Generator, i: int) -> np.ndarray:
        """The per-mode rates of one server start at commit i."""
        p = self.rates(i)
        if self.icc > 0:
            # Beta with mean p and ICC icc: alpha + beta = 1/icc - 1.
            s = 1.0 / self.icc - 1.0
            inner = (p > 0) & (p < 1)
            p = p.copy()
            p[inner] = rng.beta(p[inner] * s, (1 - p[inner]) * s)
        total = p.sum()
        return p / total if total > 1 else p

    def probe(self, rng: np.random.Generator, i: int, n: int) -> dict[str, int]:
        """One server start of n samples at commit i: failures per mode (zeros included)."""
        if i in self.untestable:
            raise ValueError(f"c{i} is untestable")
        p = self._start_rates(rng, i)
        counts = rng.multinomial(n, [*p, max(0.0, 1.0 - p.sum())])
        return {m: int(c) for m, c in zip(self.modes, counts[:-1], strict=True)}

    def probe_any(self, rng: np.random.Generator, i: int, n: int,
                  stop_after: int | None = None) -> tuple[int, int]:
        """One server start at commit i counting a failure of any mode; stops once
        `stop_after` failures were seen. Returns (failures, samples run)."""
        if i in self.untestable:
            raise ValueError(f"c{i} is untestable")
        p = float(min(1.0, self._start_rates(rng, i).sum()))
        if p <= 0:
            return 0, n
        if stop_after is None:
            return int(rng.binomial(n, p)), n
        at = np.cumsum(rng.geometric(p, size=stop_after))
        if at[-1] <= n:
            return stop_after, int(at[-1])
        return int(np.sum(at <= n)), n


# ---- drawing helpers ---------------------------------------------------------------------


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _draw_n(rng: np.random.Generator, lo: int = 30, hi: int = 1000) -> int:
    return round(_loguniform(rng, lo, hi))


def _modes(rng: np.random.Generator, k: int) -> list[str]:
    return [str(m) for m in rng.choice(_MODE_NAMES, size=k, replace=False)]


def _background_untestable(rng: np.random.Generator, n: int) -> set[int]:
    """Half the histories build everywhere; the rest lose up to 5 % of interior commits."""
    if rng.random() < 0.5:
        return set()
    frac = rng.uniform(0.0, 0.05)
    interior = np.arange(1, n)
    return {int(i) for i in interior[rng.random(interior.size) < frac]}


def _baseline(rng: np.random.Generator) -> float:
    """0 for 40 % of modes (clean before the change), else 0.5 % .. 10 % log-uniform."""
    return 0.0 if rng.random() < 0.4 else _loguniform(rng, 0.005, 0.1)


def _after(rng: np.random.Generator, base: float, min_ratio: float = 1.5, cap: float = 0.9) -> float:
    """A regressed rate: from a clean baseline 1 % .. 50 %; else base times 1.5 .. 20."""
    if base == 0:
        return _loguniform(rng, 0.01, 0.5)
    return min(cap, base * _loguniform(rng, min_ratio, 20.0))


def _positions(rng: np.random.Generator, n: int, k: int) -> list[int]:
    """k distinct change indices in 1..n, sorted."""
    return sorted(int(x) for x in rng.choice(np.arange(1, n + 1), size=k, replace=False))


def _ratio(before: float, after: float) -> float:
    lo, hi = sorted((before, after))
    return math.inf if lo == 0 else hi / lo


# ---- families ----------------------------------------------------------------------------


def single_step(rng: np.random.Generator) -> History:
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    (j,) = _positions(rng, n, 1)
    p0 = _baseline(rng)
    p1 = _after(rng, p0)
    return History("single step", n, {mode: ((0, p0), (j, p1))}, frozenset(_background_untestable(rng, n)),
                   params={"n": n, "j": j, "p0": p0, "p1": p1, "ratio": _ratio(p0, p1)})


def two_steps(rng: np.random.Generator) -> History:
    """Like 0 -> 0.1 at a, then 0.1 -> 0.4 at b: one mode, two regressions."""
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    a, b = _positions(rng, n, 2)
    p0 = _baseline(rng)
    p1 = _after(rng, p0, cap=0.45)
    p2 = min(0.95, p1 * _loguniform(rng, 1.5, 8.0))
    return History("two steps", n, {mode: ((0, p0), (a, p1), (b, p2))},
                   frozenset(_background_untestable(rng, n)),
                   params={"n": n, "a": a, "b": b, "p0": p0, "p1": p1, "p2": p2,
                           "ratio": min(_ratio(p0, p1), _ratio(p1, p2))})


def _rise_and_fix(rng: np.random.Generator, partial: bool) -> History:
    n = _draw_n(rng)
    mode_a, mode_b = _modes(rng, 2)
    a = int(rng.integers(1, n))  # 1 .. n-1, leaving room for the fix
    b = int(rng.integers(a + 1, n + 1))
    c = int(rng.integers(a + 1, n + 1))  # mode B rises after A did; may share the fix commit
    a0 = _baseline(rng)
    a1 = _after(rng, a0, cap=0.45)  # with B's cap, a start's rates sum to at most 0.9
    # A partial fix keeps 20-60 % of the rise.
    a2 = a0 + rng.uniform(0.2, 0.6) * (a1 - a0) if partial else a0
    b0 = 0.0 if rng.random() < 0.7 else _loguniform(rng, 0.005, 0.05)
    b1 = _after(rng, b0, cap=0.45)
    family = "rise and partial fix" if partial else "rise and fix"
    return History(family, n, {mode_a: ((0, a0), (a, a1), (b, a2)), mode_b: ((0, b0), (c, b1))},
                   frozenset(_background_untestable(rng, n)),
                   params={"n": n, "a": a, "b": b, "c": c, "A": (a0, a1, a2), "B": (b0, b1),
                           "ratio": min(_ratio(a0, a1), _ratio(a1, a2), _ratio(b0, b1))})


def rise_and_fix(rng: np.random.Generator) -> History:
    """Mode A rises at a and returns to its baseline at b > a; mode B rises at c > a, so
    `bad` fails although A's regression is already fixed."""
    return _rise_and_fix(rng, partial=False)


def rise_partial_fix(rng: np.random.Generator) -> History:
    """As `rise_and_fix`, but A's fix only brings it part of the way back."""
    return _rise_and_fix(rng, partial=True)


def per_start_variation(rng: np.random.Generator) -> History:
    """A single step where every server start draws its own rate (ICC up to 0.3)."""
    h = single_step(rng)
    icc = rng.uniform(0.02, 0.3)
    return History("per-start variation", h.n, h.segments, h.untestable, icc=icc, params={**h.params, "icc": icc})


def untestable_next_to_change(rng: np.random.Generator) -> History:
    """A single step with a run of 1-10 untestable commits ending right before the change,
    starting at it, or straddling it."""
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    j = int(rng.integers(2, n))  # interior, so a run can sit on either side
    length = int(rng.integers(1, 11))
    where = str(rng.choice(["before", "from", "straddle"]))
    first = {"before": j - length, "from": j, "straddle": j - length // 2}[where]
    run = {i for i in range(first, first + length) if 1 <= i <= n - 1}
    p0 = _baseline(rng)
    p1 = _after(rng, p0)
    return History("untestable next to change", n, {mode: ((0, p0), (j, p1))},
                   frozenset(run | _background_untestable(rng, n)),
                   params={"n": n, "j": j, "p0": p0, "p1": p1, "run": (min(run), max(run)) if run else None,
                           "where": where, "ratio": _ratio(p0, p1)})


def change_at_end(rng: np.random.Generator) -> History:
    """A single step at c1 (only the good endpoint is clean) or at cN (only bad fails)."""
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    j = 1 if rng.random() < 0.5 else n
    p0 = _baseline(rng)
    p1 = _after(rng, p0)
    return History("change at an end", n, {mode: ((0, p0), (j, p1))}, frozenset(_background_untestable(rng, n)),
                   params={"n": n, "j": j, "p0": p0, "p1": p1, "ratio": _ratio(p0, p1)})


def no_change(rng: np.random.Generator) -> History:
    """`bad` fails, but at the rate `good` already had."""
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    p = _loguniform(rng, 0.01, 0.5)
    return History("no change", n, {mode: ((0, p),)}, frozenset(_background_untestable(rng, n)),
                   params={"n": n, "p": p})


def two_modes(rng: np.random.Generator) -> History:
    """Two modes, each with its own regression at its own commit."""
    n = _draw_n(rng)
    mode_a, mode_b = _modes(rng, 2)
    a, b = (int(x) for x in rng.choice(np.arange(1, n + 1), size=2, replace=False))
    a0, b0 = _baseline(rng), _baseline(rng)
    a1, b1 = _after(rng, a0, cap=0.45), _after(rng, b0, cap=0.45)
    return History("two modes", n, {mode_a: ((0, a0), (a, a1)), mode_b: ((0, b0), (b, b1))},
                   frozenset(_background_untestable(rng, n)),
                   params={"n": n, "a": a, "b": b, "A": (a0, a1), "B": (b0, b1),
                           "ratio": min(_ratio(a0, a1), _ratio(b0, b1))})


def fixed_step(n: int, j: int, p0: float, p1: float, mode: str = "fsm_log") -> History:
    """One given step, no untestable commits: for cost lines such as 0.01 -> 0.1 over 200."""
    return History("fixed step", n, {mode: ((0, p0), (j, p1))}, params={"n": n, "j": j, "p0": p0, "p1": p1})


# ---- the families of a bisect that finds what is there (small, short, several, drifting) --------


def small_step(rng: np.random.Generator) -> History:
    """One step of 1.3-2x on a 2-10 % baseline (up or down)."""
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    (j,) = _positions(rng, n, 1)
    base = _loguniform(rng, 0.02, 0.1)
    ratio = float(rng.uniform(1.3, 2.0))
    p0, p1 = (base, base * ratio) if rng.random() < 0.8 else (base * ratio, base)
    return History("small step", n, {mode: ((0, p0), (j, p1))}, frozenset(_background_untestable(rng, n)),
                   params={"n": n, "j": j, "p0": p0, "p1": p1, "ratio": ratio})


def three_changes(rng: np.random.Generator) -> History:
    """One mode with three change points, each a 2-8x step up or down from the rate before, every
    rate in 0.5-60 %: a step that would leave that range goes the other way. (Clamping it instead,
    as this family first did, made steps of 1-2x, some from a rate to the same rate: no change at all.)"""
    n = max(40, _draw_n(rng))
    (mode,) = _modes(rng, 1)
    pos = _positions(rng, n, 3)
    rates = [_loguniform(rng, 0.01, 0.08)]
    for _ in pos:
        r = rates[-1]
        f = _loguniform(rng, 2.0, 8.0)
        up = bool(rng.random() < 0.5)
        if (up and r * f > 0.6) or (not up and r / f < 0.005):
            up = not up
        rates.append(r * f if up else r / f)
    return History("three changes", n, {mode: tuple(zip([0, *pos], rates, strict=True))},
                   frozenset(_background_untestable(rng, n)),
                   params={"n": n, "at": tuple(pos), "rates": tuple(rates),
                           "ratio": min(_ratio(a, b) for a, b in pairwise(rates))})


def _bump(rng: np.random.Generator, width: int, family: str) -> History:
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    a = int(rng.integers(1, n - width + 1))  # the fix a + width is at most n
    p0 = _baseline(rng)
    p1 = _after(rng, p0, min_ratio=3.0, cap=0.6)
    return History(family, n, {mode: ((0, p0), (a, p1), (a + width, p0))}, frozenset(_background_untestable(rng, n) - set(range(a, a + width))),
                   params={"n": n, "a": a, "width": width, "p0": p0, "p1": p1, "ratio": _ratio(p0, p1)})


def short_bump(rng: np.random.Generator) -> History:
    """A regression fixed 1-5 commits later: the bad endpoint looks like the good one."""
    return _bump(rng, int(rng.integers(1, 6)), "short bump")


def blip(rng: np.random.Generator) -> History:
    """A regression at one commit only, fixed by the next."""
    return _bump(rng, 1, "one-commit blip")


def linear_drift(rng: np.random.Generator) -> History:
    """The rate climbs linearly over 10-30 commits from 0.5-5 % to 3-10x that: one small step at
    every commit of the ramp, none of them a change a bisect can name on its own."""
    n = max(60, _draw_n(rng))
    (mode,) = _modes(rng, 1)
    width = int(rng.integers(10, 31))
    a = int(rng.integers(1, n - width + 1))
    p0 = _loguniform(rng, 0.005, 0.05)
    p1 = min(0.5, p0 * _loguniform(rng, 3.0, 10.0))
    ramp = [(a + t, p0 + (p1 - p0) * (t + 1) / width) for t in range(width)]
    return History("linear drift", n, {mode: ((0, p0), *ramp)}, frozenset(_background_untestable(rng, n)),
                   params={"n": n, "a": a, "width": width, "p0": p0, "p1": p1})


def zero_then_low(rng: np.random.Generator) -> History:
    """A mode that never fails before j and fails at 1-7 % from j on: probes of a few dozen
    samples after j are often clean."""
    n = _draw_n(rng)
    (mode,) = _modes(rng, 1)
    (j,) = _positions(rng, n, 1)
    p1 = float(rng.uniform(0.01, 0.07))
    return History("zero then 1-7 %", n, {mode: ((0, 0.0), (j, p1))}, frozenset(_background_untestable(rng, n)),
                   params={"n": n, "j": j, "p0": 0.0, "p1": p1, "ratio": math.inf})


def high_icc(rng: np.random.Generator) -> History:
    """A single step whose starts vary a lot (ICC 0.2-0.4)."""
    h = single_step(rng)
    icc = float(rng.uniform(0.2, 0.4))
    return History("ICC 0.2-0.4", h.n, h.segments, h.untestable, icc=icc, params={**h.params, "icc": icc})


FAMILIES: dict[str, Callable[[np.random.Generator], History]] = {
    "single step": single_step,
    "two steps": two_steps,
    "rise and fix": rise_and_fix,
    "rise and partial fix": rise_partial_fix,
    "per-start variation": per_start_variation,
    "untestable next to change": untestable_next_to_change,
    "change at an end": change_at_end,
    "no change": no_change,
    "two modes": two_modes,
    "small step": small_step,
    "three changes": three_changes,
    "short bump": short_bump,
    "one-commit blip": blip,
    "linear drift": linear_drift,
    "zero then 1-7 %": zero_then_low,
    "ICC 0.2-0.4": high_icc,
}
# Histories whose truth is a ramp of many tiny steps: scored by the drift flag, not by coverage.
DRIFT = ("linear drift",)

# Families with one failure mode: the old single-mode search can be scored on them as is.
SINGLE_MODE = ("single step", "two steps", "per-start variation", "untestable next to change",
               "change at an end", "no change")
