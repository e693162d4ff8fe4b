"""The change search, driven by scripted counts: each verdict kind, several changes, several modes."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from sweeper.bisect import BadEndpoint, BisectReport, Direction, Observation, Search, SearchOptions
from sweeper.errors import BisectError

Rates = Callable[[int], Mapping[str, float]]


def drive(search: Search, rates: Rates, *, k: int = 1, skipped: frozenset[int] = frozenset(),
          rng: np.random.Generator | None = None, icc: float = 0.0) -> BisectReport:
    """Run the search against a history. Without `rng` the counts are scripted: round(rate * n)
    per mode, so every verdict below is exact and repeatable; with it, multinomial draws (and a
    per-start Beta draw of each rate when icc > 0)."""
    while not search.done:
        reqs = search.ask(k)
        if not reqs:
            break
        for req in reqs:
            if req.index in skipped:
                search.tell_skip(req.commit, "server_failed: exited with code 1")
                continue
            p = dict(rates(req.index))
            if rng is None:
                search.tell(req.commit, req.samples, {m: round(r * req.samples) for m, r in p.items()})
                continue
            if icc > 0:
                s = (1 - icc) / icc
                p = {m: (rng.beta(r * s, (1 - r) * s) if 0 < r < 1 else r) for m, r in p.items()}
            counts = rng.multinomial(req.samples, [*p.values(), max(0.0, 1 - sum(p.values()))])
            search.tell(req.commit, req.samples, dict(zip(p, map(int, counts[:-1]), strict=False)))
    return search.result()


def commits(n: int) -> list[str]:
    return [f"c{i}" for i in range(n + 1)]


def summary_of(report: BisectReport, cs: list[str]) -> dict[str, Any]:
    """The report's `bisect.json` data for one cell, knowing only the commits the report names."""
    from sweeper.reports.bisect import ReportCell, describe, named_commits

    info = {c: {"sha": c, "short": c, "subject": f"commit {c}", "pr": None, "date": None}
            for c in named_commits([report])}
    return describe([report], [ReportCell({"spec_method": "mtp"}, "spec_method=mtp", "mtp")], cs, info)


def changes(report: BisectReport) -> list[tuple[str, str, str]]:
    return [(c.mode, c.direction.value, c.commit) for c in report.changes if c.found]


def test_deterministic_regression_is_found_in_about_log2_n_probes() -> None:
    report = drive(Search(commits(1024)), lambda i: {"json_schema": 1.0 if i >= 700 else 0.0})
    assert changes(report) == [("json_schema", "regression", "c700")]
    (change,) = report.changes
    assert change.candidates == ("c700",) and change.last_before == "c699"
    assert change.before.failures == 0 and change.after.rate == 1.0
    assert report.done and report.bad_endpoint is BadEndpoint.FAILS
    # Two starts at each endpoint, then about log2(N) probes, a few of them repeated to settle.
    assert report.probes <= 4 + math.ceil(math.log2(1024)) + 6


def test_endpoints_get_two_server_starts_first_and_free_slots_split_the_range() -> None:
    search = Search(commits(100))
    assert [r.commit for r in search.ask(1)] == ["c0"]
    search = Search(commits(100))
    first = search.ask(4)
    assert [r.commit for r in first] == ["c0", "c34", "c67", "c100"]  # the ends, then a blind split
    for r in first:
        search.tell(r.commit, r.samples, {"a": r.samples // 2 if r.index > 50 else 0})
    second = {r.commit for r in search.ask(4)}
    assert {"c0", "c100"} <= second  # a second start at each end before their rates are trusted


def test_a_regression_and_its_fix_in_one_range() -> None:
    report = drive(Search(commits(200)), lambda i: {"fsm": 0.3 if 60 <= i < 150 else 0.0,
                                                    "whitespace": 0.2 if i >= 150 else 0.0}, k=4)
    found = changes(report)
    assert ("fsm", "regression", "c60") in found
    assert ("fsm", "fix", "c150") in found
    assert ("whitespace", "regression", "c150") in found
    assert len(found) == 3
    fsm = next(m for m in report.modes if m.mode == "fsm")
    assert not fsm.fails_at_bad and not fsm.fails_at_good
    ws = next(m for m in report.modes if m.mode == "whitespace")
    assert ws.fails_at_bad and ws.started is not None and ws.started.commit == "c150"
    assert [m.mode for m in report.failing_at_bad] == ["whitespace"]


def test_two_modes_in_one_probe_each_get_their_own_change() -> None:
    report = drive(Search(commits(100)), lambda i: {"budget": 0.5 if i >= 90 else 0.0,
                                                    "whitespace": 0.2 if i >= 37 else 0.0}, k=2)
    assert sorted(changes(report)) == [("budget", "regression", "c90"), ("whitespace", "regression", "c37")]
    # One probe informs both searches: no commit was probed for one mode alone more than needed.
    assert report.probes < 2 * (4 + 2 * math.ceil(math.log2(100)))


def test_two_steps_of_one_mode() -> None:
    report = drive(Search(commits(100)), lambda i: {"a": 0.4 if i >= 70 else (0.1 if i >= 30 else 0.0)},
                   k=4, rng=np.random.default_rng(3))
    assert changes(report) == [("a", "regression", "c30"), ("a", "regression", "c70")]
    first, second = report.changes
    assert first.before.rate == 0.0 and 0.05 < first.after.rate < 0.2 and 0.3 < second.after.rate < 0.5


def test_change_next_to_untestable_commits_names_them_as_candidates() -> None:
    report = drive(Search(commits(20)), lambda i: {"a": 1.0 if i >= 10 else 0.0}, k=2,
                   skipped=frozenset({8, 9}))
    (change,) = report.changes
    assert change.found and change.commit == "c10" and change.candidates == ("c8", "c9", "c10")
    assert {c for c, _ in report.skipped} <= {"c8", "c9"}
    (row,) = summary_of(report, commits(20))["cells"][0]["changes"]
    assert [c["sha"] for c in row["candidates"]] == ["c8", "c9", "c10"] and row["n_candidates"] == 3


def test_bad_endpoint_passes_after_enough_clean_samples() -> None:
    search = Search(commits(50))
    report = drive(search, lambda i: {})
    assert report.bad_endpoint is BadEndpoint.PASSES and report.changes == () and report.done
    need = math.ceil(math.log(0.01) / math.log(0.99))  # no failure in this many: rate < 1% at 99%
    assert sum(o.samples for o in search.observations if o.commit == "c50") >= need


def test_a_rare_regression_at_bad_is_not_dismissed_after_a_few_clean_requests() -> None:
    # 1 in 50 at bad: the old early exit gave up after 8 clean requests; now a verdict needs data.
    report = drive(Search(commits(40)), lambda i: {"a": 0.02 if i >= 25 else 0.0}, k=4,
                   rng=np.random.default_rng(7))
    assert report.bad_endpoint is BadEndpoint.FAILS
    assert ("a", "regression", "c25") in changes(report)


def test_bad_endpoint_untestable() -> None:
    report = drive(Search(commits(30)), lambda i: {"a": 0.5}, skipped=frozenset({30}))
    assert report.bad_endpoint is BadEndpoint.UNTESTABLE and report.changes == ()


def test_failing_at_good_alike_is_no_change() -> None:
    report = drive(Search(commits(60)), lambda i: {"a": 0.3}, k=4)
    (mode,) = report.modes
    assert report.changes == () and mode.fails_at_good and mode.fails_at_bad and mode.started is None
    assert mode.no_change > 0.5


def test_change_at_either_end_of_the_range() -> None:
    first = drive(Search(commits(50)), lambda i: {"a": 0.5 if i >= 1 else 0.0}, k=2)
    last = drive(Search(commits(50)), lambda i: {"a": 0.5 if i >= 50 else 0.0}, k=2)
    assert changes(first) == [("a", "regression", "c1")]
    assert changes(last) == [("a", "regression", "c50")]


def test_per_start_variation_is_learned_and_the_change_still_found() -> None:
    report = drive(Search(commits(100)), lambda i: {"a": 0.3 if i >= 40 else 0.0}, k=4,
                   rng=np.random.default_rng(11), icc=0.3)
    assert ("a", "regression", "c40") in changes(report)
    assert report.modes[0].rho > 0.1


def test_limits_leave_an_honest_undecided_report() -> None:
    report = drive(Search(commits(500), SearchOptions(max_samples=400)), lambda i: {"a": 0.05 if i >= 321 else 0.0}, k=2,
                   rng=np.random.default_rng(5))
    assert not report.done and report.open_gaps > 0
    assert not any(c.found for c in report.changes)
    unsettled = [c for c in report.changes if not c.found]
    assert all(c.confidence < 1 for c in unsettled)


def test_parallel_probes_take_fewer_rounds() -> None:
    history = lambda i: {"a": 0.3 if i >= 613 else 0.0}
    one = drive(Search(commits(1000)), history, k=1, rng=np.random.default_rng(1))
    four = drive(Search(commits(1000)), history, k=4, rng=np.random.default_rng(1))
    assert ("a", "regression", "c613") in changes(one) and ("a", "regression", "c613") in changes(four)
    assert four.rounds < one.rounds


def test_resume_replays_observations_and_spends_nothing_twice() -> None:
    history = lambda i: {"a": 0.25 if 30 <= i < 70 else 0.0, "b": 0.4 if i >= 70 else 0.0}
    full = Search(commits(100))
    drive(full, history, k=3)
    part = Search(commits(100))
    for _ in range(3):
        for req in part.ask(3):
            p = history(req.index)
            part.tell(req.commit, req.samples, {m: round(r * req.samples) for m, r in p.items()})
    resumed = Search(commits(100), observations=part.observations)
    assert resumed.rounds == part.rounds and resumed.observations == part.observations
    assert resumed.ask(3) == part.ask(3)
    report = drive(Search(commits(100), observations=part.observations), history, k=3)
    assert changes(report) == changes(full.result())


def test_widened_range_keeps_old_samples() -> None:
    old = Search(commits(20)[10:])
    old.tell("c10", 50, {"a": 10})
    old.tell("c20", 50, {"a": 10})
    wider = Search(commits(20), observations=old.observations)
    assert wider.total_samples == 100 and wider.modes == ("a",)


def test_a_search_rebuilt_each_round_asks_what_the_live_one_asks() -> None:
    """A driver serving several searches rebuilds each one every round from what it was told and
    the round it is in: that search asks, round after round, what one kept alive asks."""
    history = lambda i: {"a": 0.3 if i >= 37 else 0.0, "b": 0.2 if 12 <= i < 80 else 0.0}
    options = SearchOptions(max_rounds=5)  # the limit bites before the search is done
    live = Search(commits(100), options)
    told: list[Observation] = []
    while not live.done:
        rebuilt = Search(commits(100), options, observations=told, rounds=live.rounds)
        reqs = live.ask(4)
        assert rebuilt.ask(4) == reqs and rebuilt.rounds == live.rounds
        for req in reqs:
            live.tell(req.commit, req.samples, {m: round(r * req.samples) for m, r in history(req.index).items()})
        # As a driver's stored evidence holds them: the samples, not the round they came in.
        told = [dataclasses.replace(o, round=0) for o in live.observations]
    assert live.rounds == 5 and not live.result().done
    resumed = Search(commits(100), options, observations=told, rounds=live.rounds)
    assert resumed.rounds == 5 and resumed.done and resumed.ask(4) == []


def test_bad_input() -> None:
    with pytest.raises(BisectError):
        Search(["c0"])
    with pytest.raises(BisectError):
        Search(["c0", "c0"])
    with pytest.raises(BisectError):
        Search(commits(3), SearchOptions(confidence=1.5))
    search = Search(commits(3))
    with pytest.raises(BisectError):
        search.tell("c9", 10, {})
    with pytest.raises(BisectError):
        search.tell("c1", 10, {"a": 6, "b": 5})
    with pytest.raises(BisectError):
        search.tell("c1", 10, {"a": -1})
    search.tell_skip("c1", "install_failed")
    with pytest.raises(BisectError):
        search.tell("c1", 10, {})
    with pytest.raises(BisectError):
        search.ask(0)
    assert Observation("c1", skip_reason="install_failed") in search.observations
    assert Direction.FIX.value == "fix"


def test_change_density_sums_the_gap_probabilities_over_the_range() -> None:
    report = drive(Search(commits(64)), lambda i: {"a": 1.0 if i >= 40 else 0.0}, k=2)
    (mode,) = report.modes
    density = mode.change_density(65)
    assert len(density) == 65 and density[0] == 0.0
    assert density[40] == pytest.approx(report.changes[0].confidence)
    assert sum(density) == pytest.approx(sum(p for _, _, p in mode.gaps))


def test_a_change_hidden_by_per_start_variation_is_not_reported_as_no_change() -> None:
    """9 % -> 17 % at commit 99 of 140, each server start drawing its own rate (ICC 0.15): a search
    held to a budget ends without locating it, and the report says how sure it is instead of "no
    change" (and roughly what deciding would cost)."""
    from sweeper.reports.bisect import render

    cs = commits(140)
    report = drive(Search(cs, SearchOptions(max_samples=4000)), lambda i: {"a": 0.093 if i < 99 else 0.167}, k=4, rng=np.random.default_rng(0),
                   icc=0.15)
    (mode,) = report.modes
    assert not [c for c in report.changes if c.found] and mode.fails_at_bad and mode.no_change < 0.99
    text = render(summary_of(report, cs))
    assert "no change in the range" not in text
    assert f"no change located in the range; P(no change) {100 * mode.no_change:.2f}% for a" in text
    assert "short of the 99.00% target" in text
    good, bad = mode.observed
    seen = f"{good[0]}/{good[1]} ({100 * good[0] / good[1]:.1f}%) failed at good, {bad[0]}/{bad[1]}"
    assert seen in text and good[0] / good[1] < bad[0] / bad[1]  # the endpoints as they were, not pooled
    assert "its rate varies between server starts" in text
    assert not mode.decided and "GPU-hours more would decide" in text


def test_no_change_is_said_flatly_only_at_the_target() -> None:
    from sweeper.reports.bisect import render

    cs = commits(60)
    report = drive(Search(cs), lambda i: {"a": 0.3}, k=4)
    (mode,) = report.modes
    summary = summary_of(report, cs)
    text = render(summary)
    assert ("no change in the range" in text) == (mode.no_change >= 0.99)
    # A stored report read back with a looser target: the same posterior now reaches it.
    summary["confidence"] = min(mode.no_change, 0.9)
    assert any(line.startswith("  no change in the range (none of 1.15x or more in the odds of failing)")
               for line in render(summary).splitlines())


def test_no_change_says_how_wide_a_fixed_regression_could_hide_between_probes() -> None:
    # "No change" is about the probed commits: a regression fixed again between two of them shows at
    # neither. The report says how many commits in a row went unprobed, and how to look; with a
    # scan (`--bumps`), how wide what it could still miss is, and no hint. (Without one a search
    # scans before it says "no change", unless told not to: `quiet_scan`.)
    from sweeper.reports.bisect import render

    cs = commits(60)
    report_search = Search(cs, SearchOptions(quiet_scan=None))
    report = drive(report_search, lambda i: {"a": 0.3}, k=4)
    summary = summary_of(report, cs)
    (cell,) = summary["cells"]
    gaps = [b - a - 1 for a, b, _ in report.modes[0].gaps]
    assert cell["widest_unprobed"] == report.widest_unprobed == max(gaps) > 3 and summary["bump_width"] is None
    assert summary["quiet_scan"] is None
    summary["confidence"] = min(report.modes[0].no_change, 0.9)
    # The scan a user could ask for, priced: the starts it adds to these probes, and their GPU time.
    quote = cell["bump_scan"]
    assert quote["width"] == 3 and quote["server_starts"] == sum(g // 3 for g in gaps) > 0
    line = f"  no change in the range (none of 1.15x or more in the odds of failing); a regression fixed again " \
           f"within {max(gaps)} commits could lie between two probed ones (--bumps 3 probes every 3 commits: " \
           f"about {quote['server_starts']} more server starts, {quote['gpu_seconds'] / 3600:.1f} GPU-h)"
    assert line in render(summary).splitlines()
    # The same search resumed with the scan adds those starts and nothing else here (a steady rate).
    resumed = Search(cs, SearchOptions(bump_width=3), observations=report_search.observations)
    rescanned = drive(resumed, lambda i: {"a": 0.3}, k=4)
    assert rescanned.probes - report.probes == quote["server_starts"]
    assert rescanned.gpu_s - report.gpu_s == pytest.approx(quote["gpu_seconds"])
    assert rescanned.scan_quote is None and "bump_scan" not in summary_of(rescanned, cs)["cells"][0]
    scanned = drive(Search(cs, SearchOptions(bump_width=3)), lambda i: {"a": 0.3}, k=4)
    summary = summary_of(scanned, cs)
    assert summary["bump_width"] == 3 and summary["cells"][0]["widest_unprobed"] <= 2 and summary["quiet_scan"] is None
    # The default search makes that scan before it says "no change", and says it made it.
    default = drive(Search(cs), lambda i: {"a": 0.3}, k=4)
    assert default.probes == rescanned.probes and summary_of(default, cs)["quiet_scan"] == 3
    summary["confidence"] = min(scanned.modes[0].no_change, 0.9)
    text = render(summary)
    assert "could lie between two probed ones" in text and "--bumps" not in text


def test_a_bad_endpoint_that_passes_says_a_fixed_regression_could_hide_inside() -> None:
    # Nothing fails anywhere: the bad endpoint passes, and a regression fixed again inside the range
    # would show at neither end; the report says how wide one could be and how to look for it.
    from sweeper.reports.bisect import render

    cs = commits(40)
    report = drive(Search(cs, SearchOptions(quiet_scan=None)), lambda i: {}, k=2)
    assert report.bad_endpoint is BadEndpoint.PASSES and report.widest_unprobed == 39
    text = render(summary_of(report, cs))
    assert "the bad endpoint passes: nothing fails there" in text
    assert "; a regression fixed again within 39 commits could lie between two probed ones (--bumps 3 probes " \
           "every 3 commits: about " in text


def test_a_rate_that_varies_between_starts_earns_a_commit_more_starts() -> None:
    """Each start draws its own rate: only more starts narrow a commit's rate, so such a search may
    start a commit up to max_starts_varying times; a steady rate keeps max_starts_per_commit, or the
    max_starts_in_doubt of the two commits beside a step still in doubt."""
    def starts_per_commit(icc: float) -> int:
        # (A budget: the search would otherwise go on, on evidence, to locate the change.)
        search = Search(commits(30), SearchOptions(max_samples=9000))
        history = {"a": 0.093}, {"a": 0.167}
        drive(search, lambda i: history[i >= 21], k=4, rng=np.random.default_rng(0), icc=icc)
        return max(Counter(r.index for r in search._probes).values())

    options = SearchOptions()
    assert options.max_starts_in_doubt < starts_per_commit(0.15) <= options.max_starts_varying
    assert starts_per_commit(0.0) <= options.max_starts_in_doubt


def test_a_location_sure_only_at_a_low_dispersion_is_not_claimed() -> None:
    """Counts of an independently generated history (a 2.5 % -> 10 % regression at c25, starts
    varying with ICC 0.07) where three commits before the change drew high rates by chance. Mixed
    over the dispersions, the posterior puts the change at c13 with 0.992; at ICC 0.03, which the
    data leave about half as credible as 0.01, it is 0.984. The claim is the lower figure, not
    settled, and the search starts another server next to the gap."""
    data = {0: [(64, 0), (64, 3)], 3: [(46, 1), (228, 0)], 4: [(205, 1)], 5: [(65, 0), (228, 7)],
            6: [(46, 0), (205, 0), (128, 0)], 9: [(140, 0)], 10: [(65, 0), (110, 0)], 11: [(65, 1), (165, 0), (228, 0)],
            12: [(48, 0), (110, 0), (205, 0), (128, 4)], 13: [(46, 1), (65, 4), (165, 10)], 14: [(46, 5), (110, 9)],
            15: [(48, 7)], 18: [(140, 4)], 21: [(48, 1)], 24: [(48, 2)], 27: [(64, 6)], 53: [(64, 5)],
            80: [(64, 4), (64, 6)]}
    search = Search(commits(80))
    for i, starts in data.items():
        for n, k in starts:
            search.tell(f"c{i}", n, {"tool_json": k})
    post = search.mode_posterior("tool_json")
    gap = post.points.index(12)
    assert post.gap_change[gap] > 0.99 > post.gap_change_low[gap] > 0.95
    (change,) = search.result().modes[0].changes
    assert change.commit == "c13" and change.confidence == pytest.approx(post.gap_change_low[gap])
    assert not change.found and not search.done
    assert {r.commit for r in search.ask(4)} & {"c12", "c13"}
