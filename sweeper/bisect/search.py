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

How a round is chosen (`sweeper.bisect.rules`: each rule below is a free function of a read-only
view of the search, `sweeper.bisect.view`). Every mode names the commits it wants, each with a value:
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
takes the K most valuable distinct commits. Each probe asks for (`sweeper.bisect.sizing`) the Wald
sample count that tells
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
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sweeper.bisect import rules
from sweeper.bisect.drift import Drift
from sweeper.bisect.options import SearchOptions
from sweeper.bisect.rules import BadEndpoint, Need
from sweeper.bisect.segments import ModePosterior, Prior, Rate, Start, posterior
from sweeper.bisect.sizing import batch, wald
from sweeper.bisect.view import Lazy, SearchView
from sweeper.errors import BisectError

__all__ = ["QUOTED_SCAN_WIDTH", "BadEndpoint", "BisectReport", "Change", "Direction", "DriftReport", "ModeReport",
           "Observation", "ProbeRequest", "Search", "SearchOptions"]

# The scan width a report prices when none was asked for (`BisectReport.scan_quote`): the benchmarks'
# short bumps are 3-5 commits wide, and a scan's starts grow as N / width, so 3 is the dearest of them.
QUOTED_SCAN_WIDTH = 3


class Direction(StrEnum):
    REGRESSION = "regression"
    FIX = "fix"


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


@dataclass
class _Probe:
    index: int
    samples: int
    failures: dict[str, int]


class Search:
    """Ask/tell search for every change of every failure mode. See the module docstring; the rules
    that choose each round are free functions of a read-only view (`sweeper.bisect.rules`)."""

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
        # The options the rules read, with the prior resolved once (a default one is built once, not per read).
        self._view_options = replace(o, prior=self.prior)
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

    def drifts(self, mode: str) -> list[Drift]:
        """Runs of same-direction changes of `mode` that a ramp fits as well (`sweeper.bisect.drift`)."""
        if mode not in self._drift_cache:
            self._drift_cache[mode] = rules.mode_drifts(self._view(), mode)
        return self._drift_cache[mode]

    def _view(self) -> SearchView:
        """What the rules read, as it stands now; posteriors and drifts are computed when read."""
        return SearchView(self._view_options, len(self.commits), tuple(self._modes), dict(self._n_starts),
                          dict(self._n_samples), Lazy(self._modes, self._failures_at), frozenset(self._skipped),
                          Lazy(self._modes, self.mode_posterior), Lazy(self._modes, self.drifts), len(self._probes))

    def _limits_reached(self) -> bool:
        return ((self.max_rounds is not None and self.rounds >= self.max_rounds)
                or (self.max_samples is not None and self.total_samples >= self.max_samples)
                or (self.options.max_gpu_s is not None and self.gpu_s >= self.options.max_gpu_s))

    def bad_endpoint(self) -> BadEndpoint:
        return rules.bad_endpoint(self._view())

    def widest_unprobed(self) -> int:
        """The most testable commits in a row with no probe between two probed ones: the widest
        regression fixed again inside the range that the probes could have missed entirely."""
        return rules.widest_unprobed(self._view())

    # ---- ask ---------------------------------------------------------------------------

    def _needs(self) -> list[Need]:
        return rules.needs(self._view())

    def _batch(self, p_lo: float, p_hi: float, rho: float) -> int:
        """Samples for one start (`sweeper.bisect.sizing.batch`) under this search's options."""
        return batch(self.options, p_lo, p_hi, rho)

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
        plan = rules.plan_round(self._needs(), self._in_flight, k)
        reqs = [self._request(i, n, value) for i, (n, value) in sorted(plan.items())]
        if reqs:
            self.rounds += 1
            self._in_flight.update(r.index for r in reqs)
        return reqs

    def _request(self, i: int, n: int, value: float) -> ProbeRequest:
        room = self.max_commit_samples - self._n_samples[i]
        if self.max_samples is not None:
            room = min(room, max(1, self.max_samples - self.total_samples))
        return ProbeRequest(self.commits[i], i, max(1, min(n, room)), value)

    # ---- result ------------------------------------------------------------------------

    def result(self) -> BisectReport:
        view = self._view()
        modes = tuple(self._mode_report(view, m) for m in self._modes)
        needs = rules.needs(view)
        probes = len(self._probes)
        o = self.options
        to_decide = sum(o.request_s * m.to_decide_samples
                        + o.start_s * math.ceil(m.to_decide_samples / max(1, self.max_batch)) for m in modes)
        return BisectReport(modes, rules.bad_endpoint(view), self.confidence, not needs, len(needs), self.rounds,
                            probes, self.total_samples,
                            tuple((self.commits[i], r) for i, r in sorted(self._skipped.items())),
                            self.gpu_s, float(to_decide), rules.widest_unprobed(view), o.bump_width,
                            None if o.bump_width else rules.scan_quote(view, QUOTED_SCAN_WIDTH),
                            None if o.bump_width else o.quiet_scan, self.prior.expected_changes)

    def _mode_report(self, view: SearchView, mode: str) -> ModeReport:
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
                                  not inside and sure >= self.confidence and rules.two_starts_each(view, lo, hi)))
        good, bad = post.segments[0], post.segments[-1]
        fails_good = pts[0] == 0 and good.failures > 0 and good.low > 0
        fails_bad = pts[-1] == len(self.commits) - 1 and bad.failures > 0 and bad.low > 0
        gaps = tuple((pts[a], pts[a + 1], float(p)) for a, p in enumerate(post.gap_change))
        last = len(self.commits) - 1
        observed = tuple((view.failures_at(mode, i), view.samples_at(i)) for i in (0, last))
        below = rules.below_resolution(view, mode)
        settled = post.no_change >= self.confidence or (
            1 - post.no_change >= self.confidence and all(c.found for c in changes) and bool(changes or drifts))
        decided = below or settled
        drift_reports = tuple(DriftReport(mode, self.commits[d.first], self.commits[d.last], d.rate_from, d.rate_to,
                                          len(d.gaps)) for d in drifts)
        return ModeReport(mode, tuple(changes), good, bad, post.no_change, post.rho,
                          fails_bad, fails_good, gaps, (observed[0], observed[1]), drift_reports,
                          decided, 0 if decided else self._to_decide(view, post, changes))

    def _to_decide(self, view: SearchView, post: ModePosterior, changes: Sequence[Change]) -> int:
        """A rough count of the samples still needed: Wald counts to tell the rates at either end of
        each unfound change apart, one bisection's worth of probes for its candidates; with no change
        in view, the samples at both ends that would tell the rate there from `min_contrast` times it."""
        open_changes = [c for c in changes if not c.found]
        if not open_changes:
            seg = post.segments[0]
            r = max(seg.rate, self.min_rate / 4)
            need = wald(self.options, r, r * self.options.min_contrast)
            have = min(view.samples_at(post.points[0]), view.samples_at(post.points[-1]))
            return int(2 * max(0, 4 * need - have))  # P(no change) needs several Wald counts of evidence
        total = 0
        for c in open_changes:
            lo, hi = sorted((c.before.rate, c.after.rate))
            per_probe = wald(self.options, lo, max(hi, lo * self.options.min_contrast))
            total += per_probe * (2 + math.ceil(math.log2(max(2, len(c.candidates)))))
        return int(total)
