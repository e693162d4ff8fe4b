"""The noisy, parallel search for every change of every failure mode in a commit range. Pure.

Candidates are first-parent commits c_0 (the good endpoint) ... c_N (the bad endpoint), oldest
first. One probe is one server start at one commit replaying the suite: it reports how many of
its samples fell into each failure mode (`sweeper.judge.modes`), so a single probe informs every
mode at once. The caller drives the search with an ask/tell loop and decides how probes run:

    search = Search(commits, SearchOptions(confidence=0.99))
    while not search.done:
        for req in search.ask(k):                              # one round: up to k commits
            ...start a server at req.commit, replay about req.samples requests...
            search.tell(req.commit, samples, {"json_schema": 3, "thinking_budget": 1})
            # or search.tell_skip(req.commit, "server_failed: ...")
    report = search.result()

A resumed search is built the same way from what was told before, `Search(commits, options,
observations=old.observations, rounds=...)`; observations of commits outside `commits` are ignored
(a widened range keeps everything it can).

Each mode's rate along the range is piecewise constant with unknown change points, and varies
between server starts (`sweeper.bisect.segments`). For each gap between two neighbouring probed
commits the posterior gives the probability that the mode's rate changes inside it.

How a round is chosen. Every mode names the commits it wants, each with a value:
* the endpoints, until each has two server starts (a rate resting on one start cannot tell a
  regression from per-start variation);
* the bad endpoint again while nothing fails there, until enough clean samples bound its rate
  below `min_rate` at `confidence`, spread over `pass_starts` server starts (then it "passes"):
  a rate that varies between starts hides in a few clean ones, as a steady one does not;
* nothing for a mode whose rate is credibly below `min_rate` everywhere (its 95 % upper bounds):
  changes that small are below the search's resolution, so the mode is reported, not searched;
* inside a gap that may hold a change (P >= `explore`) and still has untested commits: evenly
  spaced commits, the first worth the gap's probability, the t-th worth 1/t of it (splitting a
  gap in t+1 parts shrinks it by less each time);
* inside a gap whose ends share a rate but whose length leaves the prior at least `bump_explore`
  on two changes inside it (a short bump: a regression and its fix): the same, worth that
  probability;
* with `bump_width` W (a scan the user asks for): inside every gap between probed commits that
  holds W or more testable commits, mode or no mode, the fewest of them that leave no run of W
  unprobed (g // W of its g, evenly spaced), worth `bump_explore`: a regression fixed again W or
  more commits later cannot then fall between two probes;
* without it, once nothing else is wanted and no mode has a change in view (or none fails): the
  same scan at `quiet_scan` (3) before the search says nothing changed. Ends that agree are where a
  regression fixed again hides, and a search that located a change never makes it;
* for a gap already down to one testable commit whose change is still unsure (P under `confidence`
  and over 1 - `confidence`; where starts vary, over `explore` unless beside a likely change): one
  more start on the side with fewer samples, worth min(P, 1 - P), sized for the contrast the two
  commits' own counts show (at least 2x; not the mode's largest), up to `max_starts_in_doubt`
  starts a side, while those counts leave a `min_contrast` step between the two commits credible
  (with `capped_segment_starts`, where starts vary and both are at their cap: at the least-started
  commit of the two segments around the gap, while they hold under that many times the gap's own
  starts);
* for a located change that the mixture over dispersions is sure of but some credible dispersion
  is not (`robust_dispersion`): one more start on the side with fewer starts, up to
  `max_starts_varying` (the data leave a varying rate credible).
* for a mode with a change in view that wants nothing else, a stretch of gaps that each hold under
  `explore` of another change but together at least `spread_explore`, failing at both its ends
  (whose counts leave a `min_contrast` step between them credible): one more start, of up to
  `spread_batch` samples, at the stretch's thinnest probe (early splits are thin, and a step among
  thin probes spreads over their gaps);
* for a mode that wants nothing else, the most unlikely stretch of up to `odd_len` neighbouring
  probes inside one segment, by its pooled count against the rest of the segment (either binomial
  tail under `odd_level`, counts shrunk by the learned dispersion's design effect), that has a
  probe thinner than that: one more start there (a bump or dip between split probes shows as a few
  thin probes a little off their segment, and the prior of one change per range spreads it thin);
* for a mode with no change in view whose P(no change) is short of `confidence` (and above
  1 - `confidence`): more samples at the ends, then at any probed commit. The search stops on
  evidence, not when a change merely looks unlikely.
Gaps inside a drift (`sweeper.bisect.drift`: a run of same-direction steps a ramp fits as well, or
a lone step the search can do no more on, or a run of gaps that each hold a little of a change,
that a ramp fits clearly better) want nothing: no commit there is the change.
A commit's value is the sum over modes, so a commit that serves several searches wins; the round
takes the K most valuable distinct commits. Each probe asks for the Wald sample count that tells
the rates on either side of its gap apart at `confidence`, planning for at least a `min_contrast`
(1.3x) change where the data show none larger, and inflated for the learned per-start variation
(a start of n samples is worth n / (1 + (n - 1) rho) independent ones) up to the count past which
another server start is the cheaper way to buy information: GPU-seconds per independent sample,
(start_s + n request_s)(1 + (n - 1) rho) / n, are least at n = sqrt(start_s (1 - rho) / (request_s
rho)). Every located change needs two starts on each side, whatever the learned dispersion.

The search is done when no mode wants anything, or the limits (`max_samples`, `max_rounds`,
`max_gpu_s` of modelled GPU time) are reached; a mode is "decided" when P(no change) reached the
confidence or every change is found, and otherwise reports an estimate of the samples (and the
report of the GPU-seconds) still needed. The report lists every change (a gap more likely changed
than not, outside drifts): its mode, direction, candidates, rates before and after, and its own
confidence (the lowest the posterior gives it at any credible dispersion); and every drift.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import accumulate, pairwise

import numpy as np
from scipy.stats import binom

from sweeper.bisect.drift import Drift, PointCounts, find_drifts
from sweeper.bisect.segments import ModePosterior, Prior, Rate, Start, posterior
from sweeper.errors import BisectError
from sweeper.judge.stats import samples_to_decide, wilson

SPREAD_FLOOR = 0.05  # a gap's P(change) that counts it in a run of small steps (`_drift_candidates`)

# A learned per-start correlation above this: the mode's rate varies between server starts.
RHO_VARIES = 0.02
# The scan width a report prices when none was asked for (`BisectReport.scan_quote`): the benchmarks'
# short bumps are 3-5 commits wide, and a scan's starts grow as N / width, so 3 is the dearest of them.
QUOTED_SCAN_WIDTH = 3


def _scan_grid(inside: Sequence[int], width: int) -> tuple[int, ...]:
    """The fewest commits of a gap's testable ones (`inside`) that leave no run of `width` of them
    unprobed: len // width, evenly spaced. Any of them probed leaves the rest still the fewest for
    the two parts, so a scan spread over rounds ends with as few probes as one made at once (a
    scan that split the whole gap in halves took 15 starts where 13 do)."""
    g = len(inside)
    t = g // width
    return tuple(inside[(s + 1) * (g + 1) // (t + 1) - 1] for s in range(t))


class Direction(StrEnum):
    REGRESSION = "regression"
    FIX = "fix"


class BadEndpoint(StrEnum):
    """What the bad endpoint shows: the premise of a bisect."""

    FAILS = "fails"  # some mode fails there
    PASSES = "passes"  # credibly nothing fails at rate >= min_rate
    UNDECIDED = "undecided"  # nothing seen yet, but not enough samples to say it passes
    UNTESTABLE = "untestable"


@dataclass(frozen=True)
class SearchOptions:
    """The search's limits and knobs; the defaults are the calibrated ones (BENCHMARKS.md)."""

    confidence: float = 0.99
    max_samples: int | None = None  # over the whole search
    max_rounds: int | None = None
    max_starts_per_commit: int = 6
    # Once some mode's rate varies between server starts (each start is then worth a few samples):
    # 96 finds an ICC 0.2-0.4 step in 74 % of 100 histories, at 0.97x the mean GPU-hours that 48 took
    # (69 %) before gaps away from a change were left at `explore` where starts vary; 24 found 53 %
    # and 12 41 %, at the same cost where fewer find it (BENCHMARKS.md).
    max_starts_varying: int = 96
    # Starts for each side of a step located to one commit but still in doubt (while starts agree):
    # six starts of a few hundred samples left 1.3-2x steps at P 0.9 for good. With this (and starts
    # sized for the step), 1.5-2x steps are found in 94 % of 500 histories where 87 % were; 12 and 24
    # differed by one history of 100, at the same median cost (BENCHMARKS.md).
    max_starts_in_doubt: int = 24
    max_samples_per_commit: int = 12000
    first_batch: int = 64
    min_batch: int = 16
    max_batch: int = 2000
    # The smallest contrast planned for where the data show none larger: a 1.3x step needs about
    # 10x the samples of a 3x one, so sizing for 3x left small steps unseen.
    min_contrast: float = 1.3
    # GPU-seconds of one server start and one request (the install kind's cost profile,
    # `sweeper.plan.cost`): they set how many samples one start gets before another start is cheaper.
    start_s: float = 240.0
    request_s: float = 2.0
    max_gpu_s: float | None = None  # modelled GPU-seconds over the whole search
    # A gap whose ends share a rate is searched for a bump (a rise and its fix inside it) while the
    # prior puts at least this much on two changes inside it.
    bump_explore: float = 0.01
    # Look for regressions fixed again inside the range (a bump the ends cannot show) at least this
    # many commits wide: every run of this many testable commits gets a probe, whatever the ends
    # show, so such a bump cannot fall between two probes. A scan: about N / bump_width server
    # starts over N commits. None: only where the prior puts `bump_explore` on one (cheap, and
    # blind to a bump much shorter than the range).
    bump_width: int | None = None
    # The scan a search makes, unless `bump_width` asks for one, before it reports that nothing
    # changed (no mode with a change in view, or none that fails): a range whose ends agree is where
    # a regression fixed again hides, and "no change" is only honest once no run of this many
    # commits is left unprobed. Short bumps of width >= 3: both changes found in 83 % of 500
    # histories where 20 % were; a search that located a change is the same search (BENCHMARKS.md).
    # None: no such scan.
    quiet_scan: int | None = 3
    # Where starts vary and a gap down to one commit is still short of the confidence with both of its
    # commits at their cap of starts: one more start at the least-started commit of the two segments
    # around it, while those segments hold fewer than this many times the two commits' own starts
    # (0: never). What is left there is often a dispersion at which one segment, its rate varying
    # wildly between starts, explains both sides, and clean starts anywhere in the clean segment speak
    # against it: an ICC 0.35 step from 0 to 1.9 % ended at 0.982 with 96 starts a side (439 in all),
    # and at 0.9907 with 20 more (BENCHMARKS.md, "The unmet bars by cause"). Unbounded, three ICC
    # 0.2-0.4 searches it changed still missed their step after 2,200-2,500 starts (430-716 without
    # it): where that many starts around the gap have not settled it, more rarely do. At 3x it finds
    # 81 of 100 ICC 0.2-0.4 steps where 0 finds 79, and no search it changes runs past 825 starts;
    # 1,400 searches of 14 families where starts agree are the same (BENCHMARKS.md).
    capped_segment_starts: float = 3.0
    # Where a mode's search would end with a change in view, a stretch whose gaps each hold under
    # `explore` of another change, but together at least this much, with failures at both its ends:
    # its thinnest probe gets one more start of up to `spread_batch` samples. Probes split early are
    # thin (16-64 samples), and a 2-8x step among them hides as a little of a change in each gap:
    # three changes in one mode were found 71.2 % of the time and are 75.7 % with this, at 1.03x the
    # GPU-seconds per change found in single steps (300 histories a family, BENCHMARKS.md).
    spread_explore: float = 0.1
    spread_batch: int = 256
    # Where a mode's search would end, a stretch of up to `odd_len` neighbouring probes inside one
    # segment whose pooled count the rest of the segment makes less likely than `odd_level` (either
    # binomial tail, starts weighed by the learned dispersion): one more start at its thinnest probe.
    # A bump or dip between split probes shows as a few thin probes a little off their segment's
    # rate, which the prior of one change per range leaves at a few percent, spread over the gaps
    # around it: three changes in one mode were found 75.7 % of the time and are 77.6 % with this,
    # at 1.02x single steps' mean GPU-seconds (300 histories a family, BENCHMARKS.md). None: off.
    odd_level: float | None = 0.001
    odd_len: int = 6
    drift: bool = True  # flag a rate that drifts instead of stepping (`sweeper.bisect.drift`)
    min_rate: float = 0.01  # rates below this are below the search's resolution
    explore: float = 0.05  # a gap this likely to hold a change is searched
    endpoint_starts: int = 2
    # Clean server starts at `bad` before it "passes" (at most `max_starts_per_commit`). The clean
    # samples are the same either way; spread over 6 starts rather than 2, a rate of 4 % varying
    # between starts with ICC 0.1, or of 8 % with ICC 0.2, shows at 99 % (over 2: at 89 % and 92 %;
    # a steady 1 % at 99 % both ways). One start can draw a rate near 0 where the mean is 5 %.
    pass_starts: int = 6
    prior: Prior | None = None  # None: Prior.default()
    robust_dispersion: bool = True


@dataclass(frozen=True)
class ProbeRequest:
    """Start a server at `commit` and replay about `samples` requests. `value`: what the search
    expects to learn from it, summed over its modes (a driver serving several searches at once
    merges requests by commit and runs the most valuable)."""

    commit: str
    index: int
    samples: int
    value: float = 0.0


@dataclass(frozen=True)
class Observation:
    """One recorded probe: what a resumed search replays. `skip_reason` marks it untestable."""

    commit: str
    samples: int = 0
    failures: Mapping[str, int] = field(default_factory=dict)
    skip_reason: str | None = None
    round: int = 0


@dataclass(frozen=True)
class Change:
    """The rate of `mode` changes at `commit` (the first commit with the new rate), or somewhere
    in `candidates` when not `located`. `confidence` = P(a change inside the candidates)."""

    mode: str
    direction: Direction
    commit: str
    candidates: tuple[str, ...]
    confidence: float
    located: bool
    before: Rate  # the segment of probed commits right before the change
    after: Rate
    last_before: str  # the nearest probed commit before the candidates
    found: bool  # located, at the search's confidence


@dataclass(frozen=True)
class DriftReport:
    """The rate of `mode` drifts from about `rate_from` at `first` to about `rate_to` at `last`
    (the probed commits that bound the ramp) instead of changing at one commit."""

    mode: str
    first: str
    last: str
    rate_from: float
    rate_to: float
    steps: int  # changes of the staircase it replaces


@dataclass(frozen=True)
class ModeReport:
    mode: str
    changes: tuple[Change, ...]
    at_good: Rate
    at_bad: Rate
    no_change: float  # P(the rate never changes in the range)
    rho: float  # learned per-start intra-class correlation
    fails_at_bad: bool  # credibly: the segment at `bad` has a rate above 0
    fails_at_good: bool
    gaps: tuple[tuple[int, int, float], ...] = ()  # (probed index, next probed index, P(change between))
    # (failures, samples) seen at good and at bad themselves: at_good and at_bad are the segments the
    # model pools them into, one and the same when it finds no change.
    observed: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    # Ranges where the rate drifts rather than steps; the staircase of changes inside them is not
    # in `changes`.
    drifts: tuple[DriftReport, ...] = ()
    # Decided: P(no change) reached the confidence, or every change is found (located at it).
    decided: bool = True
    to_decide_samples: int = 0  # an estimate of the samples still needed to decide, when not

    def change_density(self, n_commits: int) -> list[float]:
        """P(the rate changes at commit j) for every j: each gap's probability spread evenly over
        its commits, as the model's prior places a change within a gap."""
        out = [0.0] * n_commits
        for lo, hi, p in self.gaps:
            for j in range(lo + 1, hi + 1):
                out[j] += p / (hi - lo)
        return out

    @property
    def started(self) -> Change | None:
        """The regression that brought the rate seen at `bad` (the last regression), if any."""
        regressions = [c for c in self.changes if c.direction is Direction.REGRESSION]
        return regressions[-1] if regressions else None


@dataclass(frozen=True)
class BisectReport:
    modes: tuple[ModeReport, ...]
    bad_endpoint: BadEndpoint
    confidence: float
    done: bool  # False: stopped at a limit with something still open
    open_gaps: int
    rounds: int
    probes: int
    samples: int
    skipped: tuple[tuple[str, str], ...]
    gpu_s: float = 0.0  # modelled GPU-seconds of the probes (SearchOptions.start_s, request_s)
    to_decide_s: float = 0.0  # an estimate of the GPU-seconds still needed to decide every mode
    # The most testable commits in a row between two probed ones (a bump that wide could hide
    # there), and the scan asked for (`SearchOptions.bump_width`).
    widest_unprobed: int = 0
    bump_width: int | None = None
    # Without a scan: what one at QUOTED_SCAN_WIDTH would add now, (width, server starts, modelled
    # GPU-seconds), before anything its probes find asks for more. None with a scan.
    scan_quote: tuple[int, int, float] | None = None
    # The scan made before reporting no change (`SearchOptions.quiet_scan`), None when off.
    quiet_scan: int | None = None
    # The changes per range the prior expects (`Prior.expected_changes`; `sweep bisect --expect-changes`).
    expected_changes: float = 1.0

    @property
    def undecided(self) -> tuple[ModeReport, ...]:
        return tuple(m for m in self.modes if not m.decided)

    @property
    def changes(self) -> tuple[Change, ...]:
        return tuple(c for m in self.modes for c in m.changes)

    @property
    def failing_at_bad(self) -> tuple[ModeReport, ...]:
        return tuple(m for m in self.modes if m.fails_at_bad)


@dataclass(frozen=True)
class _Need:
    value: float
    commits: tuple[int, ...]  # a gap's untested commits (split), or the one commit to probe
    samples: int
    split: bool = False


@dataclass
class _Probe:
    index: int
    samples: int
    failures: dict[str, int]


class Search:
    """Ask/tell search for every change of every failure mode. See the module docstring."""

    def __init__(self, commits: Sequence[str], options: SearchOptions | None = None, *,
                 observations: Iterable[Observation] = (), rounds: int = 0) -> None:
        """A search over `commits` (good first, bad last) that has already been told `observations`
        and asked `rounds` rounds (or as many as the observations name, if more)."""
        o = options or SearchOptions()
        if len(commits) < 2:
            raise BisectError(f"need a good and a bad commit, got {len(commits)} commit(s)")
        if len(set(commits)) != len(commits):
            raise BisectError("candidate commits are not distinct")
        if not 0.5 < o.confidence < 1:
            raise BisectError(f"confidence must be in (0.5, 1), got {o.confidence}")
        if o.bump_width is not None and o.bump_width < 1:
            raise BisectError(f"bump_width must be a number of commits >= 1, got {o.bump_width}")
        if o.quiet_scan is not None and o.quiet_scan < 1:
            raise BisectError(f"quiet_scan must be a number of commits >= 1, got {o.quiet_scan}")
        self.commits = tuple(commits)
        self.options = o
        self.confidence = o.confidence
        self.max_samples, self.max_rounds = o.max_samples, o.max_rounds
        self.max_starts, self.max_commit_samples = o.max_starts_per_commit, o.max_samples_per_commit
        self.max_starts_varying = max(o.max_starts_per_commit, o.max_starts_varying)
        self.first_batch, self.min_batch, self.max_batch = o.first_batch, o.min_batch, o.max_batch
        self.min_rate, self.explore, self.endpoint_starts = o.min_rate, o.explore, o.endpoint_starts
        self.pass_starts = max(1, min(o.pass_starts, o.max_starts_per_commit))
        self.prior = o.prior or Prior.default()
        self.robust_dispersion = o.robust_dispersion
        self._drift_cache: dict[str, list[Drift]] = {}
        self._index = {c: i for i, c in enumerate(self.commits)}
        self._probes: list[_Probe] = []
        # Per commit index: server starts and samples so far (asked for in every planning loop).
        self._n_starts: Counter[int] = Counter()
        self._n_samples: Counter[int] = Counter()
        self._skipped: dict[int, str] = {}
        self._in_flight: set[int] = set()
        self._observations: list[Observation] = []
        self._modes: list[str] = []
        self._cache: dict[str, ModePosterior] = {}
        self._fails_cache: dict[str, Counter[int]] = {}
        self.rounds = rounds
        for obs in observations:
            if obs.commit in self._index:
                self._observe(obs)

    @property
    def observations(self) -> tuple[Observation, ...]:
        """Everything told so far, each with the round it was told in: what a resumed search is built from."""
        return tuple(self._observations)

    # ---- tell --------------------------------------------------------------------------

    def tell(self, commit: str, samples: int, failures: Mapping[str, int]) -> None:
        """One server start at `commit`: `samples` requests, `failures[mode]` of them in each mode
        (a sample is in at most one mode; modes not named had no failure)."""
        self._tell(commit, samples, failures, self.rounds)

    def tell_skip(self, commit: str, reason: str) -> None:
        """`commit` cannot be tested (not installed, a server that would not start for a reason
        naming none of the cell's settings, a hang)."""
        self._tell_skip(commit, reason, self.rounds)

    def _observe(self, obs: Observation) -> None:
        # A replayed observation keeps its round, so a resumed search's observations are the old ones.
        self.rounds = max(self.rounds, obs.round)
        if obs.skip_reason is not None:
            self._tell_skip(obs.commit, obs.skip_reason, obs.round)
        else:
            self._tell(obs.commit, obs.samples, obs.failures, obs.round)

    def _tell(self, commit: str, samples: int, failures: Mapping[str, int], round_no: int) -> None:
        i = self._lookup(commit)
        if i in self._skipped:
            raise BisectError(f"{commit} was recorded as untestable")
        fails = {str(m): int(k) for m, k in failures.items() if int(k) != 0}
        if samples < 0 or any(k < 0 for k in fails.values()) or sum(fails.values()) > samples:
            raise BisectError(f"{commit}: need 0 <= failures, sum <= samples; got {fails} of {samples}")
        for mode in fails:
            if mode not in self._modes:
                self._modes.append(mode)
        self._in_flight.discard(i)
        if samples == 0:
            return
        self._probes.append(_Probe(i, samples, fails))
        self._n_starts[i] += 1
        self._n_samples[i] += samples
        self._observations.append(Observation(commit, samples, dict(fails), None, round_no))
        self._cache.clear()
        self._fails_cache.clear()
        self._drift_cache.clear()

    def _tell_skip(self, commit: str, reason: str, round_no: int) -> None:
        i = self._lookup(commit)
        self._in_flight.discard(i)
        if i in self._skipped:
            return
        self._skipped[i] = reason
        # Samples of a commit that later proves untestable stay: they are real observations.
        self._observations.append(Observation(commit, 0, {}, reason, round_no))
        self._cache.clear()
        self._drift_cache.clear()

    def _lookup(self, commit: str) -> int:
        try:
            return self._index[commit]
        except KeyError:
            raise BisectError(f"{commit} is not one of the {len(self.commits)} candidates") from None

    # ---- state -------------------------------------------------------------------------

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self._modes)

    @property
    def total_samples(self) -> int:
        return sum(p.samples for p in self._probes)

    @property
    def gpu_s(self) -> float:
        """Modelled GPU-seconds of every probe told: its server start and its requests."""
        o = self.options
        return o.start_s * len(self._probes) + o.request_s * self.total_samples

    def _starts(self, i: int) -> int:
        return self._n_starts[i]

    def _samples_at(self, i: int) -> int:
        return self._n_samples[i]

    def _failures_at(self, mode: str) -> Counter[int]:
        """Per commit index, the failures of `mode` over all its starts."""
        if mode not in self._fails_cache:
            counts: Counter[int] = Counter()
            for p in self._probes:
                counts[p.index] += p.failures.get(mode, 0)
            self._fails_cache[mode] = counts
        return self._fails_cache[mode]

    def mode_posterior(self, mode: str) -> ModePosterior:
        if mode not in self._cache:
            starts = [Start(p.index, p.failures.get(mode, 0), p.samples) for p in self._probes]
            self._cache[mode] = posterior(starts, len(self.commits) - 1, self.prior)
        return self._cache[mode]

    def _limits_reached(self) -> bool:
        return ((self.max_rounds is not None and self.rounds >= self.max_rounds)
                or (self.max_samples is not None and self.total_samples >= self.max_samples)
                or (self.options.max_gpu_s is not None and self.gpu_s >= self.options.max_gpu_s))

    def _start_cap(self) -> int:
        """Server starts one commit may get. When some mode's rate varies between starts, each start
        is one draw of that rate: only more starts (not more samples per start) narrow it, so such a
        search may start a commit twice as often."""
        if any(self.mode_posterior(m).rho > RHO_VARIES for m in self._modes):
            return self.max_starts_varying
        return self.max_starts

    def _probeable(self, i: int, cap: int | None = None) -> bool:
        return (i not in self._skipped and self._starts(i) < (cap or self._start_cap())
                and self._samples_at(i) < self.max_commit_samples)

    def bad_endpoint(self) -> BadEndpoint:
        last = len(self.commits) - 1
        if last in self._skipped and self._samples_at(last) == 0:
            return BadEndpoint.UNTESTABLE
        at_bad = [p for p in self._probes if p.index == last]
        if any(p.failures for p in at_bad):
            return BadEndpoint.FAILS
        # Prior-free: with no failure in n >= log(1 - c) / log(1 - min_rate) samples, a rate of
        # min_rate or more would have shown one with probability c (a one-sided exact bound), if
        # every start fails alike; `pass_starts` of them bound a rate that varies between starts.
        if sum(p.samples for p in at_bad) >= self._clean_needed() and len(at_bad) >= self.pass_starts:
            return BadEndpoint.PASSES
        return BadEndpoint.UNDECIDED

    def _clean_needed(self) -> int:
        return math.ceil(math.log(1 - self.confidence) / math.log1p(-self.min_rate))

    # ---- ask ---------------------------------------------------------------------------

    def _needs(self) -> list[_Need]:
        """What the open searches want now. See the module docstring."""
        needs: list[_Need] = []
        last = len(self.commits) - 1
        for i in (0, last):
            if self._starts(i) < self.endpoint_starts and self._probeable(i):
                needs.append(_Need(10.0, (i,), self.first_batch))
        if needs:
            # Slots the endpoints leave free in the first rounds split the range blind: cheap
            # there, and half the bisection is done if the endpoints differ.
            interior = tuple(j for j in range(1, last) if j not in self._skipped)
            if interior and all(self._starts(j) == 0 for j in interior):
                needs.append(_Need(0.5, interior, self.first_batch, split=True))
            if any(self._starts(i) == 0 for i in (0, last)):
                return needs
        if self.bad_endpoint() is BadEndpoint.UNDECIDED and self._probeable(last):
            # The clean samples still missing, shared among the starts still missing: enough to
            # say "passes" if these come back clean too.
            left = max(1, self.pass_starts - self._starts(last))
            n = math.ceil(max(0, self._clean_needed() - self._samples_at(last)) / left)
            needs.append(_Need(1.0, (last,), max(self.min_batch, n)))
        for mode in self._modes:
            self._mode_needs(mode, needs)
        if self.options.bump_width:
            self._scan_needs(needs, self.options.bump_width)
        elif self.options.quiet_scan and not needs and not self._in_view():
            self._scan_needs(needs, self.options.quiet_scan)
        return needs

    def _in_view(self) -> bool:
        """Some mode has a change more likely than not: the search has something to report."""
        return any(p > 0.5 for m in self._modes for p in self.mode_posterior(m).gap_change)

    def _scan_needs(self, needs: list[_Need], width: int) -> None:
        """`bump_width`: split every gap between probed commits that holds `width` or more testable
        commits, mode or no mode (a bump from a clean rate shows no mode at either end). A probe is
        sized to see three times each mode's rate around it, as a bump need is."""
        for lo, inside in self._unprobed_runs():
            if len(inside) >= width:
                needs.append(_Need(self.options.bump_explore, _scan_grid(inside, width), self._scan_batch(lo),
                                   split=True))

    def _scan_batch(self, lo: int) -> int:
        """Samples for a scan's probe in the gap above `lo`: three times each mode's rate there."""
        n = self.first_batch
        for mode in self._modes:
            post = self.mode_posterior(mode)
            n = max(n, self._bump_batch(post.segment_at(lo).rate, post.rho))
        return n

    def _bump_batch(self, r: float, rho: float) -> int:
        """Samples to see a bump of three times the rate `r` around it (and `min_rate` over a clean one)."""
        return self._batch(r, 3 * r + self.min_rate, rho)

    def _scan_quote(self, width: int) -> tuple[int, int, float]:
        """The probes a scan at `width` would add to those made: a gap of g testable commits needs
        g // width of them before no run of `width` is left unprobed."""
        starts, gpu_s = 0, 0.0
        for lo, inside in self._unprobed_runs():
            k = len(_scan_grid(inside, width))
            if k:
                starts += k
                gpu_s += k * (self.options.start_s + self._scan_batch(lo) * self.options.request_s)
        return width, starts, gpu_s

    def widest_unprobed(self) -> int:
        """The most testable commits in a row with no probe between two probed ones: the widest
        regression fixed again inside the range that the probes could have missed entirely."""
        return max((len(inside) for _, inside in self._unprobed_runs()), default=0)

    def _unprobed_runs(self) -> list[tuple[int, tuple[int, ...]]]:
        """Per gap between neighbouring probed commits: its lower end and the testable commits inside."""
        probed = sorted(i for i in self._n_starts if self._n_starts[i])
        return [(lo, tuple(j for j in range(lo + 1, hi) if j not in self._skipped)) for lo, hi in pairwise(probed)]

    def _mode_needs(self, mode: str, needs: list[_Need]) -> None:
        post = self.mode_posterior(mode)
        last = len(self.commits) - 1
        if self._below_resolution(mode, post):
            return  # below the search's resolution everywhere: reported, not searched
        pts = post.points
        before = len(needs)
        # Where a gap's sides look alike, plan for the largest contrast this mode has shown.
        seg_rates = [seg.rate for seg in post.segments]
        contrast = (min(seg_rates), max(seg_rates))
        in_drift = {a for d in self.drifts(mode) for a in range(pts.index(d.first), pts.index(d.last))}
        likely = {a for a, p in enumerate(post.gap_change) if p > 0.5}
        varies = post.rho > RHO_VARIES
        for a, p in enumerate(post.gap_change):
            if a in in_drift:
                continue  # a drift has no commit to locate
            lo, hi = pts[a], pts[a + 1]
            inside = tuple(j for j in range(lo + 1, hi) if j not in self._skipped)
            seg_lo, seg_hi = post.segment_at(lo), post.segment_at(hi)
            r_lo, r_hi = sorted((seg_lo.rate, seg_hi.rate))
            if r_hi < 1.5 * r_lo + 0.01:
                r_lo, r_hi = contrast
            n = self._batch(r_lo, r_hi, post.rho)
            # Where starts vary, a gap not beside a likely change is left under `explore`, as one
            # with commits inside is not split: odd starts leave 1-5 % on most gaps of a segment
            # probed commit by commit, and driving each under 1 - confidence walked an ICC 0.26
            # step from c66 down to c44 at 15-48 starts a commit (780 starts; 517 with this, still
            # unclaimed). A located change's neighbours, its alternatives, are still settled: left
            # at 1-5 %, two claims at ICC 0.35-0.37 of 100 were a commit or more off. Where starts
            # agree, a gap's last percent is thin counts, and settling it finds secondary changes:
            # without it, three changes in one mode were found in 77.7 % of cases, not 78.5 %.
            doubt_floor = self.explore if varies and not {a - 1, a + 1} & likely else 1 - self.confidence
            if inside:
                if p >= self.explore:
                    needs.append(_Need(float(p), inside, n, split=True))
                elif (bump := self._bump_probability(hi - lo)) >= self.options.bump_explore and seg_lo is seg_hi:
                    # Both ends share a rate, but a rise and its fix may sit between them: worth a
                    # look in proportion to the prior's mass on two changes inside, sized to see
                    # a bump of three times the rate around it.
                    needs.append(_Need(bump, inside, self._bump_batch(seg_lo.rate, post.rho), split=True))
            elif doubt_floor < p < self.confidence and max(
                    seg_lo.high, seg_hi.high, self._point_high(mode, lo), self._point_high(mode, hi)) >= self.min_rate \
                    and self._may_differ(mode, lo, hi):
                # (Both sides credibly below min_rate, by their segments and by their own counts: a
                # change between them is below resolution. The segments alone pool a bump's few
                # failing commits into the clean rate around it until it is cut, and it is not cut
                # while this gap is in doubt.)
                # The question is whether these two commits differ: a start planned for the contrast
                # their own counts show, not the mode's largest (a mode that also steps 25x elsewhere got
                # starts of 16 samples here, and reached its cap of starts with the gap still at P 0.4).
                # At least 2x: a smaller step adds starts instead; planned for 1.3x, the ramp of a drift
                # cost 40 % more GPU time, its neighbouring commits a few percent apart.
                r_lo, r_hi = sorted((self._point_rate(mode, lo), self._point_rate(mode, hi)))
                self._resample(needs, lo, hi, 2 * min(float(p), 1 - float(p)),
                               self._batch(r_lo, max(r_hi, 2 * r_lo), post.rho),
                               cap=max(self._start_cap(), self.options.max_starts_in_doubt),
                               segments=post if varies else None)
            elif p >= self.confidence and not self._two_starts_each(lo, hi, post.rho):
                self._resample(needs, lo, hi, 0.5, n, by_starts=True)
            elif p >= self.confidence and not self._sure_at_any_dispersion(post, a):
                # Sure only if starts vary little: more starts on each side tell a change
                # from a few odd starts. The data leave a varying rate credible, so the sides may
                # have the starts of one (a commit of six starts stopped a step at 0.96 for good).
                self._resample(needs, lo, hi, 2 * (1 - float(post.gap_change_low[a])), n, by_starts=True,
                               cap=self.max_starts_varying, segments=post if varies else None)
        in_view = any(p > 0.5 for p in post.gap_change)
        if len(needs) == before and in_view:
            self._spread_needs(mode, post, in_drift, needs)
        if len(needs) == before:
            self._odd_stretch_needs(mode, post, in_drift, needs)
        asked = len(needs) > before or in_view
        if not asked and 1 - self.confidence < post.no_change < self.confidence:
            # Some change may be there but spread over every gap: only more samples at the ends
            # can tell a small change from none. The search stops on evidence (P(no change)
            # reaching the confidence, or P(change) reaching it and the change found), not
            # when a change merely looks unlikely.
            value, n = min(1 - post.no_change, post.no_change), self._batch(*contrast, post.rho)
            if (odd := self._odd_start(mode, post)) is not None:
                # One start at one commit far off the rest: an odd start (which a rate varying between
                # starts explains) or a bump one commit wide. A second start there tells which; the
                # ends cannot (a scan's one-commit hit of 9/64 among clean commits drew 74 starts at
                # the ends and was left at P(no change) 0.77).
                r = self._point_rate(mode, odd)
                needs.append(_Need(value, (odd,), self._batch(r, post.segment_at(odd).rate, post.rho)))
            elif any(self._probeable(x) for x in (0, last)):
                self._resample(needs, 0, last, value, n)
            elif (open_points := [x for x in pts if self._probeable(x)]) and (
                    sum(self._samples_at(x) for x in pts if x not in (0, last))
                    < self._samples_at(0) + self._samples_at(last)):
                # The ends have had all the starts they may: any probed commit's samples count too,
                # until the commits between hold more samples than the ends. Past that, what is still
                # open is how an end compares with the rest, and only the capped end could tell: the
                # mode is left undecided with its cost, not sampled without end (a 1.4x step at c1,
                # c0 alone on the old rate, took 180 starts that way).
                needs.append(_Need(value, (min(open_points, key=lambda x: (self._samples_at(x), x)),), n))

    def _spread_needs(self, mode: str, post: ModePosterior, in_drift: set[int], needs: list[_Need]) -> None:
        """Where a mode's search would end with a change in view, a stretch of gaps (none in a drift)
        that each hold under `explore` of another but together `spread_explore` or more, with
        failures at both its ends: one more start at the stretch's thinnest probe, worth the
        stretch's probability. (Asked only at the end: while the mode wants anything else, a stretch
        beside a change still being narrowed holds P that the narrowing takes back.)

        A split probe of 16-64 samples at a rate of a few percent is as likely clean as not, so a
        step among such probes shows as a little of a change in each gap, none worth a split, and
        the search ended with the step unfound. Only a probe with fewer samples than `spread_batch`
        (or the Wald count for a 2x step, if smaller) gets one, so a stretch costs about a start per
        probe at most. A stretch clean at an end is left to the bump rules: where the searches of 60
        histories each of a single step, three changes and a rise and fix ended, 1 of 66 such
        stretches (holding 0.1 or more) held a change, against 15 of 31 failing at both ends
        (BENCHMARKS.md)."""
        pts, counts = post.points, self._failures_at(mode)
        run: list[int] = []
        for a, p in enumerate([*post.gap_change, 1.0]):
            if a < len(post.gap_change) and p < self.explore and a not in in_drift:
                run.append(a)
                continue
            total = sum(float(post.gap_change[b]) for b in run)
            if run and total >= self.options.spread_explore:
                span = pts[run[0]:run[-1] + 2]
                # (Ends whose own counts leave no `min_contrast` step between them hold no one change:
                # a bump has two, and the bump rules look for those.)
                if counts[span[0]] and counts[span[-1]] and self._may_differ(mode, span[0], span[-1]):
                    rates = (post.segment_at(span[0]).rate, post.segment_at(span[-1]).rate)
                    self._deepen(needs, span, rates, post.rho, total)
            run = []

    def _deepen(self, needs: list[_Need], points: Sequence[int], rates: tuple[float, float], rho: float,
                value: float) -> bool:
        """One more start at the thinnest probeable one of `points`, sized to tell the two rates apart
        as if at least 2x (up to `spread_batch` samples), if any has fewer samples than that."""
        lo, hi = sorted(rates)
        n = min(self.options.spread_batch, self._batch(lo, max(hi, 2 * lo), rho))
        thin = [x for x in points if self._probeable(x) and self._samples_at(x) < n]
        if thin:
            needs.append(_Need(value, (min(thin, key=lambda x: (self._samples_at(x), x)),), n))
        return bool(thin)

    def _odd_stretch_needs(self, mode: str, post: ModePosterior, in_drift: set[int], needs: list[_Need]) -> None:
        """`odd_level`: the stretches of up to `odd_len` neighbouring probes inside one segment (with
        two or more of its probes outside them) whose pooled count the rest of the segment makes
        least likely, either binomial tail under `odd_level`; the first with a probe thinner than
        `spread_batch` (or the Wald count for a 2x step, if smaller) gets one more start there.

        A dip from 4.1 % to 0.9 % over c51..c59 among probes of 64-233 samples left c53 at 1 of 127
        and c58 at 2 of 127, in a segment at 4.4 %: no gap near it held more than 0.024 of a change,
        and the search ended. The rest of the segment (4.9 %) makes 3 of 254 a 0.0013 event, and 4 of
        318 with c63 a 0.0003 one; a deeper start there shows the dip or clears it. The counts are
        shrunk by the design effect of the learned dispersion, so where starts vary an odd start is
        what it is (38 of an ICC 0.2-0.4 step's 40 searches were unchanged)."""
        level = self.options.odd_level
        if level is None:
            return
        pts, counts = post.points, self._failures_at(mode)
        # Running sums over the points: a stretch's counts are two differences.
        k_sum = [0, *accumulate(counts[x] for x in pts)]
        n_sum = [0, *accumulate(self._samples_at(x) for x in pts)]
        s_sum = [0, *accumulate(self._starts(x) for x in pts)]
        stretches: list[tuple[tuple[int, ...], float, float]] = []
        shrunk: list[tuple[int, int]] = []
        for seg in post.segments:
            first, last = pts.index(seg.first), pts.index(seg.last) + 1  # the segment's points: [first, last)
            k_all, n_all = k_sum[last] - k_sum[first], n_sum[last] - n_sum[first]
            for m in range(1, min(self.options.odd_len, last - first - 2) + 1):
                for a in range(first, last - m + 1):
                    if any(b in in_drift for b in range(a - 1, a + m)):
                        continue  # a drift's probes are off its segments' rates by nature
                    k, n = k_sum[a + m] - k_sum[a], n_sum[a + m] - n_sum[a]
                    deff = 1 + max(0.0, n / (s_sum[a + m] - s_sum[a]) - 1) * post.rho
                    stretches.append((pts[a:a + m], (k_all - k + 0.5) / (n_all - n + 1.0), (k + 0.5) / (n + 1.0)))
                    shrunk.append((round(k / deff), max(1, round(n / deff))))
        if not stretches:
            return
        # Both tails of every stretch in one call: a call a stretch was most of a varying-rate search.
        ke, ne = np.array(shrunk).T
        rest_all = np.array([rest for _, rest, _ in stretches])
        tails = np.minimum(binom.sf(ke - 1, ne, rest_all), binom.cdf(ke, ne, rest_all))
        odd = [(float(tail), *stretch) for tail, stretch in zip(tails, stretches, strict=True) if tail < level]
        for _, stretch, rest, rate in sorted(odd):
            if self._deepen(needs, stretch, (rest, rate), post.rho, self.explore):
                return

    def _below_resolution(self, mode: str, post: ModePosterior) -> bool:
        """Credibly below `min_rate` everywhere: every segment and both endpoints by their own counts
        (a pooled segment hides an end that fails more, when the model has not yet seen it change),
        and no commit credibly above it by its own."""
        if max(seg.high for seg in post.segments) >= self.min_rate:
            return False
        counts = self._failures_at(mode)
        for i in (post.points[0], post.points[-1]):
            if wilson(counts[i], self._samples_at(i))[1] >= self.min_rate:
                return False
        # Nor where one commit's own counts are credibly above it: a bump a few commits wide, pooled
        # into a clean segment until the model cuts it out (6 of 64 among 20,000 clean samples).
        return all(wilson(counts[i], self._samples_at(i))[0] < self.min_rate for i in post.points)

    def _odd_start(self, mode: str, post: ModePosterior) -> int | None:
        """The commit of one start whose count the mode's other samples make least likely (either
        binomial tail, at their pooled rate), if under 1 - confidence; None if there is none."""
        counts = self._failures_at(mode)
        k_all, n_all = sum(counts.values()), self.total_samples
        best: tuple[float, int] | None = None
        for i in post.points:
            if self._starts(i) != 1 or not self._probeable(i):
                continue
            k, n = counts[i], self._samples_at(i)
            r = (k_all - k + 0.5) / (n_all - n + 1.0)
            tail = min(float(binom.sf(k - 1, n, r)), float(binom.cdf(k, n, r)))
            if tail < 1 - self.confidence and (best is None or tail < best[0]):
                best = (tail, i)
        return None if best is None else best[1]

    def _may_differ(self, mode: str, lo: int, hi: int) -> bool:
        """Whether the two commits' own counts leave a step of `min_contrast` in the failure rate
        credible (95 % bounds). Two commits known to fail within less of each other have no change
        between them that the search is after. (The posterior's resolution is in odds, and near a
        rate of 1 odds are fine-grained: two commits of one crash, 99.0 % and 99.1 %, held the gap at
        P 0.02 through 24 starts a side.)"""
        counts = self._failures_at(mode)
        (a_lo, a_hi), (b_lo, b_hi) = (wilson(counts[i], self._samples_at(i)) for i in (lo, hi))
        tiny = 1e-12
        return max(a_hi / max(b_lo, tiny), b_hi / max(a_lo, tiny)) >= self.options.min_contrast

    def _point_high(self, mode: str, i: int) -> float:
        """The 95 % upper bound of the rate commit i's own samples show for `mode`, if it failed there
        (0 if not: two clean commits have no change between them the search could locate)."""
        k = self._failures_at(mode)[i]
        return wilson(k, self._samples_at(i))[1] if k else 0.0

    def _point_rate(self, mode: str, i: int) -> float:
        """The rate commit i's own samples show for `mode`, pulled off 0 by half a failure."""
        k = self._failures_at(mode)[i]
        return (k + 0.5) / (self._samples_at(i) + 1.0)

    def _bump_probability(self, gap: int) -> float:
        """The prior's probability of two or more changes among `gap` commits."""
        pi = self.prior.change_probability(len(self.commits) - 1)
        return float(1 - (1 - pi) ** gap - gap * pi * (1 - pi) ** (gap - 1))

    def drifts(self, mode: str) -> list[Drift]:
        """Runs of same-direction changes of `mode` that a ramp fits as well (`sweeper.bisect.drift`)."""
        if not self.options.drift:
            return []
        if mode not in self._drift_cache:
            post = self.mode_posterior(mode)
            pts = post.points
            found: list[Drift] = []
            changes = [(a, self._rises(post, a)) for a in self._drift_candidates(post)]
            # A lone change narrowed to neighbouring commits, one of them capped, and still short
            # of the confidence: the search can do no more there, and a ramp may be why.
            lone = frozenset(a for a, _ in changes if post.gap_change[a] < self.confidence
                             and all(j in self._skipped for j in range(pts[a] + 1, pts[a + 1]))
                             and not (self._probeable(pts[a]) and self._probeable(pts[a + 1])))
            if len(changes) >= 2 or lone:
                counts = [PointCounts(i, self._failures_at(mode)[i],
                                      self._samples_at(i)) for i in pts]
                per_start = self.total_samples / max(1, len(self._probes))
                found = find_drifts(counts, changes, design_effect=1 + max(0.0, per_start - 1) * post.rho,
                                    lone=lone)
            self._drift_cache[mode] = found
        return self._drift_cache[mode]

    @staticmethod
    def _rises(post: ModePosterior, a: int) -> bool:
        return post.segment_at(post.points[a + 1]).rate > post.segment_at(post.points[a]).rate

    @staticmethod
    def _drift_candidates(post: ModePosterior) -> list[int]:
        """The gaps the drift check weighs as changes: each more likely than not to hold one, and in a
        run of neighbouring gaps that together hold one or more changes but none of them more likely
        than not (a rate stepping a little at every gap), the likeliest of the run."""
        out = [a for a, p in enumerate(post.gap_change) if p > 0.5]
        run: list[int] = []
        for a, p in enumerate([*post.gap_change, 0.0]):
            if SPREAD_FLOOR <= p <= 0.5 and a < len(post.gap_change):
                run.append(a)
                continue
            # (A run next to a likely change is that change's own spread, not a drift of its own.)
            beside = any(b + 1 in out or b - 1 in out for b in run)
            if run and not beside and sum(float(post.gap_change[b]) for b in run) >= 1.0:
                out.append(max(run, key=lambda b: float(post.gap_change[b])))
            run = []
        return sorted(out)

    def _sure_at_any_dispersion(self, post: ModePosterior, gap: int) -> bool:
        return not self.robust_dispersion or float(post.gap_change_low[gap]) >= self.confidence

    def _two_starts_each(self, lo: int, hi: int, rho: float) -> bool:
        """One start per side can be one odd start, and a dispersion learned as low from a few
        starts may not be: a located change is settled only with two on each side, whatever rho."""
        return min(self._starts(lo), self._starts(hi)) >= 2

    def _resample(self, needs: list[_Need], lo: int, hi: int, value: float, n: int, *,
                  by_starts: bool = False, cap: int | None = None, segments: ModePosterior | None = None) -> None:
        """One more start at the side of the gap lo..hi with fewer starts (or samples), under `cap`.
        With `segments` and `capped_segment_starts`, where both sides are at the cap: at the
        least-started commit of the two segments around the gap instead (the nearer one first), while
        those segments hold under `capped_segment_starts` times the two commits' own starts."""
        sides = sorted((x for x in (lo, hi) if self._probeable(x, cap)),
                       key=lambda x: ((self._starts(x),) if by_starts else ()) + (self._samples_at(x), x))
        if not sides and segments is not None and self.options.capped_segment_starts:
            first, last = segments.segment_at(lo).first, segments.segment_at(hi).last
            around = [x for x in segments.points if first <= x <= last and x not in (lo, hi)]
            bound = self.options.capped_segment_starts * (self._starts(lo) + self._starts(hi))
            if sum(self._starts(x) for x in around) < bound:
                sides = sorted((x for x in around if self._probeable(x, cap)),
                               key=lambda x: (self._starts(x), min(abs(x - lo), abs(x - hi)), x))
        if sides:
            needs.append(_Need(value, (sides[0],), n))

    def _plan(self, k: int) -> dict[int, tuple[int, float]]:
        """Up to k distinct commits -> (samples, value): greedy over the needs, merged across modes.

        The t-th commit put into a gap is worth p * log2((t + 1) / t) (t evenly spaced commits
        split it in t + 1 parts); needs on the same gap from several modes add up, and so do
        needs that land on the same commit."""
        merged: dict[tuple[tuple[int, ...], bool], list[float]] = {}
        for need in self._needs():
            key = (tuple(j for j in need.commits if j not in self._in_flight), need.split)
            if not key[0]:
                continue
            value, n = merged.get(key, [0.0, 0.0])
            merged[key] = [value + need.value, max(n, need.samples)]
        slots = {key: 0 for key in merged}

        def placed() -> dict[int, tuple[int, float]]:
            chosen: dict[int, tuple[int, float]] = {}
            for (commits, split), t in slots.items():
                if not t:
                    continue
                at = ([commits[min(len(commits) - 1, s * len(commits) // (t + 1))] for s in range(1, t + 1)]
                      if split else list(commits)[:t])
                value, n = merged[(commits, split)]
                each = value * math.log2(t + 1) / t if split else value
                for j in at:
                    if j in chosen:
                        chosen[j] = (max(chosen[j][0], int(n)), chosen[j][1] + each)
                    elif len(chosen) < k:
                        chosen[j] = (int(n), each)
            return chosen

        while len(placed()) < k:
            gains = {}
            for key, t in slots.items():
                commits, split = key
                if t < (len(commits) if split else 1):
                    value = merged[key][0]
                    gains[key] = value * math.log2((t + 2) / (t + 1)) if split else value
            if not gains:
                break
            slots[max(gains, key=lambda key: (gains[key], -key[0][0]))] += 1
        return placed()

    def _batch(self, p_lo: float, p_hi: float, rho: float) -> int:
        """Samples for one start: the Wald count that tells the two rates apart (planning for at
        least `min_contrast`, the smallest change the search is after), as far as samples are
        the cheaper way to buy it."""
        lo, hi = sorted((p_lo, p_hi))
        hi = max(hi, self.options.min_contrast * lo, lo + self.min_rate / 4)
        need = self._wald(lo, hi)
        # Design effect: a start of n samples is worth n / (1 + (n - 1) rho) independent ones.
        if rho > 0:
            # GPU-seconds per independent sample, (start_s + n request_s) (1 + (n - 1) rho) / n,
            # are least at n = sqrt(start_s (1 - rho) / (request_s rho)): past it, another start
            # buys more than more samples on this one.
            o = self.options
            # A request stated free (`cost: {request_s: 0}`) makes samples the cheaper way, as far as
            # one start's draw of the rate allows.
            cheapest = math.sqrt(o.start_s * (1 - rho) / (o.request_s * rho)) if o.request_s > 0 else math.inf
            one_start = need * (1 - rho) / (1 - need * rho) if need * rho < 0.5 else math.inf
            best = min(one_start, cheapest)
            need = math.ceil(best) if math.isfinite(best) else self.max_batch
        return int(min(self.max_batch, max(self.min_batch, need)))

    def _wald(self, lo: float, hi: float) -> int:
        """Wald's expected samples to tell rate `lo` from `hi` (> lo) at the confidence; rates at
        or next to 1 are told apart by a handful."""
        hi = min(hi, 1 - 1e-6)
        if hi <= lo:
            return self.min_batch
        return samples_to_decide(lo, hi, self.confidence)

    @property
    def done(self) -> bool:
        return self._limits_reached() or not self._needs()

    def ask(self, k: int = 1) -> list[ProbeRequest]:
        """The next round: up to k probes on distinct commits not already in flight, each with its
        value. Asking counts a round; a request is answered by `tell` or `tell_skip`."""
        if k < 1:
            raise BisectError(f"k must be >= 1, got {k}")
        if self._limits_reached():
            return []
        reqs = [self._request(i, n, value) for i, (n, value) in sorted(self._plan(k).items())]
        if reqs:
            self.rounds += 1
            self._in_flight.update(r.index for r in reqs)
        return reqs

    def _request(self, i: int, n: int, value: float) -> ProbeRequest:
        room = self.max_commit_samples - self._samples_at(i)
        if self.max_samples is not None:
            room = min(room, max(1, self.max_samples - self.total_samples))
        return ProbeRequest(self.commits[i], i, max(1, min(n, room)), value)

    # ---- result ------------------------------------------------------------------------

    def result(self) -> BisectReport:
        modes = tuple(self._mode_report(m) for m in self._modes)
        needs = self._needs()
        probes = len(self._probes)
        o = self.options
        to_decide = sum(o.request_s * m.to_decide_samples
                        + o.start_s * math.ceil(m.to_decide_samples / max(1, self.max_batch)) for m in modes)
        return BisectReport(modes, self.bad_endpoint(), self.confidence, not needs, len(needs), self.rounds,
                            probes, self.total_samples,
                            tuple((self.commits[i], r) for i, r in sorted(self._skipped.items())),
                            self.gpu_s, float(to_decide), self.widest_unprobed(), o.bump_width,
                            None if o.bump_width else self._scan_quote(QUOTED_SCAN_WIDTH),
                            None if o.bump_width else o.quiet_scan, self.prior.expected_changes)

    def _mode_report(self, mode: str) -> ModeReport:
        post = self.mode_posterior(mode)
        pts = post.points
        drifts = self.drifts(mode)
        in_drift = {a for d in drifts for a in d.gaps}
        changes = []
        for a, p in enumerate(post.gap_change):
            if p <= 0.5 or a in in_drift:
                continue
            lo, hi = pts[a], pts[a + 1]
            before, after = post.segment_at(lo), post.segment_at(hi)
            inside = [j for j in range(lo + 1, hi) if j not in self._skipped]
            direction = Direction.REGRESSION if after.rate > before.rate else Direction.FIX
            # The confidence claimed holds at every dispersion the data leave credible.
            sure = min(float(p), float(post.gap_change_low[a])) if self.robust_dispersion else float(p)
            changes.append(Change(mode, direction, self.commits[hi], self.commits[lo + 1: hi + 1], sure,
                                  not inside, before, after, self.commits[lo],
                                  not inside and sure >= self.confidence
                                  and self._two_starts_each(lo, hi, post.rho)))
        good, bad = post.segments[0], post.segments[-1]
        fails_good = pts[0] == 0 and good.failures > 0 and good.low > 0
        fails_bad = pts[-1] == len(self.commits) - 1 and bad.failures > 0 and bad.low > 0
        gaps = tuple((pts[a], pts[a + 1], float(p)) for a, p in enumerate(post.gap_change))
        last = len(self.commits) - 1
        observed = tuple((self._failures_at(mode)[i], self._samples_at(i)) for i in (0, last))
        below = self._below_resolution(mode, post)
        settled = post.no_change >= self.confidence or (
            1 - post.no_change >= self.confidence and all(c.found for c in changes) and bool(changes or drifts))
        decided = below or settled
        drift_reports = tuple(DriftReport(mode, self.commits[d.first], self.commits[d.last], d.rate_from, d.rate_to,
                                          len(d.gaps)) for d in drifts)
        return ModeReport(mode, tuple(changes), good, bad, post.no_change, post.rho,
                          fails_bad, fails_good, gaps, (observed[0], observed[1]), drift_reports,
                          decided, 0 if decided else self._to_decide(post, changes))

    def _to_decide(self, post: ModePosterior, changes: Sequence[Change]) -> int:
        """A rough count of the samples still needed: Wald counts to tell the rates at either end of
        each unfound change apart, one bisection's worth of probes for its candidates; with no change
        in view, the samples at both ends that would tell the rate there from `min_contrast` times it."""
        open_changes = [c for c in changes if not c.found]
        if not open_changes:
            seg = post.segments[0]
            r = max(seg.rate, self.min_rate / 4)
            need = self._wald(r, r * self.options.min_contrast)
            have = min(self._samples_at(post.points[0]), self._samples_at(post.points[-1]))
            return int(2 * max(0, 4 * need - have))  # P(no change) needs several Wald counts of evidence
        total = 0
        for c in open_changes:
            lo, hi = sorted((c.before.rate, c.after.rate))
            per_probe = self._wald(lo, max(hi, lo * self.options.min_contrast))
            total += per_probe * (2 + math.ceil(math.log2(max(2, len(c.candidates)))))
        return int(total)
