"""The metric bisect (`sweeper.bisect.metric_search`) driven by scripted values, and its posterior
(`sweeper.bisect.metric_model`) against brute-force enumeration."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from sweeper.bisect.metric_model import LevelGrid, MetricPrior, posterior, start_loglik
from sweeper.bisect.metric_search import Kind, MetricObservation, MetricSearch, MetricSearchOptions, Verdict
from sweeper.errors import BisectError

# Scripted start-to-start deviations (relative), cycled: a spread of about 1.2 %, mean 0.
RESIDUALS = (0.012, -0.008, 0.003, -0.015, 0.007, -0.002, 0.017, -0.011, 0.001, -0.006, 0.010, -0.013,
             0.005, -0.004, 0.014, -0.009, 0.0)
SE = 0.006  # every start's within-start standard error, relative


def scripted(level: Callable[[int], float], odd: dict[tuple[int, int], float] | None = None):
    """A start at commit i: its level times the next scripted deviation (the k-th start at i takes
    RESIDUALS[(7 i + k) % len]); `odd[(i, k)]` replaces the deviation of that start."""
    seen: dict[int, int] = {}
    odd = odd or {}

    def start(i: int) -> tuple[float, float]:
        k = seen.get(i, 0)
        seen[i] = k + 1
        dev = odd.get((i, k), RESIDUALS[(7 * i + k) % len(RESIDUALS)])
        value = level(i) * (1 + dev)
        return value, SE * value

    return start


def drive(search: MetricSearch, start: Callable[[int], tuple[float, float]], k: int = 4,
          rounds: int = 400) -> None:
    for _ in range(rounds):
        if search.done:
            return
        reqs = search.ask(k)
        assert sum(r.starts for r in reqs) <= k
        if not reqs:
            return
        for r in reqs:
            for _ in range(r.starts):
                search.tell(r.commit, *start(r.index))
    raise AssertionError("the search did not end")


def commits(n: int) -> list[str]:
    return [f"c{i}" for i in range(n + 1)]


def claims(report, at: float = 0.99):
    return [c for c in (*report.changes, *report.small_changes) if c.confidence >= at]


# ---- the posterior against brute force ------------------------------------------------------------


def _kernel(grid, prior):
    """The step's prior on the grid's offsets d = -(g - 1) .. g - 1, written out here: its size's density
    is a staircase through 1 / size over `bands` geometric bands from `resolution` to `max_step`, each
    band holding 1 / bands of the mass, as a mixture of uniforms over [resolution, edge) (either sign);
    on the lattice each uniform spreads its weight evenly over the offsets r0 < |d| <= r, where r is the
    last offset under its edge."""
    g = grid.mu.size
    edges = [prior.resolution * (prior.max_step / prior.resolution) ** (m / prior.bands) for m in range(prior.bands + 1)]
    density = [1 / prior.bands / (2 * (b - a)) for a, b in itertools.pairwise(edges)] + [0.0]
    r0 = math.ceil(prior.resolution / grid.step - 1e-9) - 1
    out = np.zeros(2 * g - 1)
    for m in range(prior.bands):
        weight = 2 * (edges[m + 1] - prior.resolution) * (density[m] - density[m + 1])
        r = max(r0 + 1, math.ceil(edges[m + 1] / grid.step - 1e-9) - 1)
        for d in range(-(g - 1), g):
            if r0 < abs(d) <= r:
                out[d + g - 1] += weight / (2 * (r - r0))
    return out


def _brute(index, y, se, n_positions, prior, grid):
    """Every segmentation of the points and every level of each segment on the grid, summed."""
    points = sorted(set(index))
    ll = start_loglik(np.array(y), np.array(se), grid, prior)
    idx = np.array(index)
    per_point = np.array([ll[idx == x].sum(axis=0) for x in points])  # (points, grid, taus)
    g = grid.mu.size
    kernel = _kernel(grid, prior)
    pi = prior.change_probability(n_positions)
    gaps = np.diff(points)
    r1 = grid.window(prior.material)
    total = np.zeros(len(prior.taus))
    gap_mass = np.zeros((len(prior.taus), len(points) - 1))
    material = np.zeros_like(gap_mass)
    none = np.zeros(len(prior.taus))
    for cuts in itertools.product([False, True], repeat=len(points) - 1):
        weight = math.prod(1 - (1 - pi) ** n if c else (1 - pi) ** n for c, n in zip(cuts, gaps, strict=True))
        bounds = [0, *[a + 1 for a, c in enumerate(cuts) if c], len(points)]
        segments = list(itertools.pairwise(bounds))
        at = [a for a, c in enumerate(cuts) if c]
        for levels in itertools.product(range(g), repeat=len(segments)):
            p = weight * grid.weight * math.prod(kernel[b - a + g - 1] for a, b in itertools.pairwise(levels))
            if p == 0:
                continue
            lik = np.exp(sum(per_point[lo:hi, lv, :].sum(axis=0) for (lo, hi), lv in zip(segments, levels,
                                                                                            strict=True)))
            mass = p * lik
            total += mass
            if not at:
                none += mass
            for a, (u, v) in zip(at, itertools.pairwise(levels), strict=True):
                gap_mass[:, a] += mass
                if abs(v - u) > r1:
                    material[:, a] += mass
    tau_post = total / total.sum()
    return (tau_post, (gap_mass / total[:, None]).T @ tau_post, (material / total[:, None]).T @ tau_post,
            float((none / total) @ tau_post))


def test_the_posterior_matches_brute_force_enumeration():
    prior = MetricPrior(resolution=0.02, material=0.05, width=0.15, max_step=0.2, bands=3, taus=(0.01, 0.03, 0.06))
    grid = LevelGrid(np.linspace(-0.02, 0.09, 12), 0.01, 0.0, 0.15)
    index = [0, 0, 2, 2, 3, 5, 5]
    y = [0.0, 0.01, 0.02, 0.05, 0.06, 0.07, 0.05]
    se = [0.01] * len(y)
    post = posterior(index, y, se, 5, prior, grid=grid)
    tau_post, gap, material, none = _brute(index, y, se, 5, prior, grid)
    np.testing.assert_allclose(post.tau_post, tau_post, rtol=1e-9)
    np.testing.assert_allclose(post.gap_change, gap, rtol=1e-9)
    np.testing.assert_allclose(post.gap_material, material, rtol=1e-9)
    assert post.no_change == pytest.approx(none, rel=1e-9)
    # No change of `material` or more: the brute force's segmentations whose every step is smaller.
    assert 0 < post.no_material < 1 and post.no_material >= post.no_change


# ---- the search on scripted values ----------------------------------------------------------------


def test_a_clear_step_is_located_with_an_interval_that_covers_it():
    n, at = 60, 37
    search = MetricSearch(commits(n), MetricSearchOptions(min_effect=0.03, higher_is_better=False))
    drive(search, scripted(lambda i: 40.0 * (1.10 if i >= at else 1.0)))
    report = search.result()
    assert report.verdict == Verdict.CHANGES
    (change,) = report.changes
    assert change.commit == f"c{at}" and change.located and change.found and change.confidence >= 0.99
    assert change.kind == Kind.REGRESSION  # TPOT up: slower
    assert change.effect_low <= 0.10 <= change.effect_high
    assert change.before_commit == f"c{at - 1}"


def test_outlier_starts_do_not_make_a_change():
    # Every commit at one level; the first two starts at c12, where the search first splits the range,
    # are 15 % high (a throttled GPU reads as a slower one for a latency, a noisy neighbour...). They
    # make no change, and cost at most four rounds of four starts over the same range without them (24
    # starts against 8): a Gaussian likelihood (nu = 1e6) gets to "no change" too, but with 52, its
    # spread between starts learned wide from the two.
    n = 24
    odd = {(12, 0): 0.15, (12, 1): 0.15}
    options = MetricSearchOptions(min_effect=0.03)
    clean = MetricSearch(commits(n), options)
    drive(clean, scripted(lambda i: 2.6))
    search = MetricSearch(commits(n), options)
    drive(search, scripted(lambda i: 2.6, odd))
    report = search.result()
    assert not claims(report), report.describe()
    assert report.verdict == Verdict.NO_CHANGE
    assert report.no_change >= 0.99
    assert search.starts <= clean.starts + 16, (search.starts, clean.starts)


def test_a_change_under_the_minimum_effect_is_no_change():
    n, at = 40, 21
    search = MetricSearch(commits(n), MetricSearchOptions(min_effect=0.03))
    drive(search, scripted(lambda i: 1800.0 * (0.99 if i >= at else 1.0)))  # 1 % slower throughput
    report = search.result()
    assert report.verdict == Verdict.NO_CHANGE
    assert not report.changes
    assert report.bound == pytest.approx(0.03)
    assert any("no change larger than 3.0%" in line for line in report.describe())


def test_a_drift_is_flagged_not_located():
    # The level rises 12 % linearly over c20..c49: no commit makes more than 0.4 %.
    n, first, width = 80, 20, 30

    def level(i: int) -> float:
        return 25.0 * (1 + 0.12 * min(1.0, max(0.0, (i - first + 1) / width)))

    search = MetricSearch(commits(n), MetricSearchOptions(min_effect=0.03, higher_is_better=False))
    drive(search, scripted(level))
    report = search.result()
    assert report.drifts, report.describe()
    (d,) = report.drifts
    assert int(d.first[1:]) <= first + width and int(d.last[1:]) >= first - 1
    assert d.effect > 0.05
    assert not any(c.found for c in report.changes)


def test_two_changes_in_one_range_are_both_located():
    n = 90
    search = MetricSearch(commits(n), MetricSearchOptions(min_effect=0.03))

    def level(i: int) -> float:
        return 3.0 * (1.08 if i >= 23 else 1.0) * (0.94 if i >= 71 else 1.0)

    drive(search, scripted(level))
    report = search.result()
    found = sorted((c.commit, c.kind) for c in report.changes if c.found)
    assert found == [("c23", Kind.IMPROVEMENT), ("c71", Kind.REGRESSION)], report.describe()


def test_stored_starts_are_used_before_the_first_ask():
    n, at = 30, 9
    start = scripted(lambda i: 100.0 * (0.9 if i >= at else 1.0))
    search = MetricSearch(commits(n), MetricSearchOptions(endpoint_starts=3))
    for i in (0, n):
        for _ in range(3):
            search.tell(f"c{i}", *start(i))
    first = search.ask(4)
    assert all(r.index not in (0, n) for r in first)  # the ends have their starts already
    for r in first:
        for _ in range(r.starts):
            search.tell(r.commit, *start(r.index))
    drive(search, start)
    resumed = MetricSearch(commits(n), MetricSearchOptions(endpoint_starts=3), observations=search.observations,
                           rounds=search.rounds)
    assert resumed.starts == search.starts and resumed.done
    assert [c.commit for c in resumed.result().changes if c.found] == [f"c{at}"]


def test_an_untestable_commit_is_never_asked_for_again():
    n, at = 16, 8
    search = MetricSearch(commits(n))
    start = scripted(lambda i: 50.0 * (1.2 if i >= at else 1.0))
    for _ in range(200):
        if search.done:
            break
        for r in search.ask(4):
            if r.index == at:
                search.tell_skip(r.commit, "install failed")
                continue
            for _ in range(r.starts):
                search.tell(r.commit, *start(r.index))
    report = search.result()
    (change,) = report.changes
    # Located as far as testing allows: the step is at c8 or c9, and c8 cannot be started.
    assert set(change.candidates) == {f"c{at}", f"c{at + 1}"} and change.located and change.found
    assert any("c8..c9 (2 commits, the others untestable)" in line for line in report.describe())
    assert report.skipped == ((f"c{at}", "install failed"),)
    assert MetricObservation(f"c{at}", skip_reason="install failed") in search.observations


def _drive_skipping(search: MetricSearch, start, untestable: set[int]) -> None:
    for _ in range(200):
        if search.done:
            break
        for r in search.ask(4):
            for _ in range(r.starts):
                if r.index in untestable:
                    search.tell_skip(r.commit, "engine crashed")
                else:
                    search.tell(r.commit, *start(r.index))


def test_an_untestable_good_end_moves_the_comparison_to_the_next_testable_commit():
    """A release whose engine crashes with the cell's settings is no level: the range is measured from
    the first commit that serves, and one measured commit alone is never "no change"."""
    n = 6
    search = MetricSearch(commits(n))
    _drive_skipping(search, scripted(lambda i: 50.0 * (0.85 if i >= 4 else 1.0)), {0, 1})
    report = search.result()
    assert report.skipped == (("c0", "engine crashed"), ("c1", "engine crashed"))
    (change,) = report.changes
    assert change.commit == "c4" and change.found and change.before_commit == "c3"
    assert len(search._y[2]) >= 2  # the first testable commit is an end, with the ends' starts

    quiet = MetricSearch(commits(n))
    _drive_skipping(quiet, scripted(lambda i: 50.0), {0})
    assert quiet.result().verdict.value == "no_change" and len(quiet._y[1]) >= 2

    alone = MetricSearch(commits(2))  # c0, c1, c2
    _drive_skipping(alone, scripted(lambda i: 50.0), {0, 1})
    report = alone.result()
    assert alone.done and report.verdict.value == "undecided" and report.changes == ()
    assert report.starts == len(alone._y[2]) >= 2  # the starts it did make are counted


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_effect": 0.0}, "min_effect"),
    ({"min_effect": 3.0}, "min_effect"),
    ({"confidence": 1.0}, "confidence"),
    ({"max_starts_per_commit": 0}, "max_starts_per_commit"),
])
def test_bad_options_are_one_line(kwargs, message):
    with pytest.raises(BisectError, match=message):
        MetricSearchOptions(**kwargs)


def test_bad_values_are_refused():
    search = MetricSearch(commits(3))
    for value in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(BisectError, match="positive"):
            search.tell("c0", value)
    with pytest.raises(BisectError, match="standard error"):
        search.tell("c0", 1.0, -0.1)
    with pytest.raises(BisectError, match="not a commit"):
        search.tell("c9", 1.0)
    with pytest.raises(BisectError, match="k must be"):
        search.ask(0)


def test_the_load_per_start_balances_requests_against_starts():
    search = MetricSearch(commits(10), MetricSearchOptions(start_s=240.0))
    start = scripted(lambda i: 30.0)
    for i in (0, 10):
        for _ in range(4):
            search.tell(f"c{i}", *start(i))
    tau = search.posterior().tau
    # n = (cv / tau) sqrt(start_s / request_s): a wider spread between starts wants fewer requests each.
    n = search.load_per_start(0.5, 0.2, start_s=200.0)
    assert n == round(0.2 / tau * math.sqrt(200.0 / 0.5))
    assert search.load_per_start(0.5, 0.2, start_s=200.0, hi=50) == 50
