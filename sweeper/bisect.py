"""The noisy, parallel culprit search over an ordered list of commits. Pure: no I/O.

Candidates are first-parent commits c_0 (the good endpoint) ... c_N (the bad endpoint),
oldest first. On a bad commit a sample fails with an unknown rate p_bad, on a good one
with an unknown baseline p_good < p_bad; the culprit is the first bad commit. The caller
drives the search with an ask/tell loop, so it decides how probes run (K GPU slots):

    search = Search(commits, confidence=0.99)
    while not search.done:
        for req in search.next_probes(k):          # one round: up to k distinct commits
            ...run req.samples requests on req.commit (stop early after
               req.stop_after_failures failures, if set)...
            search.record(req.commit, failures, samples)   # or record_skip(commit, why)
    result = search.result()

The endpoints are sampled first. Their counts decide whether a search makes sense:
`ENDPOINT_PROBLEM` when the good endpoint fails clearly, the bad endpoint shows no failure
at all, or an endpoint is untestable; `NO_CULPRIT` when both fail alike. On
`EndpointIssue.GOOD_FAILS` the driver widens the range: move the good endpoint back,
doubling its distance from the bad one, and start a new search over the longer list with
`Search.from_observations(longer_commits, old.observations)` so no sample is spent twice.

Afterwards the posterior over the culprit position (rates integrated out, see
`stats.step_posterior`) chooses probes at its quantiles. The search is done when one
candidate (a commit plus the untestable commits right before it) holds `confidence` of
the posterior, or when the limits are reached.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from sweeper.errors import BisectError
from sweeper.stats import (
    RatePrior,
    StepPosterior,
    samples_to_decide,
    step_posterior,
    wilson,
    z_for,
)


class Verdict(Enum):
    CULPRIT = "culprit"
    NO_CULPRIT = "no_culprit"
    ENDPOINT_PROBLEM = "endpoint_problem"
    UNDECIDED = "undecided"


class EndpointIssue(Enum):
    GOOD_FAILS = "good_fails"  # widen the range: the regression is older than `good`
    BAD_PASSES = "bad_passes"  # the failure does not reproduce at `bad`
    GOOD_UNTESTABLE = "good_untestable"
    BAD_UNTESTABLE = "bad_untestable"


class Phase(Enum):
    ENDPOINTS = "endpoints"
    SEARCH = "search"
    DONE = "done"


@dataclass(frozen=True)
class ProbeRequest:
    """Run `samples` requests on `commit`; the caller may stop once it has seen
    `stop_after_failures` failures (then one more failure would not change the decision)."""

    commit: str
    index: int
    samples: int
    stop_after_failures: int | None = None


@dataclass(frozen=True)
class Observation:
    """One recorded probe: what a resumed search replays. `skip_reason` marks it untestable."""

    commit: str
    failures: int = 0
    samples: int = 0
    skip_reason: str | None = None
    round: int = 0


@dataclass(frozen=True)
class CommitCounts:
    commit: str
    index: int
    failures: int
    samples: int
    skip_reason: str | None = None

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None


@dataclass(frozen=True)
class BisectResult:
    kind: Verdict
    culprit: str | None  # best guess, also for UNDECIDED
    candidates: tuple[str, ...]  # untestable commits right before the culprit, then it
    confidence: float  # posterior mass of `candidates` (or of "no culprit")
    endpoint_issue: EndpointIssue | None
    counts: tuple[CommitCounts, ...]  # commits with any observation, oldest first
    p_good: float
    p_bad: float
    rounds: int
    probes: int
    samples: int

    @property
    def ok(self) -> bool:
        return self.kind in (Verdict.CULPRIT, Verdict.NO_CULPRIT)


@dataclass
class _State:
    failures: np.ndarray
    samples: np.ndarray
    skipped: dict[int, str] = field(default_factory=dict)
    in_flight: set[int] = field(default_factory=set)
    observations: list[Observation] = field(default_factory=list)


class Search:
    """Ask/tell culprit search. See the module docstring for the protocol."""

    def __init__(self, commits: Sequence[str], *, confidence: float = 0.99,
                 max_samples_per_probe: int = 2000, max_samples: int | None = None,
                 max_rounds: int | None = None, min_batch: int = 8, max_batch: int = 1000,
                 good_rate_max: float = 0.05, no_culprit_prior: float = 0.1,
                 prior: RatePrior | None = None) -> None:
        if len(commits) < 2:
            raise BisectError(f"need a good and a bad commit, got {len(commits)} commit(s)")
        if len(set(commits)) != len(commits):
            raise BisectError("candidate commits are not distinct")
        if not 0.5 < confidence < 1:
            raise BisectError(f"confidence must be in (0.5, 1), got {confidence}")
        self.commits = tuple(commits)
        self.confidence = confidence
        self.max_samples_per_probe = max_samples_per_probe
        self.max_samples = max_samples
        self.max_rounds = max_rounds
        self.min_batch, self.max_batch = min_batch, max_batch
        self.good_rate_max = good_rate_max
        self.prior = prior or RatePrior.default()
        self._index = {c: i for i, c in enumerate(self.commits)}
        m = len(self.commits)
        self._s = _State(np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64))
        # Positions 1..N-... plus "no culprit" as the last slot (index m-1 of log_prior).
        n_pos = m - 1
        self._log_prior = np.concatenate([np.full(n_pos, math.log((1 - no_culprit_prior) / n_pos)),
                                          [math.log(no_culprit_prior)]])
        self._endpoint_log_prior = np.log([1 - no_culprit_prior, no_culprit_prior])
        # Sequential looks at the endpoints: a stricter z keeps the overall error in bounds.
        self._z_strict = z_for(1 - (1 - confidence) / 10)
        self.rounds = 0
        self._cache: StepPosterior | None = None
        self._ends_cache: StepPosterior | None = None

    # ---- persistence -------------------------------------------------------------------

    @classmethod
    def from_observations(cls, commits: Sequence[str], observations: Iterable[Observation],
                          **kwargs: object) -> Search:
        """Rebuild a search by replaying its observations; those of commits outside
        `commits` are ignored (a widened range keeps everything it can)."""
        search = cls(commits, **kwargs)  # type: ignore[arg-type]
        for obs in observations:
            if obs.commit not in search._index:
                continue
            if obs.skip_reason is not None:
                search.record_skip(obs.commit, obs.skip_reason)
            else:
                search.record(obs.commit, obs.failures, obs.samples)
            search.rounds = max(search.rounds, obs.round)
        return search

    @property
    def observations(self) -> tuple[Observation, ...]:
        return tuple(self._s.observations)

    # ---- tell --------------------------------------------------------------------------

    def record(self, commit: str, failures: int, samples: int) -> None:
        i = self._lookup(commit)
        if not 0 <= failures <= samples:
            raise BisectError(f"{commit}: need 0 <= failures <= samples, got {failures}/{samples}")
        if i in self._s.skipped:
            raise BisectError(f"{commit} was recorded as untestable")
        self._s.failures[i] += failures
        self._s.samples[i] += samples
        self._s.in_flight.discard(i)
        self._s.observations.append(Observation(commit, failures, samples, None, self.rounds))
        self._cache = self._ends_cache = None

    def record_skip(self, commit: str, reason: str) -> None:
        i = self._lookup(commit)
        self._s.skipped[i] = reason
        self._s.in_flight.discard(i)
        self._s.observations.append(Observation(commit, 0, 0, reason, self.rounds))
        self._cache = self._ends_cache = None

    def _lookup(self, commit: str) -> int:
        try:
            return self._index[commit]
        except KeyError:
            raise BisectError(f"{commit} is not one of the {len(self.commits)} candidates") from None

    # ---- state -------------------------------------------------------------------------

    @property
    def total_samples(self) -> int:
        return int(self._s.samples.sum())

    @property
    def phase(self) -> Phase:
        if self._decision() is not None:
            return Phase.DONE
        return Phase.SEARCH if self._endpoints_settled() else Phase.ENDPOINTS

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def posterior(self) -> StepPosterior:
        if self._cache is None:
            self._cache = step_posterior(self._s.failures, self._s.samples, self._log_prior,
                                         self.prior)
        return self._cache

    def _endpoint_posterior(self) -> StepPosterior:
        """The model fitted to the endpoints' counts alone: [P(step), P(no culprit)]."""
        if self._ends_cache is None:
            idx = [0, len(self.commits) - 1]
            self._ends_cache = step_posterior(self._s.failures[idx], self._s.samples[idx],
                                              self._endpoint_log_prior, self.prior)
        return self._ends_cache

    def _endpoint_no_culprit(self) -> float:
        return float(self._endpoint_posterior().post[1])

    def _endpoints_settled(self) -> bool:
        """The endpoints differ, and each has enough samples to pin its rate down: the rates
        estimated there anchor the whole search, so they must not rest on a handful."""
        if self._endpoint_no_culprit() > 1 - self.confidence:
            return False
        ends = self._endpoint_posterior()
        need = min(self._samples_needed(ends.p_good, ends.p_bad), self.max_samples_per_probe)
        return bool(min(self._s.samples[0], self._s.samples[-1]) >= need)

    def _samples_needed(self, p_good: float, p_bad: float) -> int:
        return samples_to_decide(p_good, max(p_bad, p_good + 1e-3), self.confidence)

    def _endpoint_issue(self) -> EndpointIssue | None:
        last = len(self.commits) - 1
        if 0 in self._s.skipped:
            return EndpointIssue.GOOD_UNTESTABLE
        if last in self._s.skipped:
            return EndpointIssue.BAD_UNTESTABLE
        k, n = int(self._s.failures[0]), int(self._s.samples[0])
        if wilson(k, n, self._z_strict)[0] > self.good_rate_max:
            return EndpointIssue.GOOD_FAILS
        return None

    def _groups(self) -> tuple[np.ndarray, np.ndarray]:
        """Map each culprit position to its candidate group: the first testable commit at
        or after it (skipped commits cannot be told apart from the next testable one)."""
        m = len(self.commits)
        group = np.arange(1, m + 1)  # position j (1..m-1) and "no culprit" (m)
        for i in sorted(self._s.skipped, reverse=True):
            if 0 < i < m - 1:
                group[i - 1] = group[i]
        mass = np.bincount(group - 1, weights=self.posterior().post, minlength=m)
        return group, mass

    def _limits_reached(self) -> bool:
        return ((self.max_rounds is not None and self.rounds >= self.max_rounds)
                or (self.max_samples is not None and self.total_samples >= self.max_samples))

    def _decision(self) -> Verdict | None:
        if self._endpoint_issue() is not None:
            return Verdict.ENDPOINT_PROBLEM
        p0 = self._endpoint_no_culprit()
        if p0 >= self.confidence:
            return Verdict.ENDPOINT_PROBLEM if self._s.failures[-1] == 0 else Verdict.NO_CULPRIT
        if self._endpoints_settled():
            _, mass = self._groups()
            if mass.max() >= self.confidence:
                return Verdict.NO_CULPRIT if int(np.argmax(mass)) == len(mass) - 1 else Verdict.CULPRIT
        if self._limits_reached() or not self._probeable():
            return Verdict.UNDECIDED
        return None

    def _probeable(self) -> list[int]:
        cap = self.max_samples_per_probe
        return [i for i in range(len(self.commits))
                if i not in self._s.skipped and self._s.samples[i] < cap]

    # ---- ask ---------------------------------------------------------------------------

    def next_probes(self, k: int = 1) -> list[ProbeRequest]:
        """The next round: up to k probes on distinct commits not already in flight."""
        if k < 1:
            raise BisectError(f"k must be >= 1, got {k}")
        phase = self.phase
        if phase is Phase.DONE:
            return []
        free = [i for i in self._probeable() if i not in self._s.in_flight]
        if phase is Phase.ENDPOINTS:
            ends = [i for i in (0, len(self.commits) - 1) if i in free]
            chosen = sorted(ends, key=lambda i: self._s.samples[i])[:k]
            reqs = [self._request(i, early_stop=False) for i in chosen]
        else:
            refs = self._lagging_endpoints(free)[:k]
            reqs = [self._request(i, early_stop=False, at_least=lag) for i, lag in refs]
            reqs += [self._request(i, early_stop=True)
                     for i in self._quantile_commits(free, k - len(reqs))]
        if reqs:
            self.rounds += 1
            self._s.in_flight.update(r.index for r in reqs)
        return reqs

    def _lagging_endpoints(self, free: list[int]) -> list[tuple[int, int]]:
        """Endpoints with fewer samples than the most-sampled interior commit, and by how
        many. Keeping the endpoints ahead keeps the rate estimates anchored to commits
        known to be good and bad, not to ambiguous interior ones."""
        interior = self._s.samples[1:-1]
        most = int(interior.max()) if interior.size else 0
        return [(i, most - int(self._s.samples[i])) for i in (0, len(self.commits) - 1)
                if i in free and self._s.samples[i] < most]

    def _quantile_commits(self, free: list[int], k: int) -> list[int]:
        """Commits whose P(bad) = P(culprit <= commit) is closest to 1/(k+1), ..., k/(k+1)."""
        if not free or k < 1:
            return []
        cdf = np.concatenate([[0.0], np.cumsum(self.posterior().post)[:-1]])  # P(j <= i)
        cand = np.array(free)
        split = np.minimum(cdf[cand], 1 - cdf[cand])
        # A commit whose outcome is already near-certain cannot move the verdict.
        useful = cand[split >= (1 - self.confidence) / 50]
        if useful.size == 0:
            useful = cand[[int(np.argmax(split))]]
        chosen: list[int] = []
        for q in np.arange(1, k + 1) / (k + 1):
            left = np.array([i for i in useful if i not in chosen])
            if left.size == 0:
                break
            chosen.append(int(left[np.argmin(np.abs(cdf[left] - q))]))
        return chosen

    def _request(self, i: int, *, early_stop: bool, at_least: int = 0) -> ProbeRequest:
        post = self.posterior() if self.phase is Phase.SEARCH else self._endpoint_posterior()
        p_good, p_bad = post.p_good, max(post.p_bad, post.p_good + 1e-3)
        need = max(self._samples_needed(p_good, p_bad), at_least)
        done = int(self._s.samples[i])
        # Never more than double what the commit has had: the rate estimates may be off.
        batch = min(max(need, self.min_batch), max(self.min_batch, done), self.max_batch,
                    self.max_samples_per_probe - done)
        odds = math.log(self.confidence / (1 - self.confidence))
        one_failure_decides = p_good <= 0 or math.log(p_bad / p_good) >= odds
        stop = 1 if early_stop and one_failure_decides else None
        return ProbeRequest(self.commits[i], i, max(1, batch), stop)

    # ---- result ------------------------------------------------------------------------

    def result(self) -> BisectResult:
        verdict = self._decision() or Verdict.UNDECIDED
        issue = self._endpoint_issue()
        if verdict is Verdict.ENDPOINT_PROBLEM and issue is None:
            issue = EndpointIssue.BAD_PASSES
        post = self.posterior()
        culprit: str | None = None
        candidates: tuple[str, ...] = ()
        if verdict is Verdict.ENDPOINT_PROBLEM:
            # GOOD_FAILS is a test at the strict level; BAD_PASSES rests on P(no step).
            if issue is EndpointIssue.GOOD_FAILS:
                confidence = 1 - (1 - self.confidence) / 10
            elif issue is EndpointIssue.BAD_PASSES:
                confidence = self._endpoint_no_culprit()
            else:
                confidence = 1.0
        else:
            group, mass = self._groups()
            top = int(np.argmax(mass))
            confidence = float(mass[top])
            if top == len(mass) - 1:
                if verdict is Verdict.CULPRIT:
                    verdict = Verdict.NO_CULPRIT
            else:
                culprit = self.commits[top + 1]
                members = np.nonzero(group == top + 1)[0] + 1  # positions in this group
                candidates = tuple(self.commits[j] for j in members)
        counts = tuple(CommitCounts(c, i, int(self._s.failures[i]), int(self._s.samples[i]),
                                    self._s.skipped.get(i))
                       for i, c in enumerate(self.commits)
                       if self._s.samples[i] > 0 or i in self._s.skipped)
        probes = sum(1 for o in self._s.observations if o.skip_reason is None)
        return BisectResult(verdict, culprit, candidates, confidence, issue, counts,
                            post.p_good, post.p_bad, self.rounds, probes, self.total_samples)


@dataclass(frozen=True)
class ProbeOutcome:
    """What a synchronous probe function returns: counts, or a reason it was untestable."""

    failures: int = 0
    samples: int = 0
    skip_reason: str | None = None

    @classmethod
    def skip(cls, reason: str) -> ProbeOutcome:
        return cls(skip_reason=reason)


def run(search: Search, probe_fn: Callable[[ProbeRequest], ProbeOutcome], *,
        parallel: int = 1) -> BisectResult:
    """Drive `search` to the end with a synchronous probe function, `parallel` per round."""
    while not search.done:
        requests = search.next_probes(parallel)
        if not requests:
            break
        for req in requests:
            out = probe_fn(req)
            if out.skip_reason is not None:
                search.record_skip(req.commit, out.skip_reason)
            else:
                search.record(req.commit, out.failures, out.samples)
    return search.result()
