"""The culprit search, driven by scripted and simulated verdicts."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from sweeper.bisect import (
    EndpointIssue,
    Phase,
    ProbeOutcome,
    ProbeRequest,
    Search,
    Verdict,
    run,
)
from sweeper.bisect_sim import History, random_history, simulate
from sweeper.errors import BisectError


def _sim(history: History, seed: int = 0, **kwargs: object):
    return simulate(history, np.random.default_rng(seed), **kwargs)


def test_deterministic_regression_is_plain_bisection() -> None:
    result = _sim(History(1024, 700, 0.0, 1.0, frozenset()))
    assert result.kind is Verdict.CULPRIT and result.culprit == "c700"
    assert result.candidates == ("c700",) and result.confidence >= 0.99
    # Two endpoint probes, then about log2(N) probes.
    assert result.probes <= 2 + math.ceil(math.log2(1024)) + 2


def test_endpoints_are_probed_first() -> None:
    search = Search([f"c{i}" for i in range(100)])
    assert search.phase is Phase.ENDPOINTS
    assert {r.commit for r in search.next_probes(4)} == {"c0", "c99"}


def test_culprit_next_to_skipped_commits_is_a_candidate_set() -> None:
    result = _sim(History(20, 10, 0.0, 1.0, frozenset({8, 9})), parallel=2)
    assert result.kind is Verdict.CULPRIT and result.culprit == "c10"
    assert result.candidates == ("c8", "c9", "c10")
    skipped = {c.commit for c in result.counts if c.skipped}
    assert skipped <= {"c8", "c9"}


@pytest.mark.parametrize("parallel", [1, 4])
def test_good_endpoint_fails(parallel: int) -> None:
    result = _sim(History(50, 0, 0.0, 0.5, frozenset()), parallel=parallel)
    assert result.kind is Verdict.ENDPOINT_PROBLEM and result.endpoint_issue is EndpointIssue.GOOD_FAILS
    assert result.culprit is None and result.candidates == ()
    assert result.p_good > 0.1


def test_bad_endpoint_passes() -> None:
    result = _sim(History(50, None, 0.0, 0.5, frozenset()), parallel=2)
    assert result.kind is Verdict.ENDPOINT_PROBLEM and result.endpoint_issue is EndpointIssue.BAD_PASSES
    assert result.culprit is None and result.confidence >= 0.99


def test_untestable_endpoint() -> None:
    search = Search(["a", "b", "c"])
    search.record_skip("c", "install_failed")
    result = search.result()
    assert search.done and result.kind is Verdict.ENDPOINT_PROBLEM
    assert result.endpoint_issue is EndpointIssue.BAD_UNTESTABLE and result.culprit is None


def test_no_culprit_when_both_endpoints_fail_alike() -> None:
    result = _sim(History(50, None, 0.03, 0.5, frozenset()), parallel=2)
    assert result.kind is Verdict.NO_CULPRIT and result.culprit is None
    assert result.confidence >= 0.99


def test_limits_give_undecided_with_best_guess() -> None:
    result = _sim(History(500, 321, 0.01, 0.08, frozenset()), max_rounds=6)
    assert result.kind is Verdict.UNDECIDED and result.rounds == 6
    assert result.confidence < 0.99


def test_parallel_probes_take_fewer_rounds() -> None:
    def rounds(k: int) -> float:
        rng = np.random.default_rng(7)
        return float(np.mean([simulate(random_history(rng, n_min=200, n_max=2000), rng, parallel=k).rounds
                              for _ in range(30)]))

    assert rounds(4) < 0.7 * rounds(1)


def test_flaky_probes_stop_early_on_a_clean_baseline() -> None:
    search = Search([f"c{i}" for i in range(64)])
    search.record("c0", 0, 200)  # a clean baseline: one failure marks a commit bad
    search.record("c63", 100, 200)
    assert search.phase is Phase.SEARCH
    (req,) = search.next_probes(1)
    assert req.stop_after_failures == 1 and req.commit not in ("c0", "c63")


def test_resume_replays_observations_and_spends_nothing_twice() -> None:
    history = History(300, 123, 0.01, 0.3, frozenset({50, 122}))
    rng = np.random.default_rng(3)
    search = Search(history.commits)

    def probe(req: ProbeRequest) -> ProbeOutcome:
        if req.index in history.skipped:
            return ProbeOutcome.skip("server_failed")
        return ProbeOutcome(int(rng.binomial(req.samples, history.rate(req.index))), req.samples)

    for _ in range(5):
        for req in search.next_probes(2):
            out = probe(req)
            if out.skip_reason:
                search.record_skip(req.commit, out.skip_reason)
            else:
                search.record(req.commit, out.failures, out.samples)
    resumed = Search.from_observations(history.commits, search.observations)
    assert resumed.result() == search.result()
    assert resumed.next_probes(2) == search.next_probes(2)
    final = run(resumed, probe, parallel=2)
    assert final.kind is Verdict.CULPRIT and "c123" in final.candidates
    assert final.samples == sum(o.samples for o in resumed.observations)


def test_widened_range_keeps_old_samples() -> None:
    old = Search(["c5", "c6", "c7"])
    old.record("c5", 3, 8)
    old.record("c7", 4, 8)
    wider = Search.from_observations([f"c{i}" for i in range(8)], old.observations)
    assert wider.total_samples == 16


def test_bad_input() -> None:
    with pytest.raises(BisectError, match="need a good and a bad"):
        Search(["only"])
    search = Search(["a", "b"])
    with pytest.raises(BisectError, match="not one of the 2 candidates"):
        search.record("zzz", 0, 1)
    with pytest.raises(BisectError, match="failures <= samples"):
        search.record("a", 3, 2)


def test_simulated_histories_are_right_and_calibrated() -> None:
    """1,000 random histories: N log-uniform in 10..3,000, p_bad 0.05..1, p_good 0..0.02,
    5 % untestable commits, K in {1, 2, 4, 8}."""
    start = time.perf_counter()
    rng = np.random.default_rng(2026)
    confidences, right = [], []
    for i in range(1000):
        history = random_history(rng)
        result = simulate(history, rng, parallel=(1, 2, 4, 8)[i % 4], confidence=0.99,
                          max_samples_per_probe=5000)
        confidences.append(result.confidence)
        right.append(history.is_right(result))
    confidences_a, right_a = np.array(confidences), np.array(right)
    assert right_a.mean() >= 0.99
    for c in (0.9, 0.95, 0.99):
        assert right_a[confidences_a >= c].mean() >= c
    # A looser target: the search stops sooner and its reported confidence still holds.
    confidences, right = [], []
    for i in range(300):
        history = random_history(rng)
        result = simulate(history, rng, parallel=(1, 2, 4, 8)[i % 4], confidence=0.9,
                          max_samples_per_probe=5000)
        confidences.append(result.confidence)
        right.append(history.is_right(result))
    confidences_a, right_a = np.array(confidences), np.array(right)
    for c in (0.8, 0.9):
        assert right_a[confidences_a >= c].mean() >= c
    assert time.perf_counter() - start < 90
