"""The search finds what is there: small changes, short bumps, a drift, and no certainty from a
clean stretch. Scripted counts: each history below is exact and repeatable."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from sweeper.bisect import BadEndpoint, BisectReport, Direction, Observation, Search, SearchOptions
from sweeper.bisect.drift import PointCounts, find_drifts
from sweeper.bisect.segments import Prior, Start, posterior

Counts = Callable[[int, int, int], int]  # (commit index, samples, start number there) -> failures


def run(search: Search, failures: Counts, *, k: int = 4) -> BisectReport:
    starts: Counter[int] = Counter()
    while not search.done:
        reqs = search.ask(k)
        if not reqs:
            break
        for req in reqs:
            search.tell(req.commit, req.samples, {"m": failures(req.index, req.samples, starts[req.index])})
            starts[req.index] += 1
    return search.result()


def scripted(rate: Callable[[int], float]) -> Counts:
    return lambda i, n, _start: round(rate(i) * n)


def commits(n: int) -> list[str]:
    return [f"c{i}" for i in range(n + 1)]


def test_a_zero_stretch_before_a_small_change_does_not_move_the_change() -> None:
    # Clean before c30, 2 % from c30 on; every commit's first start after c30 is clean by bad luck.
    n = 60

    def failures(i: int, samples: int, start: int) -> int:
        return 0 if i < 30 or start == 0 else round(0.02 * samples)

    rep = run(Search(commits(n), SearchOptions()), failures)
    claimed = [c for c in rep.changes if c.confidence >= 0.99]
    assert all("c30" in c.candidates for c in claimed), [(c.commit, c.confidence) for c in claimed]
    # Found, though 2 % is a small rate: probes are sized for it, not for a 3x jump.
    assert [(c.commit, c.found) for c in rep.changes] == [("c30", True)]


def test_every_found_change_rests_on_two_starts_each_side() -> None:
    # Scripted counts vary not at all between starts (the learned ICC is ~0), and still a change
    # is found only with two starts on each side of it.
    search = Search(commits(100), SearchOptions())
    rep = run(search, scripted(lambda i: 0.6 if i >= 61 else 0.05), k=1)
    (change,) = [c for c in rep.changes if c.found]
    starts = Counter(o.commit for o in search.observations)
    assert (change.last_before, change.commit) == ("c60", "c61")
    assert starts["c60"] >= 2 and starts["c61"] >= 2


def test_a_bump_between_two_probed_commits_is_looked_into() -> None:
    # 2 % everywhere but c40..c44 (30 %): good and bad alike, a regression and its fix between.
    rate = scripted(lambda i: 0.3 if 40 <= i < 45 else 0.02)
    rep = run(Search(commits(100), SearchOptions()), rate)
    found = {(c.direction, c.commit) for c in rep.changes if c.found}
    assert (Direction.REGRESSION, "c40") in found
    assert (Direction.FIX, "c45") in found


def test_no_change_is_decided_on_evidence_or_left_undecided_with_its_cost() -> None:
    flat = scripted(lambda i: 0.1)
    rep = run(Search(commits(30), SearchOptions()), flat)
    (mode,) = rep.modes
    assert mode.no_change >= 0.99 and mode.decided
    short = run(Search(commits(30), SearchOptions(max_samples=600)), flat)
    (mode,) = short.modes
    assert not mode.decided and mode.to_decide_samples > 0
    assert short.to_decide_s > 0 and short.undecided == (mode,)


def test_a_linear_drift_is_flagged_instead_of_a_staircase() -> None:
    def rate(i: int) -> float:
        return 0.02 + 0.18 * min(1.0, max(0.0, (i - 30) / 20))

    rep = run(Search(commits(80), SearchOptions()), scripted(rate))
    (mode,) = rep.modes
    assert mode.drifts, [(c.commit, c.confidence) for c in mode.changes]
    d = mode.drifts[0]
    assert 25 <= int(d.first[1:]) <= 40 and 40 <= int(d.last[1:]) <= 55
    # No confident steps inside the ramp.
    assert not [c for c in mode.changes if c.found and 32 <= int(c.commit[1:]) <= 50]
    # bisect.json names the drift and the text says it.
    from sweeper.reports.bisect import ReportCell, describe, named_commits, render

    info = {c: {"sha": c, "short": c, "subject": c, "pr": None, "date": None} for c in named_commits([rep])}
    summary = describe([rep], [ReportCell({}, "(the only cell)", "")], commits(80), info)
    (drift,) = summary["cells"][0]["modes"][0]["drifts"]
    assert (drift["first"], drift["last"]) == (d.first, d.last)
    assert f"drifts between {d.first} and {d.last}" in render(summary)


def test_a_drift_too_gentle_for_any_confident_step_is_flagged() -> None:
    # Every commit of the ramp moves the rate by a fraction of a percent: no gap ever holds a
    # change more likely than not (a gentle ramp) or just one (a steeper one), so there is no
    # staircase to compare with a ramp; the search still says where the rate drifts.
    for p0, p1, first, width, n in [(0.02, 0.06, 30, 20, 80), (0.03, 0.09, 20, 15, 60)]:
        def rate(i: int, p0: float = p0, p1: float = p1, first: int = first, width: int = width) -> float:
            return p0 + (p1 - p0) * min(1.0, max(0.0, (i - first) / width))

        rep = run(Search(commits(n), SearchOptions()), scripted(rate))
        (mode,) = rep.modes
        assert mode.drifts, (p0, p1, [(c.commit, c.confidence) for c in mode.changes])
        d = mode.drifts[0]
        assert int(d.first[1:]) <= first + width and int(d.last[1:]) >= first, (d.first, d.last)
        assert not [c for c in mode.changes if c.found]


def test_a_lone_step_is_a_drift_only_when_a_ramp_fits_clearly_better() -> None:
    # A step between c20 and c21 with flat sides: a ramp has nothing to gain.
    step = [PointCounts(i, round((0.02 if i <= 20 else 0.04) * 2000), 2000) for i in [*range(10, 21, 2), 21, *range(22, 31, 2)]]
    assert find_drifts(step, [(5, True)], lone=frozenset({5})) == []
    # A ramp from c10 to c30 seen at every other commit, its lone "step" in the middle.
    ramp = [PointCounts(i, round((0.02 + 0.04 * (i - 10) / 20) * 2000), 2000) for i in range(10, 31, 2)]
    assert find_drifts(ramp, [(5, True)], lone=frozenset({5}))
    # ...and not checked at all unless the search marks the gap as one it can do no more on.
    assert find_drifts(ramp, [(5, True)]) == []


def test_two_steps_with_a_plateau_are_not_a_drift() -> None:
    pts = [PointCounts(i, round(r * 400), 400) for i, r in
           [(0, 0.02), (10, 0.02), (19, 0.02), (20, 0.08), (30, 0.08), (40, 0.08), (49, 0.08), (50, 0.3), (60, 0.3)]]
    assert find_drifts(pts, [(2, True), (6, True)]) == []
    ramp = [PointCounts(i, round((0.02 + 0.28 * i / 60) * 400), 400) for i in range(0, 61, 6)]
    assert find_drifts(ramp, [(2, True), (5, True), (8, True)])


def test_more_samples_per_start_when_starts_agree_more_starts_when_they_vary() -> None:
    quiet = Search(commits(20), SearchOptions())
    assert quiet._batch(0.05, 0.065, 0.0) > 1000
    assert quiet._batch(0.05, 0.065, 0.2) < 50  # past ~sqrt(start_s / (request_s rho)) a new start is cheaper


def flat(seed: int, step_at: int | None = None, ratio: float = 1.0) -> list[Start]:
    """40 commits 5 apart, one start of 1,700 samples each at 6.69 % (times `ratio` from the
    `step_at`-th on): 68,000 samples, drawn with `seed`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [Start(i * 5, int(rng.binomial(1700, 0.0669 * (ratio if step_at is not None and i >= step_at else 1))),
                  1700) for i in range(40)]


def test_a_constant_rate_seen_in_tens_of_thousands_of_samples_is_not_cut_in_two() -> None:
    # 40 commits, one start of 1,700 samples each, all at 6.69 %: 68,000 samples of one rate. On a
    # grid of rates coarser than their likelihood, the pooled rate sat between two grid rates and a
    # split let each half sit nearer one: P(no change) fell to 0.000 in 7 of these 20 draws.
    for seed in range(20):
        post = posterior(flat(seed), 200, Prior.default())
        assert post.gap_change.max() < 0.5 and post.no_change > 0.9, (seed, post.no_change)


def test_the_refined_grid_is_the_same_prior() -> None:
    # Weights sum to one (with the atom at 0), the rates stay sorted, and a grid already fine enough
    # for a few samples is left as it is.
    import numpy as np

    prior = Prior.default(zero_mass=0.3)
    assert prior.refined([1, 2], [60, 60]) is prior
    fine = prior.refined([1700, 1600, 1800], [25000, 25000, 25000])
    assert fine.rates.size > prior.rates.size
    assert np.all(np.diff(fine.rates) > 0)
    assert abs(float(np.exp(fine.log_w).sum()) - 1) < 1e-9
    assert abs(float(np.exp(fine.log_w[0])) - 0.3) < 1e-12
    # The prior mass below 5 %, a logit-uniform quantity, is the same on either grid.
    below = [float(np.exp(p.log_w[1:][p.rates[1:] < 0.05]).sum()) for p in (prior, fine)]
    assert abs(below[0] - below[1]) < 0.01, below


def test_a_change_only_a_capped_end_could_show_is_left_undecided_not_sampled_without_end() -> None:
    # A 1.4x step at c1: the good endpoint alone holds the old rate. Once c0 has had every start it
    # may, only it could tell the step from none, and samples elsewhere no longer move the answer:
    # the search stops with the mode undecided and its cost. (Sampling every other commit instead
    # took up to 150 starts on these draws.)
    import numpy as np

    for seed in range(8):
        rng = np.random.default_rng(seed)
        rep = run(Search(commits(46), SearchOptions()),
                  lambda i, n, _start, rng=rng: int(rng.binomial(n, 0.0206 if i == 0 else 0.0297)))
        assert rep.probes <= 70, (seed, rep.probes)
        for mode in rep.modes:
            assert mode.decided or mode.to_decide_samples > 0


def test_no_change_is_reached_on_a_constant_rate_and_a_1_3x_step_is_still_a_change() -> None:
    # "No change" is none of `SAME_WITHIN` (1.15x in the odds) or more: a continuous prior always
    # keeps some mass on a step too small for any data to rule out, and it held P(no change) under
    # 0.99 on 8 of these 20 draws of one rate (68,000 samples). A 1.3x step stays a change.
    reached = 0
    for seed in range(20):
        reached += posterior(flat(seed), 200, Prior.default()).no_change >= 0.99
        assert posterior(flat(seed + 100, step_at=20, ratio=1.3), 200, Prior.default()).no_change < 0.01, seed
    assert reached >= 18, reached


def test_a_bad_endpoint_passes_only_on_clean_samples_from_several_starts() -> None:
    # Two clean starts (64, 395) held the 459 samples that bound a steady rate under 1 %, and the bad
    # endpoint "passed"; a 4 % rate varying between starts with ICC 0.1 is clean in both 11 % of the
    # time. The same samples must now come from `pass_starts` starts.
    search = Search([f"c{i}" for i in range(21)])
    asked = []
    while not search.done:
        for req in search.ask(4):
            if req.commit == "c20":
                asked.append(req.samples)
            search.tell(req.commit, req.samples, {})
    report = search.result()
    assert report.bad_endpoint is BadEndpoint.PASSES
    assert len(asked) == 6 and sum(asked) >= 459  # the default pass_starts
    assert max(asked[2:]) <= 100  # the missing samples shared among the missing starts

    # Clean in three starts of 459 samples: not yet a pass; a failure in the fourth makes a mode.
    search = Search([f"c{i}" for i in range(21)])
    for n in (64, 64, 331):
        search.tell("c20", n, {})
    for _ in range(2):
        search.tell("c0", 64, {})
    assert search.bad_endpoint() is BadEndpoint.UNDECIDED
    assert any(r.commit == "c20" for r in search.ask(4))
    search.tell("c20", 83, {"fsm_log": 5})
    assert search.bad_endpoint() is BadEndpoint.FAILS


def _told(n: int, counts: dict[int, list[tuple[int, int]]]) -> Search:
    """A search over c0..cn already told these starts: commit index -> [(failures, samples), ...]."""
    obs = [Observation(f"c{i}", samples, {"m": k}) for i, starts in counts.items() for k, samples in starts]
    return Search(commits(n), SearchOptions(), observations=obs)


# A 1.6x step at c26 (4.4 % -> 7 %), probed on both sides of it, among single starts of 80-113 samples.
_AROUND = {0: [(3, 64)] * 2, 13: [(5, 113)], 20: [(4, 80)], 24: [(4, 100)], 27: [(7, 100)], 30: [(7, 100)],
           40: [(6, 80)], 50: [(6, 80)]}


def test_the_two_sides_of_an_unsure_step_get_starts_sized_for_their_own_contrast() -> None:
    # The same mode also jumps to 37 % at c51. Planned for that contrast (the mode's largest), the
    # sides of the unsure step at c26 got starts of 19 samples, and reached their cap of starts
    # with the step still in doubt (P 0.4 after 6 starts of 17 samples each side, in a benchmark history).
    search = _told(60, {**_AROUND, 25: [(14, 320), (15, 320)], 26: [(29, 320), (27, 320)],
                        51: [(24, 64)] * 2, 52: [(24, 64)], 55: [(24, 64)], 60: [(24, 64)] * 2})
    post = search.mode_posterior("m")
    assert post.gap_change[post.points.index(25)] > 0.01 and post.gap_change[post.points.index(50)] > 0.99
    asked = {req.commit: req.samples for req in search.ask(4)}
    side = asked.get("c25", asked.get("c26"))
    assert side is not None and side >= 300, asked


def test_a_step_in_doubt_past_the_cap_of_starts_gets_more_starts() -> None:
    # Both sides of the step have had the 6 starts a commit gets while starts agree (the learned ICC
    # is ~0), and P(change) is 0.26: the search stopped there, leaving the step unclaimed. The sides
    # of a step in doubt may have more (`max_starts_in_doubt`).
    search = _told(60, {**_AROUND, 60: [(5, 64)] * 2,
                        25: [(k, 320) for k in (13, 15, 14, 12, 16, 15)], 26: [(k, 320) for k in (24, 21, 22, 20, 23, 22)]})
    post = search.mode_posterior("m")
    assert post.rho < 0.02 and 0.05 < post.gap_change[post.points.index(25)] < 0.95
    asked = [req.commit for req in search.ask(4)]
    assert {"c25", "c26"} & set(asked), asked


def test_one_odd_start_gets_a_second_start_not_more_samples_at_the_ends() -> None:
    # Clean everywhere but one start of 9/64 at c23 (a bump one commit wide, or one odd start): the
    # model leaves P(no change) short, and only a second start at c23 can tell which. The search
    # sampled the ends instead, 70 starts of them, and stopped at P(no change) 0.77.
    clean = {i: [(0, 64)] for i in range(3, 119, 3) if i != 24}
    search = _told(119, {**clean, 0: [(0, 500)] * 6, 119: [(0, 500)] * 6, 23: [(9, 64)]})
    post = search.mode_posterior("m")
    assert 0.01 < post.no_change < 0.99 and max(post.gap_change) < 0.05
    assert [req.commit for req in search.ask(1)] == ["c23"]


def test_a_bump_pooled_into_a_clean_segment_is_not_below_resolution() -> None:
    # A bump at c22..c24 in a clean range, its edges in doubt (c21 and c25 have 25 samples each):
    # no gap is over 0.5, so no segment is cut, and the one pooled segment is credibly under 1 %.
    # The search took the whole mode for below its resolution, and the doubtful edges for changes
    # too small to matter, and stopped with P(no change) at 0.02 and the bump unclaimed.
    clean = {i: [(0, 64)] for i in [*range(2, 16, 2), *range(16, 31), *range(32, 300, 2)]}
    search = _told(300, {**clean, 0: [(0, 500)] * 6, 300: [(0, 500)] * 6, 20: [(0, 25)], 21: [(0, 25)],
                         22: [(2, 64)], 23: [(6, 64)], 24: [(3, 89)] * 2, 25: [(0, 25)], 26: [(0, 25)]})
    post = search.mode_posterior("m")
    assert max(post.gap_change) < 0.5 and post.no_change < 0.05 and len(post.segments) == 1
    assert {"c21", "c25"} <= {req.commit for req in search.ask(4)}


def test_a_bump_scan_leaves_no_stretch_of_its_width_unprobed() -> None:
    # Nothing fails at either end, so no mode is seen, and a search without a scan ends there; with
    # `bump_width` 3 every run of three testable commits gets a probe, and the bump at c40..c42 (30 %
    # from a clean rate) is found, its regression and its fix.
    def failures(i: int, samples: int, start: int) -> int:
        return round(0.3 * samples) if 40 <= i <= 42 else 0

    plain = Search(commits(90), SearchOptions(quiet_scan=None))
    assert run(plain, failures).changes == ()
    assert plain.result().widest_unprobed > 3
    search = Search(commits(90), SearchOptions(bump_width=3))
    search.tell_skip("c11", "untestable")
    rep = run(search, failures)
    assert rep.widest_unprobed <= 2 and rep.bump_width == 3
    found = [(c.direction, c.commit) for c in rep.changes if c.found]
    assert found == [(Direction.REGRESSION, "c40"), (Direction.FIX, "c43")], found


def test_a_search_that_would_say_nothing_changed_scans_for_a_fixed_regression_first() -> None:
    # By default (`quiet_scan` 3) a search about to report no change, here with nothing failing at
    # either end, first probes every run of three commits: the bump at c61..c63 is found unasked.
    def failures(i: int, samples: int, start: int) -> int:
        return round(0.3 * samples) if 61 <= i <= 63 else 0

    rep = run(Search(commits(90), SearchOptions()), failures)
    found = [(c.direction, c.commit) for c in rep.changes if c.found]
    assert found == [(Direction.REGRESSION, "c61"), (Direction.FIX, "c64")], found
    # Ends that fail alike, at 5 %, and nothing between: the scan leaves no run of three unprobed, and
    # only then is "no change" said.
    quiet = run(Search(commits(90), SearchOptions()), scripted(lambda i: 0.05))
    assert quiet.changes == () and quiet.widest_unprobed <= 2 and quiet.scan_quote == (3, 0, 0.0)


def test_a_search_that_locates_a_change_makes_no_scan_it_was_not_asked_for() -> None:
    # The scan before "no change" costs nothing where a change is found: the same probes, sample for
    # sample, as a search that never scans, and the report still prices the scan it did not make.
    def searched(options: SearchOptions) -> tuple[Search, BisectReport]:
        search = Search(commits(120), options)
        return search, run(search, scripted(lambda i: 0.12 if i >= 77 else 0.03))

    default, rep = searched(SearchOptions())
    never, rep_never = searched(SearchOptions(quiet_scan=None))
    assert [(c.commit, c.found) for c in rep.changes] == [("c77", True)]
    assert default.observations == never.observations
    assert rep.scan_quote == rep_never.scan_quote and rep.scan_quote is not None and rep.scan_quote[1] > 0


def test_a_bump_width_below_one_is_refused() -> None:
    import pytest

    from sweeper.errors import BisectError

    with pytest.raises(BisectError, match="bump_width"):
        Search(commits(10), SearchOptions(bump_width=0))
    with pytest.raises(BisectError, match="quiet_scan"):
        Search(commits(10), SearchOptions(quiet_scan=0))


def test_a_gpu_budget_stops_the_rounds_and_says_what_deciding_would_cost() -> None:
    """`max_gpu_s` (what `sweep bisect --budget` sets): no round is asked once the modelled GPU-seconds
    of the starts told reach it, and the open mode is reported undecided with its cost; resumed with
    a larger budget from the same observations, the search goes on and finds the change."""
    step = scripted(lambda i: 0.02 if i < 37 else 0.05)
    tight = Search(commits(80), SearchOptions(max_gpu_s=4 * 3600))
    report = run(tight, step)
    last = max(o.round for o in tight.observations)
    o = tight.options
    before_last = sum(o.start_s + o.request_s * obs.samples for obs in tight.observations if obs.round < last)
    assert tight.done and not report.done and before_last < 4 * 3600 <= report.gpu_s
    assert report.undecided and report.to_decide_s > 0
    more = Search(commits(80), SearchOptions(max_gpu_s=40 * 3600), observations=tight.observations)
    found = run(more, step)
    assert found.gpu_s > report.gpu_s and [c.commit for c in found.changes if c.found] == ["c37"]


def test_two_commits_of_one_crash_get_no_starts_to_tell_99_0_from_99_1_percent() -> None:
    """An engine that dies after 2 answers from c2 on: a start of n requests fails n - 2 of them, 99 %
    of 208. The posterior resolves odds, and near a rate of 1 odds are fine-grained: c2 and c3 held
    P 0.02 of a change between them while 24 starts a side went to telling 99.0 % from 99.1 %. Their
    own counts bound them within `min_contrast` of each other: no change the search is after."""
    search = Search(commits(3))
    report = run(search, lambda i, n, _s: max(0, n - 2) if i >= 2 else 0, k=2)
    assert [(c.commit, c.found) for c in report.changes] == [("c2", True)]
    starts = Counter(p.index for p in search._probes)
    assert max(starts[2], starts[3]) <= 3 and len(search._probes) <= 20, starts


# Three changes in one mode (3.7 % -> 1.5 % at c17, -> 5.0 % at c23, -> 22 % at c44; c24 does not
# build), where a search ended: c44 found, the dip c17..c22 between split probes of 34-57 samples
# that rates of 1.5-5 % leave clean as often as not.
_THIN = {0: [(2, 64), (1, 64)], 6: [(1, 57)], 11: [(1, 57)], 12: [(0, 40), (7, 304), (17, 408)],
         13: [(3, 40), (14, 304)], 14: [(2, 40)], 15: [(1, 40), (8, 202)], 16: [(6, 64), (7, 202)],
         21: [(0, 34)], 22: [(0, 34)], 23: [(3, 34)], 25: [(0, 34)], 26: [(1, 34), (8, 219)],
         27: [(3, 34), (7, 171)], 32: [(5, 64)], 38: [(4, 42)], 43: [(1, 42), (5, 73)], 44: [(12, 68), (24, 113)],
         45: [(19, 68)], 46: [(16, 68)], 47: [(12, 68)], 48: [(18, 64), (17, 64)]}


def test_a_step_spread_thin_over_split_probes_gets_a_deeper_probe() -> None:
    def told(options: SearchOptions) -> Search:
        obs = [Observation(f"c{i}", n, {"m": k}) for i, starts in _THIN.items() for k, n in starts]
        search = Search(commits(48), options, observations=obs)
        search.tell_skip("c24", "untestable")
        return search

    search = told(SearchOptions())
    post = search.mode_posterior("m")
    stretch = [a for a, x in enumerate(post.points) if x < 43]  # every gap from c0 to c43
    assert max(post.gap_change[a] for a in stretch) < search.explore
    assert sum(post.gap_change[a] for a in stretch) >= SearchOptions().spread_explore
    assert post.gap_change[post.points.index(43)] > 0.99  # c44 is found
    # The thinnest probe of the stretch, sized to see a 2x step there.
    assert [(r.commit, r.samples) for r in search.ask(4)] == [("c21", SearchOptions().spread_batch)]
    assert told(SearchOptions(spread_explore=1.5)).done  # where the search ended without it


# Three changes in one mode (4.1 % -> 0.9 % at c51, -> 3.7 % at c60, -> 10 % at c67; c21 and c51 do
# not build), where a search ended with c67 found: the dip showed only as c53 at 1 of 127 and c58 at
# 2 of 127 in a segment at 4.4 %, and no gap near it held over 0.03 of a change.
_DIP = {0: [(5, 64), (2, 64)], 11: [(4, 103)], 18: [(8, 146)], 25: [(10, 146)], 32: [(1, 64)], 40: [(8, 146)],
        48: [(7, 103)], 50: [(12, 233)], 53: [(1, 127)], 58: [(2, 127)], 63: [(1, 64)],
        66: [(2, 86), (5, 127), (12, 233)], 67: [(10, 103), (14, 194), (44, 390)],
        68: [(14, 86), (17, 127), (22, 233)], 70: [(6, 86)], 72: [(9, 86)], 74: [(7, 50)], 84: [(5, 50)],
        95: [(7, 64), (8, 64)]}


def test_a_dip_among_thin_probes_gets_a_deeper_start_in_it() -> None:
    def told(options: SearchOptions) -> Search:
        obs = [Observation(f"c{i}", n, {"m": k}) for i, starts in _DIP.items() for k, n in starts]
        search = Search(commits(95), options, observations=obs)
        search.tell_skip("c21", "untestable")
        search.tell_skip("c51", "untestable")
        return search

    search = told(SearchOptions())
    post = search.mode_posterior("m")
    before = post.points.index(66)
    assert max(post.gap_change[:before]) < 0.03  # nothing before c66 is worth a split
    assert post.gap_change[before] > 0.99  # c67 is found
    # c53, c58 and c63 pooled (4 of 318) against the rest of their segment (~5 %): one deeper start
    # at the thinnest of them, sized to see a 2x step (the spread rule's cap).
    assert [(r.commit, r.samples) for r in search.ask(4)] == [("c63", SearchOptions().spread_batch)]
    assert told(SearchOptions(odd_level=None)).done  # where the search ended without it


def test_an_odd_stretch_is_weighed_by_how_much_starts_vary() -> None:
    # The dip's state with c66..c68 settled by six starts a side, and starts elsewhere in the segment
    # that disagree (c40: 1 and 16 of 146; c95: 0 and 16 of 64): the learned dispersion is ~0.005, so
    # c53, c58 and c63, one start each of ~106 samples, weigh as ~1.5x fewer. 4 of 318 is then no
    # longer under odd_level against the segment, and nothing else is left to ask.
    starts = {i: list(s) for i, s in _DIP.items()}
    starts[66] = [(4, 100), (6, 100), (3, 100), (5, 100), (4, 100), (2, 100)]
    starts[67] = [(12, 100), (9, 100), (14, 100), (10, 100), (11, 100), (13, 100)]
    starts[68] = [(12, 100), (9, 100), (14, 100), (10, 100), (11, 100)]
    starts[40] += [(1, 146), (16, 146)]
    starts[95] += [(0, 64), (16, 64)]

    def told(varying: bool) -> Search:
        counts = starts if varying else {i: s for i, s in starts.items() if i not in (40, 95)} | {
            40: _DIP[40], 95: _DIP[95]}
        obs = [Observation(f"c{i}", n, {"m": k}) for i, s in counts.items() for k, n in s]
        search = Search(commits(95), SearchOptions(), observations=obs)
        search.tell_skip("c21", "untestable")
        search.tell_skip("c51", "untestable")
        return search

    steady, varying = told(False), told(True)
    assert steady.mode_posterior("m").rho < 0.001
    assert varying.mode_posterior("m").rho > 0.003
    assert [r.commit for r in steady.ask(4)] == ["c63"]  # steady starts: the stretch is odd
    assert varying.done  # varying starts: the same counts are what the dispersion allows


def test_a_step_located_under_varying_starts_settles_its_own_gap_not_every_neighbour() -> None:
    # Every commit of c0..c12 probed, starts of 18 samples varying a lot (learned ICC ~0.1): about
    # 1 % before c6, 8 % from it, one odd commit (c9) mostly clean. The step at c6 is still in doubt
    # (P 0.987), and the other gaps hold 1-2.4 % each, as odd starts leave them. Driving each of
    # those under 1 % too asked c0 and c3 here, and walked a benchmark step at ICC 0.26 from c66
    # down to c44 at 15-48 starts a commit (780 starts; 517 now, the step still unclaimed); only the
    # step's gap and its neighbours (its alternatives) are worth starts, as a gap under `explore` with
    # commits inside is not split either.
    low = [(0, 18)] * 12 + [(1, 18)]
    high = [(0, 18), (3, 18), (0, 18), (5, 18), (1, 18), (0, 18), (2, 18), (0, 18), (4, 18), (0, 18)]
    counts = {i: low if i < 6 else high for i in range(13)} | {9: [(0, 18)] * 9 + [(1, 18)]}
    search = _told(12, counts)
    post = search.mode_posterior("m")
    step = post.points.index(5)
    assert post.rho > 0.05 and 0.95 < post.gap_change[step] < 0.99
    others = [float(p) for a, p in enumerate(post.gap_change) if a != step]
    assert max(others) < 0.05 and sum(p > 0.01 for p in others) >= 5
    asked = {req.commit for req in search.ask(4)}
    assert asked and asked <= {"c4", "c5", "c6", "c7"}, asked
    # Where starts agree (learned ICC ~0), a gap's last percent is thin counts, and still settled.
    steady = _told(12, {i: [(1, 60), (0, 60)] if i < 6 else [(3, 60), (4, 60)] for i in range(13)}
                   | {9: [(1, 60), (2, 60)]})
    post = steady.mode_posterior("m")
    assert post.rho < 0.02 and 0.01 < post.gap_change[0] < 0.05
    assert {"c0", "c3"} & {req.commit for req in steady.ask(4)}


def test_a_step_in_doubt_with_both_sides_at_their_cap_gets_starts_in_its_segments_up_to_a_bound() -> None:
    # 0 -> about 2 % at c17, starts of 16 samples varying wildly (learned ICC ~0.35: one start in 16
    # fails 5 times, the rest are clean). c16 and c17 hold the 96 starts a commit gets where starts
    # vary, and the step is at P 0.94: what is left is a dispersion at which one segment explains
    # both sides. Without `capped_segment_starts` the search stops there; with it, it asks the
    # least-started commit of the two segments, and clean starts there raise the step's confidence.
    burst = [(0, 16)] * 15 + [(5, 16)]
    clean = [(0, 16)]
    counts = {0: clean * 33, **{i: clean for i in range(1, 15)}, 15: clean * 40, 16: clean * 96,
              17: burst * 6, 18: burst * 2, 19: burst * 2, 20: burst * 2}
    obs = [Observation(f"c{i}", n, {"m": k}) for i, s in counts.items() for k, n in s]
    assert not Search(commits(20), SearchOptions(capped_segment_starts=0), observations=obs).ask(4)

    def clean_starts(search: Search, most: int) -> int:
        told, asked = 0, search.ask(4)
        assert [r.commit for r in asked] == ["c14"], asked
        while asked and told < most:
            for r in asked:
                assert int(r.commit[1:]) <= 16, r  # the clean side: each clean start there speaks for the step
                search.tell(r.commit, r.samples, {"m": 0})
                told += 1
            asked = search.ask(4)
        return told

    search = Search(commits(20), SearchOptions(), observations=obs)
    post = search.mode_posterior("m")
    gap = post.points.index(16)
    before = float(post.gap_change_low[gap])
    assert post.rho > 0.2 and 0.9 < before < 0.99
    # (About 290 clean starts settle it at 0.99; 30 show the way in a tenth of the time.)
    assert clean_starts(search, 30) == 30
    after = search.mode_posterior("m")
    assert after.gap_change_low[after.points.index(16)] > before + 0.02
    # Bounded by the gap's own starts: at 1x, the two segments may hold 192 starts besides c16 and
    # c17. They hold 183, so 9 more, and the search stops with the step still in doubt.
    tight = Search(commits(20), SearchOptions(capped_segment_starts=1.0), observations=obs)
    assert clean_starts(tight, 1000) == 9
    assert tight.mode_posterior("m").gap_change_low[gap] < 0.99


# Three changes in one mode (3.1 % -> 1.4 % at c36, -> 8.5 % at c210, -> 4.0 % at c275; c163 and c220
# do not build), where a search ended with c210 and c275 found: the first change showed only as c0 at
# 4 of 128 and c33 at 1 of 79 beside a segment at 1.4 %, and the gaps from c0 to c209 held 0.09 of a
# change between them, none 0.05.
_THIRD = {0: [(3, 64), (1, 64)], 33: [(1, 79)], 65: [(1, 79)], 98: [(0, 64), (4, 256)], 131: [(7, 255)],
          142: [(0, 90)], 152: [(2, 90)], 164: [(0, 73), (3, 256)], 195: [(1, 64), (2, 256)],
          204: [(1, 73), (5, 256)], 206: [(1, 77)], 208: [(0, 77)], 209: [(1, 78), (1, 154)],
          210: [(8, 77), (6, 105)], 212: [(6, 73)], 228: [(20, 255)], 260: [(25, 255)], 265: [(8, 78)],
          269: [(9, 78)], 271: [(20, 183)], 272: [(19, 183)], 273: [(4, 78), (28, 321)],
          274: [(11, 134), (27, 277), (21, 245), (20, 255)], 275: [(9, 183), (16, 272), (15, 296), (10, 326)],
          276: [(7, 119), (12, 272), (12, 279), (10, 296)], 277: [(2, 77), (20, 459)], 279: [(5, 90), (8, 256)],
          280: [(6, 119), (11, 256)], 282: [(5, 119), (3, 256)], 285: [(2, 134)], 293: [(1, 64), (2, 64)]}


def test_a_range_expected_to_hold_several_changes_is_searched_for_the_third() -> None:
    def told(expected: float) -> Search:
        obs = [Observation(f"c{i}", n, {"m": k}) for i, starts in _THIRD.items() for k, n in starts]
        search = Search(commits(293), SearchOptions(prior=Prior.default(expected_changes=expected)), observations=obs)
        search.tell_skip("c163", "untestable")
        search.tell_skip("c220", "untestable")
        return search

    def before_c209(search: Search) -> float:
        post = search.mode_posterior("m")
        return float(sum(post.gap_change[:post.points.index(209)]))

    plain = told(1.0)  # the default: one change a range
    assert plain.done and before_c209(plain) < 0.1 and plain.result().expected_changes == 1.0
    search = told(2.0)
    post = search.mode_posterior("m")
    assert sum(p > 0.99 for p in post.gap_change) == 2  # c210 and c275, as before
    # Two changes a range: the stretch before c209 holds about twice the chance of another, and the
    # gap from c0 to c33 (c0 at 4 of 128, the segment at 1.4 %) is split.
    assert before_c209(search) > 0.15
    asked = [r.commit for r in search.ask(4)]
    assert [c for c in asked if int(c[1:]) < 33] == ["c9", "c17", "c25"], asked
    assert search.result().expected_changes == 2.0
