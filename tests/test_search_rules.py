"""Each rule of the failure search alone, on a view built by hand (`sweeper.bisect.rules`): the
posteriors are written down, not computed, so a test states the P(change) a rule sees."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from sweeper.bisect import rules
from sweeper.bisect.drift import Drift
from sweeper.bisect.options import SearchOptions
from sweeper.bisect.rules import BadEndpoint, Gap, Need
from sweeper.bisect.segments import ModePosterior, Segment
from sweeper.bisect.sizing import batch, bump_batch
from sweeper.bisect.view import SearchView

M = "m"


def seg(first: int, last: int, rate: float, high: float | None = None, low: float = 0.0) -> Segment:
    """A segment whose counts no rule reads here: only its span, rate and bounds."""
    return Segment(0, 0, 0, rate, low, rate * 2 + 0.01 if high is None else high, first, last)


def post(points: Sequence[int], gaps: Sequence[float], segments: Sequence[Segment], *, rho: float = 0.0,
         no_change: float = 0.0, low: Sequence[float] | None = None) -> ModePosterior:
    change = np.array(gaps, dtype=np.float64)
    return ModePosterior(tuple(points), change, no_change, np.array([1.0]), rho, tuple(segments),
                         change if low is None else np.array(low, dtype=np.float64))


def view(n: int, counts: dict[int, tuple[int, int, int]], posterior: ModePosterior | None = None, *,
         options: SearchOptions | None = None, skipped: Sequence[int] = (),
         drifts: Sequence[Drift] = ()) -> SearchView:
    """`counts`: commit index -> (starts, samples, failures of mode M)."""
    modes = (M,) if posterior is not None else ()
    return SearchView(options or SearchOptions(), n, modes,
                      starts={i: s for i, (s, _, _) in counts.items()},
                      samples={i: x for i, (_, x, _) in counts.items()},
                      failures={M: {i: k for i, (_, _, k) in counts.items()}} if modes else {},
                      skipped=frozenset(skipped),
                      posteriors={M: posterior} if posterior is not None else {},
                      drifts={M: list(drifts)} if modes else {},
                      probes=sum(s for s, _, _ in counts.values()))


def gap(v: SearchView, a: int) -> Gap:
    return rules.gaps(v, M)[a]


def rounded(need: Need | None) -> Need | None:
    """A need with its value rounded to 9 places, to compare with one written down."""
    return None if need is None else replace(need, value=round(need.value, 9))


def plan(wants: Sequence[Need], in_flight: set[int], k: int) -> dict[int, tuple[int, float]]:
    return {j: (n, round(value, 9)) for j, (n, value) in rules.plan_round(wants, in_flight, k).items()}


def test_endpoints_first_then_a_blind_split_of_the_interior() -> None:
    fresh = view(10, {})
    assert rules.needs(fresh) == [Need(10.0, (0,), 64), Need(10.0, (9,), 64),
                                  Need(0.5, tuple(range(1, 9)), 64, split=True)]
    # An untestable endpoint is not asked for; untestable commits are left out of the split.
    assert rules.endpoint_needs(view(10, {}, skipped=(0, 4))) == [
        Need(10.0, (9,), 64), Need(0.5, (1, 2, 3, 5, 6, 7, 8), 64, split=True)]
    # Once the interior has a start, the endpoints' second starts come alone.
    assert rules.endpoint_needs(view(10, {0: (1, 64, 0), 5: (1, 64, 0), 9: (1, 64, 0)})) == [
        Need(10.0, (0,), 64), Need(10.0, (9,), 64)]
    assert rules.endpoint_needs(view(10, {0: (2, 128, 0), 9: (2, 128, 0)})) == []


def test_the_bad_endpoint_gets_clean_samples_until_it_passes() -> None:
    assert rules.clean_needed(view(10, {})) == 459  # no failure in 459: a 1 % rate is ruled out at 99 %
    # 331 clean samples still missing, over the 4 of 6 starts still missing.
    undecided = view(10, {0: (2, 128, 0), 9: (2, 128, 0)})
    assert rules.bad_endpoint(undecided) is BadEndpoint.UNDECIDED
    assert rules.bad_passes_need(undecided) == Need(1.0, (9,), 83)
    # Enough samples, but on too few starts: a rate that varies between starts hides in two.
    assert rules.bad_passes_need(view(10, {0: (2, 128, 0), 9: (2, 600, 0)})) == Need(1.0, (9,), 16)
    passes = view(10, {0: (2, 128, 0), 9: (6, 600, 0)})
    assert rules.bad_endpoint(passes) is BadEndpoint.PASSES and rules.bad_passes_need(passes) is None
    fails = view(10, {0: (2, 128, 0), 9: (2, 128, 1)}, post([0, 9], [0.3], [seg(0, 9, 0.004)]))
    assert rules.bad_endpoint(fails) is BadEndpoint.FAILS and rules.bad_passes_need(fails) is None
    assert rules.bad_endpoint(view(10, {0: (2, 128, 0)}, skipped=(9,))) is BadEndpoint.UNTESTABLE


def test_a_mode_below_resolution_everywhere_wants_nothing() -> None:
    clean = post([0, 5, 9], [0.2, 0.2], [seg(0, 9, 0.0005, high=0.004)], no_change=0.5)
    counts = {0: (2, 1000, 0), 5: (1, 1000, 1), 9: (2, 1000, 0)}
    assert rules.below_resolution(view(10, counts, clean), M)
    assert rules.mode_needs(view(10, counts, clean), M) == []
    # One commit credibly above min_rate by its own counts (6 of 64), pooled into a clean segment.
    bump = {**counts, 5: (1, 64, 6)}
    assert not rules.below_resolution(view(10, bump, clean), M)
    assert rules.mode_needs(view(10, bump, clean), M) != []


def test_a_gap_that_may_hold_a_change_is_split() -> None:
    p = post([0, 10], [0.4], [seg(0, 0, 0.01), seg(10, 10, 0.2)], no_change=0.6)
    v = view(11, {0: (2, 128, 1), 10: (2, 128, 25)}, p, skipped=(3,))
    g = gap(v, 0)
    assert g.inside == (1, 2, 4, 5, 6, 7, 8, 9)
    assert rules.split_need(v, g) == Need(0.4, g.inside, batch(v.options, 0.01, 0.2, 0.0), split=True)
    below_explore = post([0, 10], [0.04], [seg(0, 0, 0.01), seg(10, 10, 0.2)])
    assert rules.split_need(v, gap(view(11, {}, below_explore), 0)) is None


def test_a_gap_whose_ends_agree_is_searched_for_a_bump_while_the_prior_allows_one() -> None:
    one = seg(0, 100, 0.02)
    wide = view(101, {0: (2, 128, 3), 20: (1, 64, 1), 100: (2, 128, 2)},
                post([0, 20, 100], [0.01, 0.01], [one]))
    # P(two or more changes among 20 commits) at one change per 100 positions.
    bump = 1 - 0.99 ** 20 - 20 * 0.01 * 0.99 ** 19
    assert rules.bump_probability(wide, 20) == pytest.approx(bump)
    assert rounded(rules.bump_need(wide, gap(wide, 0))) == Need(round(bump, 9), tuple(range(1, 20)),
                                                                bump_batch(wide.options, 0.02, 0.0), split=True)
    narrow = view(101, {}, post([0, 5, 100], [0.01, 0.01], [one]))
    assert rules.bump_need(narrow, gap(narrow, 0)) is None  # 0.001 on a bump of 5 commits
    apart = view(101, {}, post([0, 20, 100], [0.01, 0.01], [seg(0, 0, 0.02), seg(20, 100, 0.02)]))
    assert rules.bump_need(apart, gap(apart, 0)) is None  # the ends are two segments
    assert rules.split_need(wide, gap(wide, 0)) is None  # one rule per gap


def test_a_located_change_in_doubt_gets_a_start_on_its_thinner_side() -> None:
    p = post([0, 4, 5, 9], [0.0, 0.5, 0.0], [seg(0, 4, 0.002), seg(5, 9, 0.1)])
    counts = {0: (2, 400, 1), 4: (2, 200, 0), 5: (2, 100, 10), 9: (2, 400, 40)}
    v = view(10, counts, p)
    n = batch(v.options, 0.5 / 201, 10.5 / 101, 0.0)  # the two commits' own rates
    assert rules.doubt_need(v, gap(v, 1)) == Need(1.0, (5,), n)
    sure = view(10, counts, post([0, 4, 5, 9], [0.0, 0.995, 0.0], p.segments))
    assert rules.doubt_need(sure, gap(sure, 1)) is None
    # Two commits whose own counts leave no 1.3x step between them have no change to locate.
    alike = view(10, {**counts, 4: (2, 10000, 1000), 5: (2, 10000, 1040)}, p)
    assert rules.doubt_need(alike, gap(alike, 1)) is None
    # Both sides at their cap of starts: nothing more there (starts agree, so no segment fallback).
    capped = view(10, {**counts, 4: (24, 200, 0), 5: (24, 100, 10)}, p)
    assert rules.doubt_need(capped, gap(capped, 1)) is None


def test_a_located_change_needs_two_starts_on_each_side() -> None:
    p = post([0, 4, 5, 9], [0.0, 0.999, 0.0], [seg(0, 4, 0.002), seg(5, 9, 0.1)])
    one_side = view(10, {0: (2, 400, 1), 4: (2, 200, 0), 5: (1, 300, 30), 9: (2, 400, 40)}, p)
    g = gap(one_side, 1)
    assert rules.two_starts_need(one_side, g) == Need(0.5, (5,), rules.gap_batch(one_side, g))
    both = view(10, {0: (2, 400, 1), 4: (2, 200, 0), 5: (2, 300, 30), 9: (2, 400, 40)}, p)
    assert rules.two_starts_need(both, gap(both, 1)) is None
    assert rules.dispersion_need(one_side, g) is None  # the two-starts rule has that gap


def test_a_change_some_credible_dispersion_doubts_gets_more_starts() -> None:
    counts = {0: (2, 400, 1), 4: (3, 200, 0), 5: (2, 300, 30), 9: (2, 400, 40)}
    segments = [seg(0, 4, 0.002), seg(5, 9, 0.1)]
    doubted = view(10, counts, post([0, 4, 5, 9], [0.0, 0.999, 0.0], segments, low=[0.0, 0.9, 0.0]))
    assert rounded(rules.dispersion_need(doubted, gap(doubted, 1))) == Need(
        0.2, (5,), rules.gap_batch(doubted, gap(doubted, 1)))
    robust = view(10, counts, post([0, 4, 5, 9], [0.0, 0.999, 0.0], segments, low=[0.0, 0.995, 0.0]))
    assert rules.dispersion_need(robust, gap(robust, 1)) is None
    trusting = view(10, counts, doubted.posteriors[M], options=SearchOptions(robust_dispersion=False))
    assert rules.dispersion_need(trusting, gap(trusting, 1)) is None


def test_a_stretch_of_small_steps_failing_at_both_ends_gets_its_thinnest_probe_deepened() -> None:
    p = post([0, 10, 20, 30, 31, 40], [0.04, 0.04, 0.04, 0.9, 0.0],
             [seg(0, 30, 0.05), seg(31, 40, 0.4)])
    counts = {0: (2, 128, 2), 10: (1, 64, 2), 20: (1, 32, 1), 30: (1, 64, 12), 31: (2, 128, 50),
              40: (2, 128, 52)}
    v = view(41, counts, p)
    n = min(256, batch(v.options, 0.05, 0.1, 0.0))
    assert [rounded(need) for need in rules.spread_needs(v, M, set())] == [Need(0.12, (20,), n)]
    clean_end = view(41, {**counts, 0: (2, 128, 0)}, p)
    assert rules.spread_needs(clean_end, M, set()) == []  # left to the bump rules
    assert rules.spread_needs(v, M, {1}) == []  # a drift's gap breaks the stretch


def test_an_odd_stretch_inside_a_segment_gets_a_deeper_start() -> None:
    points = list(range(10))
    p = post(points, [0.01] * 9, [seg(0, 9, 0.2)], no_change=0.9)
    counts = {i: (1, 200, 40) for i in points} | {4: (1, 16, 0), 5: (1, 17, 0)}
    v = view(10, counts, p)
    (need,) = rules.odd_stretch_needs(v, M, set())
    assert need.commits == (4,) and need.value == 0.05 and need.samples > 17
    assert rules.odd_stretch_needs(view(10, counts, p, options=SearchOptions(odd_level=None)), M, set()) == []
    assert rules.odd_stretch_needs(v, M, {4}) == []  # in a drift: off the segment's rate by nature
    steady = {i: (1, 200, 40) for i in points}
    assert rules.odd_stretch_needs(view(10, steady, p), M, set()) == []


def test_no_change_is_claimed_on_evidence_from_more_samples_at_the_ends() -> None:
    p = post([0, 5, 9], [0.1, 0.1], [seg(0, 9, 0.05)], no_change=0.7)
    counts = {0: (2, 200, 10), 5: (2, 200, 10), 9: (2, 100, 5)}
    v = view(10, counts, p)
    assert [rounded(need) for need in rules.no_change_needs(v, M)] == [
        Need(0.3, (9,), batch(v.options, 0.05, 0.05, 0.0))]
    assert rules.no_change_needs(view(10, counts, post([0, 5, 9], [0.0, 0.0], p.segments, no_change=0.995)),
                                 M) == []
    # One start far off the rest: a second start there, not at the ends.
    odd = view(10, {**counts, 5: (1, 64, 20)}, p)
    assert rules.no_change_needs(odd, M)[0].commits == (5,)
    # The ends at their cap: any probed commit, while those between hold fewer samples than the ends.
    capped = view(10, {0: (6, 600, 30), 5: (1, 100, 5), 9: (6, 600, 30)}, p)
    assert rules.no_change_needs(capped, M)[0].commits == (5,)


def test_a_scan_leaves_no_run_of_its_width_unprobed() -> None:
    assert rules.scan_grid(tuple(range(1, 10)), 3) == (2, 5, 7)
    done = {0: (6, 600, 0), 10: (6, 600, 0)}
    v = view(11, done, options=SearchOptions(bump_width=4))
    assert rules.scan_needs(v, 4) == [Need(0.01, (3, 6), 64, split=True)]
    assert rules.needs(v) == rules.scan_needs(v, 4)
    # Without one asked for, the quiet scan comes when nothing else is wanted and no change is in view.
    assert rules.needs(view(11, done)) == [Need(0.01, (2, 5, 7), 64, split=True)]
    assert rules.needs(view(11, done, options=SearchOptions(quiet_scan=None))) == []
    assert rules.widest_unprobed(v) == 9 and rules.scan_quote(v, 3) == (3, 3, 3 * (240.0 + 64 * 2.0))


def test_gaps_inside_a_drift_want_nothing() -> None:
    p = post([0, 10, 20, 30], [0.6, 0.6, 0.6], [seg(0, 0, 0.01), seg(10, 10, 0.05), seg(20, 20, 0.1),
                                                   seg(30, 30, 0.2)])
    counts = {0: (2, 200, 2), 10: (2, 200, 10), 20: (2, 200, 20), 30: (2, 200, 40)}
    stepping = rules.mode_needs(view(31, counts, p), M)
    assert [n.commits[0] for n in stepping] == [1, 11, 21]
    ramp = Drift(0, 30, 0.01, 0.2, (0, 1, 2), 5.0)
    assert rules.drift_gaps(view(31, counts, p, drifts=[ramp]), M) == {0, 1, 2}
    assert rules.mode_needs(view(31, counts, p, drifts=[ramp]), M) == []


def test_a_drift_is_looked_for_only_among_several_changes() -> None:
    assert rules.drift_candidates(post([0, 1, 2, 3, 4], [0.2, 0.3, 0.4, 0.3], [seg(0, 4, 0.1)])) == [2]
    lone = post([0, 10, 20], [0.9, 0.0], [seg(0, 0, 0.01), seg(10, 20, 0.2)])
    v = view(21, {0: (2, 200, 2), 10: (2, 200, 40), 20: (2, 200, 40)}, lone)
    assert rules.mode_drifts(v, M) == []
    assert rules.mode_drifts(view(21, {}, lone, options=SearchOptions(drift=False)), M) == []


def test_a_round_merges_needs_by_commit_and_leaves_out_what_is_in_flight() -> None:
    wants = [Need(0.6, (5,), 100), Need(0.3, (5,), 200), Need(0.4, (8,), 50),
             Need(0.5, (1, 2, 3, 4), 64, split=True)]
    # Needs on one commit add up (0.9) and ask for the larger count.
    assert plan(wants, set(), 1) == {5: (200, 0.9)}
    # A split's first commit halves its gap (worth its value); two are worth log2(3) of it, shared.
    assert plan(wants, set(), 3) == {5: (200, 0.9), 3: (64, 0.5), 8: (50, 0.4)}
    each = round(0.5 * math.log2(3) / 2, 9)
    assert plan(wants, set(), 4) == {5: (200, 0.9), 2: (64, each), 3: (64, each), 8: (50, 0.4)}
    # In flight: not asked again; the split's four commits each worth log2(5) / 4 of it.
    each = round(0.5 * math.log2(5) / 4, 9)
    assert plan(wants, {5, 8}, 4) == {1: (64, each), 2: (64, each), 3: (64, each), 4: (64, each)}
