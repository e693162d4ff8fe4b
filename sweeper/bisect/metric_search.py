"""The search for every change of a continuous metric (TPOT, throughput, acceptance length) in a
commit range, with calibrated confidence. Pure: no I/O, numpy and scipy only.

Candidates are first-parent commits c_0 (the good endpoint) ... c_N (the bad endpoint), oldest first.
One probe is one server start at one commit: it reports one value of the metric (e.g. the mean TPOT
of that start at one load point) and the value's standard error within the start. The caller drives
the search with an ask/tell loop and decides how starts run:

    search = MetricSearch(commits, MetricSearchOptions(min_effect=0.03, higher_is_better=False))
    for commit, value, se in stored_starts:          # evidence reuse: a sweep's starts at the ends
        search.tell(commit, value, se)
    while not search.done:
        for req in search.ask(k):                    # one round: at most k server starts in all
            for _ in range(req.starts):
                ...start a server at req.commit, run the load point, read the metric...
                search.tell(req.commit, value, se)   # or search.tell_skip(req.commit, "install failed")
    report = search.result()                         # report.describe(): one line per finding

A resumed search is built from what was told before: `MetricSearch(commits, options,
observations=old.observations, rounds=old.rounds)`; observations of commits outside `commits` are
ignored. `ask` may be called while starts are still out: commits with starts in flight are not asked
for again until told. A driver that chooses the load of a start asks `load_per_start(request_s,
request_cv)`: the requests per start that buy the most information per GPU-second given the spread
between starts learned so far. Values are positive numbers in the metric's unit (TPOT in ms, tokens/s,
an acceptance length); `options.higher_is_better` says which way is a regression.

The model (`sweeper.bisect.metric_model`): on a log scale (effects are relative), the metric is
piecewise constant in the commit index with a few unknown change points; a start varies around its
commit's level by a Student-t (heavy tails: an outlier start does not make a change) whose scale combines
the start's own standard error and a between-start spread learned from the data. A change is a step of
at least `resolution` (default half of `min_effect`); the posterior gives, per gap between neighbouring
probed commits, P(a change inside it) and P(a change of min_effect or more inside it), and P(no change
of min_effect or more anywhere).

How a round is chosen: by expected information per modelled GPU-second. For every gap between
neighbouring probed commits the posterior gives three level distributions (the left side given a change
in the gap, the right side given one, the shared level given none) and the gap's P(change). A start at
an untested commit j inside the gap comes from a mixture of those (no change; a change after j; a
change at or before j, weighted by where in the gap j lies; j is the gap's middle testable commit, a
bisection's probe: nearer an end the question is mostly whether there is a change at all, which starts
at the end answer better), a further start at a probed commit from the mixture for the gaps on either
side of it (no change there, or a change). The information of a start is the mutual information between
its value and which component it comes from (bits; the Bhattacharyya pairwise estimate, no quadrature),
its cost `start_s` GPU-seconds (plus `install_s` for a commit never started). The round is filled
greedily with the most informative start per GPU-second, up to k starts: an untested commit chosen
splits its gap for the rest of the round (so k starts spread over a gap as a k-section), and a commit
may get several starts where one would leave its side in doubt (the mean of n starts is n times less
noisy). Before that: the endpoints get `endpoint_starts` each, and a change located between
neighbouring commits gets `side_starts` on each side (one odd start is not a step).

Gaps searched: those more likely than `explore` to hold a change of min_effect or more, outside drifts
(a step near the model's resolution can stay in doubt for any number of starts, and is not what the user
asked about); with none, and neither a located change nor "no change" at the confidence, every probed
commit and gap is a candidate. A gap is done when it is that unlikely to hold one; or it lies between
neighbouring testable commits and its change holds at `settle` (0.9995 for a confidence of 0.99; at every
between-start spread the data leave credible, with `robust_spread`) with `side_starts` on both sides; or
both its commits are at `max_starts_per_commit` ("stuck": then the nearest probed commits of the
segments on either side get starts, up to as many as the two hold, since what is left to learn is each
side's level; after that the search ends undecided). Settling twenty times surer than the confidence is what keeps claims at it honest: a
search that samples two commits until their step crosses 0.99 crosses it by chance now and then where
there is none (optional stopping). The search is done when every gap is, and a change was settled, a
drift flagged, or P(no change of min_effect or more) reached the confidence; or when the limits
(`max_starts`, `max_rounds`, `max_gpu_s`) are reached.

The report (`MetricReport`): every change (a gap more likely changed than not, outside drifts) with its
commit, candidates, confidence (what it reached), the level before and after and the relative size with
its 95 % interval, and whether it is a regression or an improvement (the metric's direction); steps
credibly under min_effect are kept apart (`small_changes`). When no change of min_effect or more was
found: "no change larger than X %" at the smallest X (of 1, 1.5, 2, 3, ... times min_effect) the
posterior bounds at the confidence, and "undecided: about N more starts would decide it" where that is
so. A drift (a run of same-direction steps, or one step the search can do no more on, that a ramp
through the probed commits' values fits better than the staircase, with probed commits on the ramp) is
reported as a drift, and its gaps are not searched.

Cost: one posterior per round (the grid and each commit's log-likelihood on it are kept between rounds);
about 3 ms a round for 20 probed commits.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise

import numpy as np
from scipy.stats import norm

from sweeper.bisect.metric_model import (
    DEFAULT_TAUS,
    MAX_STEP,
    FloatArray,
    LevelGrid,
    MetricPosterior,
    MetricPrior,
    grid_needs,
    make_grid,
    point_loglik,
    posterior_of_points,
)
from sweeper.errors import BisectError

# Drift check (a ramp against a staircase of the probed commits' values; `MetricSearch.drifts`).
DRIFT_MIN_POINTS = 5  # probed commits a window needs
DRIFT_MARGIN_RUN = 2.0  # penalised log-likelihood a ramp needs over a staircase of 2 steps
DRIFT_MARGIN_LONG = 0.0  # ... of 3 or more steps
DRIFT_MARGIN_LONE = 2.0  # ... over a lone step the search can do no more on
DRIFT_INSIDE = 2  # probed commits strictly inside a ramp
DRIFT_STARTS = 2  # starts a probed commit in the window, on average
# A located change stuck short of `settle` with both its commits at their cap: starts at the nearest
# `SEGMENT_NEAR` probed commits of either side, while they hold under `SEGMENT_FACTOR` times the two's.
SEGMENT_NEAR = 3
SEGMENT_FACTOR = 1.0
SPREAD_FLOOR = 0.05  # a gap holding this much of a change counts in a run of small steps
SPREAD_SUM = 0.8  # a run of such gaps holding this much in all is a change of the drift check
# The bounds offered for "no change larger than X": multiples of min_effect.
BOUND_LADDER = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
_INFO_FLOOR = 1e-9  # bits per GPU-second below which a start is not worth asking for


class Kind(StrEnum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"


class Verdict(StrEnum):
    CHANGES = "changes"  # one or more changes of min_effect or more located at the confidence
    NO_CHANGE = "no_change"  # no change of min_effect or more, at the confidence
    DRIFT = "drift"  # the metric drifts; no single commit made it
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class MetricSearchOptions:
    """The search's limits and knobs. Effects are relative: 0.03 is 3 %."""

    min_effect: float = 0.03  # a smaller change is "no change"
    higher_is_better: bool = True  # the metric's direction: a fall is a regression when True
    confidence: float = 0.99
    resolution: float | None = None  # the smallest step the model calls a change (default min_effect / 2)
    start_s: float = 240.0  # modelled GPU-seconds of one server start (with its load phase)
    install_s: float = 0.0  # extra GPU-seconds of a commit's first start (an install, a build)
    endpoint_starts: int = 2
    # Starts on each side of a located change before it is settled: two outliers at one commit that
    # both land near the other side's level happen about once in a few thousand located changes.
    side_starts: int = 3
    max_starts_per_commit: int = 80
    max_starts: int | None = 600  # over the whole search
    max_rounds: int | None = None
    max_gpu_s: float | None = None
    # The confidence at which the search stops working on a located change (default: twenty times
    # surer than `confidence`, 0.9995 for 0.99). Each change is still reported at the confidence it
    # reached. A search that samples a pair of commits until their step crosses the confidence crosses
    # it by chance now and then where there is none (optional stopping); one that goes on further is
    # claimed at 0.99 by chance far less often.
    settle: float | None = None
    explore: float = 0.02  # a gap this likely to hold a change is searched
    expected_changes: float = 1.0  # the prior's changes per range
    drift: bool = True
    robust_spread: bool = True  # claim the lowest confidence any credible between-start spread gives
    nu: float = 3.0  # the t-likelihood's degrees of freedom
    taus: tuple[float, ...] = DEFAULT_TAUS  # between-start spreads the data choose among (log scale)

    def __post_init__(self) -> None:
        if not (0 < self.min_effect < 1):
            raise BisectError(f"min_effect must be a fraction in (0, 1), e.g. 0.03 for 3 %; got {self.min_effect!r}")
        if not (0.5 < self.confidence < 1):
            raise BisectError(f"confidence must be in (0.5, 1), got {self.confidence!r}")
        if self.settle is not None and not (self.confidence <= self.settle < 1):
            raise BisectError(f"settle must be in [confidence, 1), got {self.settle!r}")
        if self.resolution is not None and not (0 < self.resolution <= self.min_effect):
            raise BisectError(f"resolution must be in (0, min_effect], got {self.resolution!r}")
        if self.start_s <= 0 or self.install_s < 0:
            raise BisectError("start_s must be > 0 and install_s >= 0")
        for name in ("endpoint_starts", "side_starts", "max_starts_per_commit"):
            if getattr(self, name) < 1:
                raise BisectError(f"{name} must be >= 1, got {getattr(self, name)!r}")

    @property
    def settled_at(self) -> float:
        return self.settle if self.settle is not None else 1 - (1 - self.confidence) / 20

    def prior(self) -> MetricPrior:
        res = self.resolution if self.resolution is not None else self.min_effect / 2
        return MetricPrior(expected_changes=self.expected_changes, resolution=math.log1p(res),
                           material=math.log1p(self.min_effect), taus=tuple(self.taus), nu=self.nu)


@dataclass(frozen=True)
class MetricObservation:
    """One server start told to the search: its value and within-start SE, or why it could not run."""

    commit: str
    value: float = math.nan
    se: float = 0.0
    skip_reason: str | None = None


@dataclass(frozen=True)
class MetricProbe:
    """Start `starts` servers at `commit`; `value`: the expected information, bits per GPU-second."""

    commit: str
    index: int
    starts: int
    value: float


@dataclass(frozen=True)
class MetricChange:
    """A change between `before_commit` and `commit` (the first commit with the new level)."""

    kind: Kind
    commit: str
    candidates: tuple[str, ...]  # commits that may have made it (one when located)
    before_commit: str
    confidence: float  # P(the change is among the candidates), at the least favourable credible spread
    located: bool  # narrowed as far as testing allows (one commit, or one and untestable ones)
    found: bool  # located, at the confidence, with `side_starts` on each side
    value_before: float  # the levels either side (geometric, the metric's unit)
    value_after: float
    effect: float  # relative size, after / before - 1 (posterior median)
    effect_low: float  # 95 % interval
    effect_high: float
    p_material: float  # P(a change of at least min_effect in this gap)
    starts_before: int  # starts at before_commit and at commit
    starts_after: int

    @property
    def below_min_effect(self) -> bool:
        """Credibly smaller than min_effect: its size reaches min_effect with probability under 5 %."""
        return self.p_material < 0.05 * self.confidence


@dataclass(frozen=True)
class MetricDrift:
    """The metric drifts from about `value_from` at `first` to about `value_to` at `last`."""

    first: str
    last: str
    value_from: float
    value_to: float
    margin: float  # penalised log-likelihood by which a ramp beats the staircase

    @property
    def effect(self) -> float:
        return self.value_to / self.value_from - 1


@dataclass(frozen=True)
class MetricReport:
    verdict: Verdict
    changes: tuple[MetricChange, ...]  # min_effect or more
    small_changes: tuple[MetricChange, ...]  # located steps under min_effect
    drifts: tuple[MetricDrift, ...]
    min_effect: float
    confidence: float
    no_change: float  # P(no change of min_effect or more anywhere)
    bound: float | None  # the smallest X with P(no change larger than X) >= confidence, if any
    bound_confidence: float
    spread: float  # between-start spread (posterior mean, relative)
    overall: float  # the level's change from the first probed commit to the last (relative)
    done: bool
    to_decide_starts: int  # about how many more starts would decide what is open
    rounds: int
    starts: int
    gpu_s: float
    skipped: tuple[tuple[str, str], ...]

    def describe(self) -> list[str]:
        """The findings, one line each."""
        lines = []
        for c in self.changes:
            where = c.commit if len(c.candidates) == 1 else \
                f"{c.candidates[0]}..{c.candidates[-1]} ({len(c.candidates)} commits" + \
                (", the others untestable)" if c.located else ")")
            lines.append(f"{c.kind} at {where}: {c.value_before:.4g} → {c.value_after:.4g} ({c.effect:+.1%}, "
                         f"95 % interval {c.effect_low:+.1%} to {c.effect_high:+.1%}), confidence {c.confidence:.3f}"
                         + ("" if c.found else " (not settled)"))
        for c in self.small_changes:
            if c.found:
                lines.append(f"a step under the minimum effect at {c.commit}: {c.value_before:.4g} → {c.value_after:.4g} "
                             f"({c.effect:+.1%}, 95 % interval {c.effect_low:+.1%} to {c.effect_high:+.1%}), "
                             f"confidence {c.confidence:.3f}")
        for d in self.drifts:
            lines.append(f"drift from {d.first} to {d.last}: {d.value_from:.4g} → {d.value_to:.4g} "
                         f"({d.effect:+.1%}); no single commit made it")
        if not any(c.found for c in self.changes):
            if self.bound is not None:
                lines.append(f"no change larger than {self.bound:.1%} (confidence {self.bound_confidence:.3f})")
            if self.verdict == Verdict.UNDECIDED and self.to_decide_starts:
                lines.append(f"undecided: about {self.to_decide_starts} more starts would decide it")
            elif self.verdict == Verdict.UNDECIDED:
                lines.append(f"undecided: the level moves {self.overall:+.1%} over the range, and no step of "
                             f"{self.min_effect:.1%} or more, nor a drift, was located")
        return lines


@dataclass
class _Gap:
    """Gap a between neighbouring points lo < hi, and what it still wants."""

    a: int
    lo: int
    hi: int
    p: float  # P(change inside)
    status: str  # quiet | found | doubt | stuck | split | drift
    inside: tuple[int, ...] = ()  # testable commits inside


@dataclass
class _State:
    post: MetricPosterior
    gaps: list[_Gap]
    drifts: list[tuple[int, int, float, float, float]]  # (first point, last point, from, to, margin)
    confirmed: bool  # some change found
    confidence: float
    sure: FloatArray = field(default_factory=lambda: np.zeros(0))  # per gap: the claimed confidence

    @property
    def quiet(self) -> bool:
        """P(no change of min_effect or more) >= confidence (a forward pass of its own: asked only when
        needed), and the levels span less than min_effect: small steps that add up to more are a drift
        to look for, not "no change"."""
        levels = self.post.level_mean
        if float(levels.max() - levels.min()) >= self.post.prior.material:
            return False
        return self.post.no_material >= self.confidence


class MetricSearch:
    """The ask/tell search; see the module docstring."""

    def __init__(self, commits: Sequence[str], options: MetricSearchOptions | None = None, *,
                 observations: Iterable[MetricObservation] = (), rounds: int = 0) -> None:
        if len(commits) < 2:
            raise BisectError("a metric bisect needs at least two commits (good and bad)")
        if len(set(commits)) != len(commits):
            raise BisectError("commits must be distinct")
        self.commits = tuple(commits)
        self.options = options or MetricSearchOptions()
        self.prior = self.options.prior()
        self._index = {c: i for i, c in enumerate(self.commits)}
        self._y: list[list[float]] = [[] for _ in self.commits]
        self._se: list[list[float]] = [[] for _ in self.commits]
        self._skipped: dict[int, str] = {}
        self._in_flight: Counter[int] = Counter()
        self._installed: set[int] = set()
        self._centre: float | None = None
        self._state_cache: _State | None = None
        self._grid: LevelGrid | None = None
        self._arrays: tuple[list[int], FloatArray, FloatArray] | None = None
        self._count = 0
        self._grid_checked = 0  # starts when the grid was last checked
        self._told: list[float] = []  # every start's log value, in the order told
        self._emit_cache: dict[int, tuple[int, FloatArray]] = {}  # commit -> (starts summed, log-likelihood)
        self.observations: list[MetricObservation] = []
        self.rounds = rounds
        self.gpu_s = 0.0
        for obs in observations:
            if obs.commit not in self._index:
                continue
            if obs.skip_reason is not None:
                self.tell_skip(obs.commit, obs.skip_reason)
            else:
                self.tell(obs.commit, obs.value, obs.se)

    # ---- tell ----------------------------------------------------------------------------------

    def tell(self, commit: str, value: float, se: float = 0.0) -> None:
        """One server start at `commit`: its value of the metric (> 0) and the value's standard error
        within the start (same unit; 0 if unknown)."""
        i = self._commit(commit)
        if not (math.isfinite(value) and value > 0):
            raise BisectError(f"a metric value must be a positive number, got {value!r} at {commit}")
        if not (math.isfinite(se) and se >= 0):
            raise BisectError(f"a standard error must be a number >= 0, got {se!r} at {commit}")
        if i in self._skipped:
            raise BisectError(f"{commit} was told untestable ({self._skipped[i]})")
        y = math.log(value)
        if self._centre is None:
            self._centre = y
        self._y[i].append(y)
        self._se[i].append(se / value)
        self._count += 1
        self._told.append(y)
        self._arrays = None
        if self._in_flight[i] > 0:
            self._in_flight[i] -= 1
        self.gpu_s += self.options.start_s + (self.options.install_s if i not in self._installed else 0.0)
        self._installed.add(i)
        self.observations.append(MetricObservation(commit, value, se))
        self._state_cache = None

    def tell_skip(self, commit: str, reason: str) -> None:
        """`commit` cannot be started (it does not install, its server does not come up): never asked for
        again. Its starts told before stay."""
        i = self._commit(commit)
        self._skipped[i] = reason
        self._in_flight.pop(i, None)
        self.observations.append(MetricObservation(commit, skip_reason=reason))
        self._state_cache = None

    def _commit(self, commit: str) -> int:
        if commit not in self._index:
            raise BisectError(f"{commit!r} is not a commit of this range")
        return self._index[commit]

    # ---- what is known --------------------------------------------------------------------------

    @property
    def starts(self) -> int:
        return self._count

    def starts_at(self, commit: str) -> int:
        return len(self._y[self._commit(commit)])

    def posterior(self) -> MetricPosterior:
        return self._state().post

    def load_per_start(self, request_s: float, request_cv: float, *, start_s: float | None = None,
                       lo: int = 20, hi: int = 4000) -> int:
        """The requests per start that buy the most information per GPU-second, for a driver that
        chooses the load: a start's value varies by tau^2 + request_cv^2 / n (the spread between starts
        learned so far, and its own n requests' spread), and costs start_s + n request_s GPU-seconds
        (`start_s`: the start alone, without its load phase; default the options' start_s). The product
        is least at n = (request_cv / tau) sqrt(start_s / request_s): past it, another start buys more
        than more requests on this one. Before any start, tau is taken as the model's middle spread."""
        if request_s <= 0 or request_cv <= 0:
            raise BisectError("request_s and request_cv must be > 0")
        tau = self._state().post.tau if self.starts else float(np.median(self.prior.taus))
        fixed = self.options.start_s if start_s is None else start_s
        return int(min(hi, max(lo, round(request_cv / max(tau, 1e-4) * math.sqrt(fixed / request_s)))))

    def _data(self) -> tuple[list[int], FloatArray, FloatArray]:
        """Every start told: commit index, log value, log-scale SE (kept until the next tell)."""
        if self._arrays is None:
            index = [i for i, v in enumerate(self._y) for _ in v]
            y = np.array([x for v in self._y for x in v], dtype=np.float64)
            se = np.array([x for v in self._se for x in v], dtype=np.float64)
            self._arrays = (index, y, se)
        return self._arrays

    def _state(self) -> _State:
        if self._state_cache is None:
            if self.starts == 0:
                raise BisectError("no start told yet")
            grid = self._level_grid()
            points = [i for i, v in enumerate(self._y) if v]
            rows: list[FloatArray] = []
            for i in points:
                have, row = self._emit_cache.get(i, (0, np.zeros(0)))
                if have < len(self._y[i]):
                    add = point_loglik(np.array(self._y[i][have:]), np.array(self._se[i][have:]), grid, self.prior)
                    row = add + row if have else add
                    self._emit_cache[i] = (len(self._y[i]), row)
                rows.append(row)
            post = posterior_of_points(points, np.stack(rows), len(self.commits) - 1, self.prior, grid)
            self._state_cache = self._analyse(post)
        return self._state_cache

    def _level_grid(self) -> LevelGrid:
        """The grid the posterior is computed on: kept from round to round (each commit's log-likelihood
        on it is kept too, and only new starts are added) while it is fine and wide enough; remade on a
        ladder of steps (halving every two rungs) with room to spare when it is not."""
        index, y, se = self._data()
        g = self._grid
        # Checked again after a quarter more starts, or at once if a new one falls off the grid.
        if (g is not None and self._count < 1.25 * self._grid_checked
                and all(g.mu[0] < x < g.mu[-1] for x in self._told[self._grid_checked:])):
            return g
        self._grid_checked = self._count
        step, lo, hi = grid_needs(y, se, index, self.prior)
        if g is None or g.step > step * 1.0001 or g.step < step / 2.01 or g.mu[0] > lo or g.mu[-1] < hi:
            rung = math.ceil(2 * math.log2(MAX_STEP / step) - 1e-9)
            room = 0.1 * (hi - lo)
            assert self._centre is not None
            self._grid = make_grid(self._centre, MAX_STEP * 2 ** (-rung / 2), lo - room, hi + room, self.prior)
            self._emit_cache.clear()
        assert self._grid is not None
        return self._grid

    def _sure(self, post: MetricPosterior) -> FloatArray:
        """Per gap, the confidence claimed: with `robust_spread`, the lowest P(change) at any credible
        between-start spread (a few odd starts under a wide spread look like a step under a narrow one)."""
        p = post.gap_change.copy()
        if self.options.robust_spread and p.size:
            credible = post.credible_taus()
            p = np.minimum(p, post.gap_change_by_tau[credible].min(axis=0))
        return p

    def _testable(self, i: int) -> bool:
        return i not in self._skipped and len(self._y[i]) + self._in_flight[i] < self.options.max_starts_per_commit

    def _analyse(self, post: MetricPosterior) -> _State:
        o = self.options
        pts = post.points
        sure = self._sure(post)
        drifts = self._find_drifts(post, sure) if o.drift else []
        in_drift = {a for first, last, *_ in drifts for a in range(first, last)}
        gaps = []
        for a, (lo, hi) in enumerate(pairwise(pts)):
            p = float(post.gap_change[a])
            # Searched where a change of min_effect or more may be: a step under it is no change, and
            # one near the model's resolution can stay in doubt for any number of starts.
            material = float(post.gap_material[a])
            inside = tuple(j for j in range(lo + 1, hi) if j not in self._skipped)
            if a in in_drift:
                status = "drift"
            elif inside:
                status = "split" if material >= o.explore else "quiet"
            elif sure[a] >= o.settled_at and min(len(self._y[lo]), len(self._y[hi])) >= o.side_starts:
                status = "found"
            elif material < o.explore:
                status = "quiet"
            elif not (self._testable(lo) or self._testable(hi)):
                status = "stuck"
            else:
                status = "doubt"
            gaps.append(_Gap(a, lo, hi, p, status, inside))
        confirmed = any(g.status == "found" for g in gaps)
        return _State(post, gaps, drifts, confirmed, o.confidence, sure)

    # ---- drift -----------------------------------------------------------------------------------

    def _point_values(self, post: MetricPosterior) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Per point: commit index, a robust mean of its starts (from the median, two t-weighted steps)
        and its weight (the sum of its starts' precisions)."""
        index, y, se = self._data()
        points = np.asarray(post.points)
        pos = np.searchsorted(points, np.asarray(index))
        order = np.lexsort((y, pos))
        ys, ids = y[order], pos[order]
        first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        count = np.diff(np.r_[first, ids.size])
        m: FloatArray = (ys[first + (count - 1) // 2] + ys[first + count // 2]) / 2
        var = post.tau**2 + se**2
        nu = self.prior.nu
        for _ in range(2):
            w = (nu + 1) / (nu + (y - m[pos]) ** 2 / var) / var
            m = np.asarray(np.bincount(pos, w * y, points.size) / np.bincount(pos, w, points.size), dtype=np.float64)
        weight = np.asarray(np.bincount(pos, 1 / var, points.size), dtype=np.float64)
        return points.astype(np.float64), m.astype(np.float64), weight

    def _find_drifts(self, post: MetricPosterior, sure: FloatArray) -> list[tuple[int, int, float, float, float]]:
        """Runs of same-direction steps (or a lone step the search can do no more on) over which a ramp
        fits the probed commits' values better than the staircase: (first point, last point, level from,
        level to, margin), points as positions in `post.points`."""
        o = self.options
        p = post.gap_change
        if p.size == 0:
            return []
        cands = [a for a in range(p.size) if p[a] > 0.5 and sure[a] < o.settled_at]
        confirmed = [a for a in range(p.size) if p[a] > 0.5 and sure[a] >= o.settled_at]
        run: list[int] = []
        for a in range(p.size + 1):
            q = float(p[a]) if a < p.size else 0.0
            if SPREAD_FLOOR <= q <= 0.5:
                run.append(a)
                continue
            if run and sum(float(p[b]) for b in run) >= SPREAD_SUM and not any(
                    b + 1 in cands or b - 1 in cands for b in run):
                cands.append(max(run, key=lambda b: float(p[b])))
            run = []
        cands.sort()
        if not cands:
            return []
        means = post.level_mean
        rises = {a: means[a + 1] > means[a] for a in cands}
        xs, ys, ws = self._point_values(post)
        out: list[tuple[int, int, float, float, float]] = []
        groups: list[list[int]] = []
        for a in cands:
            if groups and rises[a] == rises[groups[-1][-1]] and not any(groups[-1][-1] < c < a for c in confirmed):
                groups[-1].append(a)
            else:
                groups.append([a])
        all_cuts = sorted([*cands, *confirmed])
        for g in groups:
            if len(g) == 1 and not self._lone_stuck(post, g[0]):
                continue
            # Every stretch of the run's steps (a step of chance beside a ramp joins its run, and the
            # ramp fits the whole run worse than a staircase); the stretches that a ramp fits, best first.
            found = sorted((d for i in range(len(g)) for j in range(i + 1 if len(g) == 1 else i + 2, len(g) + 1)
                            if (d := self._drift_over(post, g[i:j], all_cuts, xs, ys, ws)) is not None),
                           key=lambda d: -d[4])
            for d in found:
                if not any(d[0] < o[1] and o[0] < d[1] for o in out):
                    out.append(d)
        return out

    def _drift_over(self, post: MetricPosterior, steps: list[int], all_cuts: list[int], xs: FloatArray,
                    ys: FloatArray, ws: FloatArray) -> tuple[int, int, float, float, float] | None:
        """A ramp over these same-direction steps (gap numbers), if it beats their staircase, in the
        window between the steps around them."""
        before = [c for c in all_cuts if c < steps[0]]
        after = [c for c in all_cuts if c > steps[-1]]
        lo = before[-1] + 1 if before else 0
        hi = after[0] + 1 if after else len(post.points)
        if hi - lo < DRIFT_MIN_POINTS:
            return None
        cuts = [a + 1 - lo for a in steps]
        margin, first, last, r_a, r_b = _ramp_margin(xs[lo:hi], ys[lo:hi], ws[lo:hi], cuts)
        need = DRIFT_MARGIN_LONE if len(steps) == 1 else DRIFT_MARGIN_RUN if len(steps) == 2 else DRIFT_MARGIN_LONG
        # A ramp has probed commits on it (one between two steps' commits is a step in doubt), and its
        # window two starts a commit or more: a commit of one start can be an outlier that a ramp fits
        # and a staircase does not (an 18 % step was once called a drift after 12 starts).
        starts = sum(len(self._y[post.points[q]]) for q in range(lo, hi))
        if margin >= need and last - first - 1 >= DRIFT_INSIDE and starts >= DRIFT_STARTS * (hi - lo):
            return lo + first, lo + last, r_a, r_b, margin
        return None

    def _lone_stuck(self, post: MetricPosterior, a: int) -> bool:
        lo, hi = post.points[a], post.points[a + 1]
        located = all(j in self._skipped for j in range(lo + 1, hi))
        return located and not (self._testable(lo) or self._testable(hi))

    def drifts(self) -> list[MetricDrift]:
        st = self._state()
        return [MetricDrift(self.commits[st.post.points[f]], self.commits[st.post.points[last]],
                            math.exp(r_a), math.exp(r_b), m) for f, last, r_a, r_b, m in st.drifts]

    # ---- ask -------------------------------------------------------------------------------------

    def _limits_reached(self) -> bool:
        o = self.options
        return ((o.max_starts is not None and self.starts >= o.max_starts)
                or (o.max_rounds is not None and self.rounds >= o.max_rounds)
                or (o.max_gpu_s is not None and self.gpu_s >= o.max_gpu_s))

    def _ends(self) -> tuple[int, int] | None:
        """The commits measured as the range's ends: good and bad, or where one proved untestable (a
        release whose engine crashes with these settings), the nearest testable commit inside. None when
        fewer than two commits are left to compare."""
        left = next((i for i in range(len(self.commits)) if i not in self._skipped), None)
        right = next((i for i in reversed(range(len(self.commits))) if i not in self._skipped), None)
        if left is None or right is None or left >= right:
            return None
        return left, right

    def _endpoint_needs(self) -> dict[int, int]:
        need: dict[int, int] = {}
        for i in self._ends() or ():
            short = self.options.endpoint_starts - len(self._y[i]) - self._in_flight[i]
            if short > 0:
                need[i] = short
        return need

    def _compared(self) -> bool:
        """Two commits of the range hold starts: only then can a level be said to move or not."""
        return sum(1 for v in self._y if v) >= 2

    def _open(self, st: _State) -> list[_Gap]:
        return [g for g in st.gaps if g.status in ("split", "doubt")]

    @property
    def done(self) -> bool:
        if self._limits_reached():
            return True
        if self._endpoint_needs():
            return False
        if self._ends() is None or not self._compared():
            return True  # fewer than two testable commits: nothing to compare
        st = self._state()
        if self._open(st) or self._side_needs(st) or self._segment_needs(st):
            return False
        # A change located but stuck short of `settle` (its commits and its segments' at their caps) ends
        # the search undecided: what is left to learn is there, not elsewhere.
        stuck = any(g.status == "stuck" for g in st.gaps)
        return st.confirmed or stuck or bool(st.drifts) or st.quiet or not self._any_testable()

    def _any_testable(self) -> bool:
        return any(self._testable(i) for i in range(len(self.commits)))

    def _segment_needs(self, st: _State) -> dict[int, int]:
        """A located change in doubt with both its commits at their cap: one more start at each of the
        least-started probed commits of the segments on either side (of the nearest `SEGMENT_NEAR` each),
        while those segments hold fewer starts than `SEGMENT_FACTOR` times the two commits'. What is left
        to learn there is each side's level: a step between two commits of one level, pushed up by
        chance, is pulled down by its neighbours' starts, and a real one is settled by them."""
        need: dict[int, int] = {}
        pts = st.post.points
        cuts = [g.a for g in st.gaps if g.p > 0.5 or g.status == "drift"]
        for g in st.gaps:
            if g.status != "stuck":
                continue
            left = [c for c in cuts if c < g.a]
            right = [c for c in cuts if c > g.a]
            first = left[-1] + 1 if left else 0
            last = right[0] if right else len(pts) - 1
            sides = ([pts[q] for q in range(g.a - 1, first - 1, -1)][:SEGMENT_NEAR],
                     [pts[q] for q in range(g.a + 2, last + 1)][:SEGMENT_NEAR])
            held = sum(len(self._y[i]) for side in sides for i in side)
            if held >= SEGMENT_FACTOR * (len(self._y[g.lo]) + len(self._y[g.hi])):
                continue
            for side in sides:
                free = [i for i in side if self._testable(i) and not self._in_flight[i]]
                if free:
                    i = min(free, key=lambda x: (len(self._y[x]), abs(x - g.lo)))
                    need[i] = 1
        return need

    def _side_needs(self, st: _State) -> dict[int, int]:
        """A likely change located between neighbouring commits wants `side_starts` on each side."""
        need: dict[int, int] = {}
        for g in st.gaps:
            if g.inside or g.p < 0.5 or g.status == "drift":
                continue
            for i in (g.lo, g.hi):
                short = self.options.side_starts - len(self._y[i]) - self._in_flight[i]
                if short > 0 and self._testable(i):
                    need[i] = max(need.get(i, 0), short)
        return need

    def ask(self, k: int = 1) -> list[MetricProbe]:
        """The next round: at most k server starts in all, on commits without starts in flight, each
        request with its expected information per GPU-second. Asking counts a round."""
        if k < 1:
            raise BisectError(f"k must be >= 1, got {k}")
        if self._limits_reached():
            return []
        if self.options.max_starts is not None:
            k = min(k, self.options.max_starts - self.starts - sum(self._in_flight.values()))
        if k < 1:
            return []
        plan: Counter[int] = Counter()
        values: dict[int, float] = {}
        for i, n in sorted(self._endpoint_needs().items()):
            take = min(n, k - sum(plan.values()))
            if take > 0:
                plan[i] += take
                values[i] = math.inf
        if not plan and self.starts > 0:
            st = self._state()
            for needs in (self._side_needs(st), self._segment_needs(st)):
                for i, n in sorted(needs.items()):
                    take = min(n, k - sum(plan.values()))
                    if take > 0 and not self._in_flight[i]:
                        plan[i] += take
                        values[i] = math.inf
            if sum(plan.values()) < k and not self.done:
                self._fill(st, k, plan, values)
        reqs = [MetricProbe(self.commits[i], i, n, values.get(i, 0.0)) for i, n in sorted(plan.items()) if n > 0]
        if reqs:
            self.rounds += 1
            for r in reqs:
                self._in_flight[r.index] += r.starts
        return reqs

    def _noise(self, post: MetricPosterior) -> float:
        """The variance of one start's value about its commit's level (log scale)."""
        se = self._data()[2]
        return float(np.dot(post.tau_post, post.taus**2)) + (float(np.median(se**2)) if se.size else 0.0)

    def _fill(self, st: _State, k: int, plan: Counter[int], values: dict[int, float]) -> None:
        """Fill the round greedily by information per GPU-second (see the module docstring)."""
        gaps = self._open(st) or [g for g in st.gaps if g.status != "drift"]
        r = _Round(self, st.post, plan, gaps)
        repeats = r.repeat_values(r.mixtures)
        # Sub-gaps still to split, (gap, lo, hi, P of a change inside) -> (value, its middle commit).
        splits = r.split_values((g.a, g.lo, g.hi, g.p) for g in gaps if g.inside)
        while sum(plan.values()) < k:
            i, value = max(repeats.items(), key=lambda kv: (kv[1], -kv[0]), default=(-1, -1.0))
            sub = max(splits.items(), key=lambda kv: kv[1][0], default=None)
            split = sub is not None and sub[1][0] > value
            if sub is not None and split:
                (a, lo, hi, p), (value, i) = sub
            if i < 0 or value <= _INFO_FLOOR:
                break
            plan[i] += 1
            values[i] = values.get(i, 0.0) + value
            if sub is not None and split:
                # An untested commit: it splits its sub-gap; further starts there come from its own mixture.
                del splits[sub[0]]
                g = hi - lo
                splits.update(r.split_values([(a, lo, i, p * (i - lo) / g), (a, i, hi, p * (hi - i) / g)]))
                m, v = r.comps[a]
                r.mixtures[i] = [(_split_weights(np.array([i]), lo, hi, p)[0], m, v)]
            repeats.update(r.repeat_values([i]))

    def _middle(self, lo: int, hi: int, plan: Counter[int]) -> int | None:
        """The testable commit strictly between lo and hi nearest their middle (the lower of two), not
        planned or in flight."""
        mid = (lo + hi) // 2
        for d in range(hi - lo):
            for j in (mid - d, mid + d + 1) if (lo + hi) % 2 else (mid - d, mid + d):
                if lo < j < hi and j not in plan and not self._in_flight[j] and self._testable(j):
                    return j
        return None

    def _testable_with(self, i: int, planned: int) -> bool:
        return i not in self._skipped and len(self._y[i]) + planned <= self.options.max_starts_per_commit

    # ---- result ----------------------------------------------------------------------------------

    def result(self) -> MetricReport:
        o = self.options
        if not self._compared():
            return MetricReport(Verdict.UNDECIDED, (), (), (), o.min_effect, o.confidence, 0.0, None, 0.0, 0.0,
                                0.0, self.done, 0, self.rounds, self.starts, self.gpu_s, self._skip_list())
        st = self._state()
        post = st.post
        changes: list[MetricChange] = []
        small: list[MetricChange] = []
        for g in st.gaps:
            if g.p <= 0.5 or g.status == "drift":
                continue
            med, low, high = post.effect(g.a)
            before, after = math.exp(post.level_mean[g.a]), math.exp(post.level_mean[g.a + 1])
            up = med > 0
            kind = Kind.IMPROVEMENT if up == o.higher_is_better else Kind.REGRESSION
            sure = float(st.sure[g.a])
            located = not g.inside
            ch = MetricChange(kind, self.commits[g.hi], self.commits[g.lo + 1: g.hi + 1], self.commits[g.lo], sure,
                              located, located and sure >= o.confidence
                              and min(len(self._y[g.lo]), len(self._y[g.hi])) >= o.side_starts,
                              before, after, math.expm1(med), math.expm1(low),
                              math.expm1(high), float(post.gap_material[g.a]), len(self._y[g.lo]), len(self._y[g.hi]))
            (small if ch.below_min_effect else changes).append(ch)
        bound, bound_conf = self._bound(post)
        found = any(c.found for c in changes)
        if found:
            verdict = Verdict.CHANGES
        elif st.quiet and not changes:
            verdict = Verdict.NO_CHANGE
        elif st.drifts and not changes:
            verdict = Verdict.DRIFT
        else:
            verdict = Verdict.UNDECIDED
        done = self.done
        to_decide = 0 if (done and verdict != Verdict.UNDECIDED) else self._to_decide(st)
        return MetricReport(verdict, tuple(changes), tuple(small), tuple(self.drifts()), o.min_effect, o.confidence,
                            post.no_material, bound, bound_conf, math.expm1(post.tau),
                            math.expm1(float(post.level_mean[-1] - post.level_mean[0])), done, to_decide, self.rounds,
                            self.starts, self.gpu_s, self._skip_list())

    def _skip_list(self) -> tuple[tuple[str, str], ...]:
        return tuple((self.commits[i], r) for i, r in sorted(self._skipped.items()))

    def _bound(self, post: MetricPosterior) -> tuple[float | None, float]:
        """The smallest multiple of min_effect X (of `BOUND_LADDER`) with P(no change larger than X) at
        the confidence, and that probability."""
        o = self.options
        if post.no_material >= o.confidence:
            return o.min_effect, post.no_material
        for f in BOUND_LADDER[1:]:
            x = o.min_effect * f
            p = post.no_material_at(math.log1p(x))
            if p >= o.confidence:
                return x, p
        return None, post.no_material

    def _to_decide(self, st: _State) -> int:
        """A rough count of the starts that would decide what is open. A located change in doubt: its
        evidence so far (the log-odds of its confidence) scaled up to the confidence's, on the starts at
        its two commits. An open gap: the starts per side that tell its two levels apart at the
        confidence (Wald), for each commit of a bisection. With nothing open: the starts at the ends
        that bound a change under min_effect."""
        o = self.options
        post = st.post
        sigma = math.sqrt(self._noise(post))
        z = float(norm.ppf(o.confidence)) + 1.0
        goal = math.log(o.confidence / (1 - o.confidence))
        total = 0
        for g in st.gaps:
            if g.status not in ("split", "doubt", "stuck"):
                continue
            d = max(abs(float(post.right.mean[g.a] - post.left.mean[g.a])), self.prior.resolution)
            per_commit = math.ceil(2 * (z * sigma / d) ** 2)
            have = len(self._y[g.lo]) + len(self._y[g.hi])
            sure = float(min(max(st.sure[g.a], 1e-6), 1 - 1e-6))
            now = math.log(sure / (1 - sure))
            if not g.inside and now > 0.5:
                total += math.ceil(have * (goal / now - 1))
            else:
                total += max(0, 2 * per_commit - have)
            if g.inside:
                total += math.ceil(math.log2(len(g.inside) + 1)) * per_commit
        if total == 0 and not (st.confirmed or st.quiet):
            ends = post.level_mean[-1] - post.level_mean[0]
            room = self.prior.material - abs(float(ends))
            if room > 0:
                per_side = math.ceil(2 * (z * sigma / room) ** 2)
                have = min(len(self._y[post.points[0]]), len(self._y[post.points[-1]]))
                total = 2 * max(0, per_side - have)
        return total


_Sub = tuple[int, int, int, float]  # a sub-gap: (gap, lo, hi, P of a change inside)
_Mixture = tuple[FloatArray, FloatArray, FloatArray]  # three components' weights, means, variances


class _Round:
    """What one round's greedy fill weighs: the per-start noise, each gap's three levels, and for each
    commit whose further starts are candidates the mixtures a start there comes from."""

    def __init__(self, search: MetricSearch, post: MetricPosterior, plan: Counter[int], gaps: list[_Gap]) -> None:
        self.search, self.post, self.plan = search, post, plan
        o = search.options
        self.start_s, self.cost_new = o.start_s, o.start_s + o.install_s
        self.sigma2 = search._noise(post)
        self.comps = {a: _components(post, a) for a in range(post.gap_change.size)}
        where = {x: a for a, x in enumerate(post.points)}
        last = len(post.points) - 1
        self.mixtures: dict[int, list[_Mixture]] = {}
        for i in sorted({i for g in gaps for i in (g.lo, g.hi)}):
            a = where[i]
            mix = []
            for gap, side in ((a, 1), (a - 1, 2)):  # its right gap (it has the left level), its left gap
                if 0 <= gap < last:
                    m, v = self.comps[gap]
                    p = float(post.gap_change[gap])
                    pick = [0, side, side]  # a zero weight on the third: every mixture has three components
                    mix.append((np.array([1 - p, p, 0.0]), m[pick], v[pick]))
            self.mixtures[i] = mix

    def _cost(self, i: int) -> float:
        return self.start_s if (i in self.search._installed or self.plan[i]) else self.cost_new

    def repeat_values(self, items: Iterable[int]) -> dict[int, float]:
        """The information per GPU-second of one more start at each commit: its mixtures' information
        for the starts planned and one more (the mean of n starts has the noise sigma^2 / n), in one batch."""
        rows: list[tuple[int, float, FloatArray, FloatArray, FloatArray]] = []
        gain: dict[int, float] = {}
        for i in items:
            if self.search._in_flight[i] or not self.search._testable_with(i, self.plan[i] + 1):
                gain[i] = -1.0
                continue
            gain[i] = 0.0
            now = self.plan[i]
            for w, m, v in self.mixtures[i]:
                rows.append((i, 1.0, w, m, v + self.sigma2 / (now + 1)))
                if now:
                    rows.append((i, -1.0, w, m, v + self.sigma2 / now))
        if rows:
            info = _mixture_info(np.array([r[2] for r in rows]), np.array([r[3] for r in rows]),
                                 np.array([r[4] for r in rows]))
            for (i, sign, *_), x in zip(rows, info, strict=True):
                gain[i] += sign * float(x)
        return {i: g / self._cost(i) if g >= 0 else g for i, g in gain.items()}

    def split_values(self, subs: Iterable[_Sub]) -> dict[_Sub, tuple[float, int]]:
        """Per sub-gap: its middle testable commit (a bisection's probe) and the information per
        GPU-second of a start there, in one batch."""
        out: dict[_Sub, tuple[float, int]] = {}
        rows: list[tuple[_Sub, int]] = []
        for sub in subs:
            j = self.search._middle(sub[1], sub[2], self.plan)
            if j is None:
                out[sub] = (-1.0, -1)
            else:
                rows.append((sub, j))
        if rows:
            w = np.concatenate([_split_weights(np.array([j]), lo, hi, p) for (_, lo, hi, p), j in rows])
            m = np.array([self.comps[sub[0]][0] for sub, _ in rows])
            v = np.array([self.comps[sub[0]][1] for sub, _ in rows]) + self.sigma2
            for (sub, j), x in zip(rows, _mixture_info(w, m, v), strict=True):
                out[sub] = (float(x) / self._cost(j), j)
        return out


# ---- information -------------------------------------------------------------------------------


def _components(post: MetricPosterior, a: int) -> tuple[FloatArray, FloatArray]:
    """Means and variances of the levels (no change: shared; change: left side, right side) of gap a."""
    m = np.array([post.shared.mean[a], post.left.mean[a], post.right.mean[a]])
    v = np.array([post.shared.var[a], post.left.var[a], post.right.var[a]])
    return m, v


def _split_weights(js: FloatArray | np.ndarray, lo: int, hi: int, p: float) -> FloatArray:
    """For untested commits j of a gap lo..hi holding a change with probability p (uniform over its
    positions): P(no change), P(the change comes after j: j has the left level), P(at or before j)."""
    g = hi - lo
    after = p * (hi - js) / g
    out: FloatArray = np.stack([np.full(len(js), 1 - p), after, p - after], axis=1)
    return out


def _mixture_info(w: FloatArray, m: FloatArray, v: FloatArray) -> FloatArray:
    """Mutual information (bits) between y ~ sum_k w_k N(m_k, v_k) and the component k, per row: the
    pairwise-distance estimate of Kolchinsky and Tracey (2017) with the Bhattacharyya distance,
    -sum_i w_i ln sum_j w_j exp(-BD(i, j)), a lower bound that is 0 for identical components and the
    weights' entropy for separated ones (and no quadrature: it is evaluated for every candidate of
    every round)."""
    dm = m[:, :, None] - m[:, None, :]
    sv = v[:, :, None] + v[:, None, :]
    bd = dm**2 / (4 * sv) + 0.5 * np.log(sv / (2 * np.sqrt(v[:, :, None] * v[:, None, :])))
    inner = np.sum(w[:, None, :] * np.exp(-bd), axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(w > 0, w * np.log(np.maximum(inner, 1e-300)), 0.0)
    out: FloatArray = np.maximum(-terms.sum(axis=1) / math.log(2), 0.0)
    return out


# ---- drift ---------------------------------------------------------------------------------------


def _ramp_margin(x: FloatArray, y: FloatArray, w: FloatArray, cuts: Sequence[int],
                 reach: int | None = None) -> tuple[float, int, int, float, float]:
    """A ramp (flat to point A, linear to point B, flat after) against the staircase cut at `cuts`
    (positions where a new segment starts), by weighted least squares on the points' values: the ramp's
    penalised log-likelihood less the staircase's (AIC / -2), with A, B, and the ramp's two levels. A
    lies before the first cut and B at or after the last (within `reach` points of them, if given)."""
    bounds = [0, *cuts, len(x)]
    stair = 0.0
    for lo, hi in pairwise(bounds):
        mean = float(np.sum(w[lo:hi] * y[lo:hi]) / np.sum(w[lo:hi]))
        stair += float(np.sum(w[lo:hi] * (y[lo:hi] - mean) ** 2))
    n = len(x)
    starts = np.arange(0 if reach is None else max(0, cuts[0] - reach), cuts[0])
    ends = np.arange(cuts[-1], n if reach is None else min(n, cuts[-1] + reach))
    grid_i, grid_j = np.meshgrid(starts, ends, indexing="ij")
    i, j = grid_i.ravel(), grid_j.ravel()
    # Weight of the level at A in each point's fit: 1 up to A, falling linearly to 0 at B.
    f = np.clip((x[j][:, None] - x[None, :]) / (x[j] - x[i])[:, None], 0.0, 1.0)  # (pairs, points)
    g = 1 - f
    aa, ab, bb = (w * f * f).sum(axis=1), (w * f * g).sum(axis=1), (w * g * g).sum(axis=1)
    ya, yb = (w * f * y).sum(axis=1), (w * g * y).sum(axis=1)
    det = aa * bb - ab * ab
    ok = det > 1e-12 * np.maximum(aa * bb, 1e-300)
    safe = np.where(ok, det, 1.0)
    r_a, r_b = (bb * ya - ab * yb) / safe, (aa * yb - ab * ya) / safe
    rss = np.where(ok, (w * (y - r_a[:, None] * f - r_b[:, None] * g) ** 2).sum(axis=1), np.inf)
    best = int(np.argmin(rss))
    stair_params, ramp_params = 2 * (len(cuts) + 1) - 1, 4
    margin = (-float(rss[best]) / 2 - ramp_params) - (-stair / 2 - stair_params)
    return margin, int(i[best]), int(j[best]), float(r_a[best]), float(r_b[best])
