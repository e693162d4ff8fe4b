"""What the failure search wants next: its rules, each a free function of a read-only view. Pure.

Every rule reads a `SearchView` (`sweeper.bisect.view`) and returns the commits it wants, each
`Need` with a value and a sample count; `needs` composes them in a fixed order, and `plan_round`
turns them into one round of distinct commits. `sweeper.bisect.search` states the rules in words.

The rules, in the order `needs` asks them:
* `endpoint_needs`: both endpoints until each has `endpoint_starts` starts (and a blind split of
  the interior while it has none);
* `bad_passes_need`: clean samples at the bad endpoint until it passes;
* per mode (`mode_needs`), after `below_resolution` and outside drifts (`mode_drifts`), one of the
  gap rules per gap: `split_need`, `bump_need`, `doubt_need`, `two_starts_need`,
  `dispersion_need`; then, if the mode wants nothing else, `spread_needs`, `odd_stretch_needs` and
  `no_change_needs`;
* `scan_needs`: every run of `bump_width` (or, before "no change", `quiet_scan`) unprobed commits.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate, pairwise

import numpy as np
from scipy.stats import binom

from sweeper.bisect.drift import Drift, PointCounts, find_drifts
from sweeper.bisect.segments import ModePosterior, Segment
from sweeper.bisect.sizing import batch, bump_batch
from sweeper.bisect.view import RHO_VARIES, SearchView
from sweeper.judge.stats import wilson

SPREAD_FLOOR = 0.05  # a gap's P(change) that counts it in a run of small steps (`drift_candidates`)


@dataclass(frozen=True)
class Need:
    """What one rule wants: `commits` to probe, worth `value`, with `samples` each."""

    value: float
    commits: tuple[int, ...]  # a gap's untested commits (split), or the one commit to probe
    samples: int
    split: bool = False


class BadEndpoint(StrEnum):
    """What the bad endpoint shows: the premise of a bisect."""

    FAILS = "fails"  # some mode fails there
    PASSES = "passes"  # credibly nothing fails at rate >= min_rate
    UNDECIDED = "undecided"  # nothing seen yet, but not enough samples to say it passes
    UNTESTABLE = "untestable"


# ---- the premise -----------------------------------------------------------------------


def clean_needed(view: SearchView) -> int:
    """Clean samples at `bad` that bound its rate below `min_rate` at the confidence."""
    return math.ceil(math.log(1 - view.confidence) / math.log1p(-view.options.min_rate))


def bad_endpoint(view: SearchView) -> BadEndpoint:
    last = view.last
    if last in view.skipped and view.samples_at(last) == 0:
        return BadEndpoint.UNTESTABLE
    if any(view.failures_at(m, last) for m in view.modes):
        return BadEndpoint.FAILS
    # Prior-free: with no failure in n >= log(1 - c) / log(1 - min_rate) samples, a rate of
    # min_rate or more would have shown one with probability c (a one-sided exact bound), if
    # every start fails alike; `pass_starts` of them bound a rate that varies between starts.
    if view.samples_at(last) >= clean_needed(view) and view.starts_at(last) >= view.pass_starts:
        return BadEndpoint.PASSES
    return BadEndpoint.UNDECIDED


# ---- what a mode's counts say ----------------------------------------------------------


def point_high(view: SearchView, mode: str, i: int) -> float:
    """The 95 % upper bound of the rate commit i's own samples show for `mode`, if it failed there
    (0 if not: two clean commits have no change between them the search could locate)."""
    k = view.failures_at(mode, i)
    return wilson(k, view.samples_at(i))[1] if k else 0.0


def point_rate(view: SearchView, mode: str, i: int) -> float:
    """The rate commit i's own samples show for `mode`, pulled off 0 by half a failure."""
    k = view.failures_at(mode, i)
    return (k + 0.5) / (view.samples_at(i) + 1.0)


def may_differ(view: SearchView, mode: str, lo: int, hi: int) -> bool:
    """Whether the two commits' own counts leave a step of `min_contrast` in the failure rate
    credible (95 % bounds). Two commits known to fail within less of each other have no change
    between them that the search is after. (The posterior's resolution is in odds, and near a
    rate of 1 odds are fine-grained: two commits of one crash, 99.0 % and 99.1 %, held the gap at
    P 0.02 through 24 starts a side.)"""
    (a_lo, a_hi), (b_lo, b_hi) = (wilson(view.failures_at(mode, i), view.samples_at(i)) for i in (lo, hi))
    tiny = 1e-12
    return max(a_hi / max(b_lo, tiny), b_hi / max(a_lo, tiny)) >= view.options.min_contrast


def below_resolution(view: SearchView, mode: str) -> bool:
    """Credibly below `min_rate` everywhere: every segment and both endpoints by their own counts
    (a pooled segment hides an end that fails more, when the model has not yet seen it change),
    and no commit credibly above it by its own."""
    post, min_rate = view.posteriors[mode], view.options.min_rate
    if max(seg.high for seg in post.segments) >= min_rate:
        return False
    for i in (post.points[0], post.points[-1]):
        if wilson(view.failures_at(mode, i), view.samples_at(i))[1] >= min_rate:
            return False
    # Nor where one commit's own counts are credibly above it: a bump a few commits wide, pooled
    # into a clean segment until the model cuts it out (6 of 64 among 20,000 clean samples).
    return all(wilson(view.failures_at(mode, i), view.samples_at(i))[0] < min_rate for i in post.points)


def odd_start(view: SearchView, mode: str) -> int | None:
    """The commit of one start whose count the mode's other samples make least likely (either
    binomial tail, at their pooled rate), if under 1 - confidence; None if there is none."""
    post = view.posteriors[mode]
    k_all, n_all = sum(view.failures.get(mode, {}).values()), view.total_samples
    best: tuple[float, int] | None = None
    for i in post.points:
        if view.starts_at(i) != 1 or not view.probeable(i):
            continue
        k, n = view.failures_at(mode, i), view.samples_at(i)
        r = (k_all - k + 0.5) / (n_all - n + 1.0)
        tail = min(float(binom.sf(k - 1, n, r)), float(binom.cdf(k, n, r)))
        if tail < 1 - view.confidence and (best is None or tail < best[0]):
            best = (tail, i)
    return None if best is None else best[1]


def bump_probability(view: SearchView, gap: int) -> float:
    """The prior's probability of two or more changes among `gap` commits."""
    pi = view.prior.change_probability(view.n_commits - 1)
    return float(1 - (1 - pi) ** gap - gap * pi * (1 - pi) ** (gap - 1))


def two_starts_each(view: SearchView, lo: int, hi: int) -> bool:
    """One start per side can be one odd start, and a dispersion learned as low from a few
    starts may not be: a located change is settled only with two on each side, whatever rho."""
    return min(view.starts_at(lo), view.starts_at(hi)) >= 2


def sure_at_any_dispersion(view: SearchView, post: ModePosterior, gap: int) -> bool:
    return not view.options.robust_dispersion or float(post.gap_change_low[gap]) >= view.confidence


def in_view(view: SearchView) -> bool:
    """Some mode has a change more likely than not: the search has something to report."""
    return any(p > 0.5 for m in view.modes for p in view.posteriors[m].gap_change)


# ---- drifts ------------------------------------------------------------------------------


def mode_drifts(view: SearchView, mode: str) -> list[Drift]:
    """Runs of same-direction changes of `mode` that a ramp fits as well (`sweeper.bisect.drift`)."""
    if not view.options.drift:
        return []
    post = view.posteriors[mode]
    pts = post.points
    changes = [(a, _rises(post, a)) for a in drift_candidates(post)]
    # A lone change narrowed to neighbouring commits, one of them capped, and still short
    # of the confidence: the search can do no more there, and a ramp may be why.
    lone = frozenset(a for a, _ in changes if post.gap_change[a] < view.confidence
                     and all(j in view.skipped for j in range(pts[a] + 1, pts[a + 1]))
                     and not (view.probeable(pts[a]) and view.probeable(pts[a + 1])))
    if len(changes) < 2 and not lone:
        return []
    counts = [PointCounts(i, view.failures_at(mode, i), view.samples_at(i)) for i in pts]
    per_start = view.total_samples / max(1, view.probes)
    return find_drifts(counts, changes, design_effect=1 + max(0.0, per_start - 1) * post.rho, lone=lone)


def _rises(post: ModePosterior, a: int) -> bool:
    return post.segment_at(post.points[a + 1]).rate > post.segment_at(post.points[a]).rate


def drift_candidates(post: ModePosterior) -> list[int]:
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


def drift_gaps(view: SearchView, mode: str) -> set[int]:
    """The gaps (indices into the mode's posterior) inside a drift of `mode`: no commit there is the change."""
    pts = view.posteriors[mode].points
    return {a for d in view.drifts[mode] for a in range(pts.index(d.first), pts.index(d.last))}


# ---- shared actions ----------------------------------------------------------------------


def resample(view: SearchView, lo: int, hi: int, value: float, n: int, *, by_starts: bool = False,
             cap: int | None = None, segments: ModePosterior | None = None) -> Need | None:
    """One more start at the side of the gap lo..hi with fewer starts (or samples), under `cap`.
    With `segments` and `capped_segment_starts`, where both sides are at the cap: at the
    least-started commit of the two segments around the gap instead (the nearer one first), while
    those segments hold under `capped_segment_starts` times the two commits' own starts."""
    sides = sorted((x for x in (lo, hi) if view.probeable(x, cap)),
                   key=lambda x: ((view.starts_at(x),) if by_starts else ()) + (view.samples_at(x), x))
    if not sides and segments is not None and view.options.capped_segment_starts:
        first, last = segments.segment_at(lo).first, segments.segment_at(hi).last
        around = [x for x in segments.points if first <= x <= last and x not in (lo, hi)]
        bound = view.options.capped_segment_starts * (view.starts_at(lo) + view.starts_at(hi))
        if sum(view.starts_at(x) for x in around) < bound:
            sides = sorted((x for x in around if view.probeable(x, cap)),
                           key=lambda x: (view.starts_at(x), min(abs(x - lo), abs(x - hi)), x))
    return Need(value, (sides[0],), n) if sides else None


def deepen(view: SearchView, points: Sequence[int], rates: tuple[float, float], rho: float,
           value: float) -> Need | None:
    """One more start at the thinnest probeable one of `points`, sized to tell the two rates apart
    as if at least 2x (up to `spread_batch` samples), if any has fewer samples than that."""
    lo, hi = sorted(rates)
    n = min(view.options.spread_batch, batch(view.options, lo, max(hi, 2 * lo), rho))
    thin = [x for x in points if view.probeable(x) and view.samples_at(x) < n]
    return Need(value, (min(thin, key=lambda x: (view.samples_at(x), x)),), n) if thin else None


# ---- the rules ---------------------------------------------------------------------------


def endpoint_needs(view: SearchView) -> list[Need]:
    """Both endpoints until each has `endpoint_starts` server starts (a rate resting on one start
    cannot tell a regression from per-start variation)."""
    o, last = view.options, view.last
    needs = [Need(10.0, (i,), o.first_batch) for i in (0, last)
             if view.starts_at(i) < o.endpoint_starts and view.probeable(i)]
    if needs:
        # Slots the endpoints leave free in the first rounds split the range blind: cheap
        # there, and half the bisection is done if the endpoints differ.
        interior = tuple(j for j in range(1, last) if j not in view.skipped)
        if interior and all(view.starts_at(j) == 0 for j in interior):
            needs.append(Need(0.5, interior, o.first_batch, split=True))
    return needs


def bad_passes_need(view: SearchView) -> Need | None:
    """The bad endpoint again while nothing fails there, until enough clean samples bound its rate
    below `min_rate`, spread over `pass_starts` starts."""
    last = view.last
    if bad_endpoint(view) is not BadEndpoint.UNDECIDED or not view.probeable(last):
        return None
    # The clean samples still missing, shared among the starts still missing: enough to
    # say "passes" if these come back clean too.
    left = max(1, view.pass_starts - view.starts_at(last))
    n = math.ceil(max(0, clean_needed(view) - view.samples_at(last)) / left)
    return Need(1.0, (last,), max(view.options.min_batch, n))


@dataclass(frozen=True)
class Gap:
    """One gap of a mode's posterior: between the neighbouring probed commits `lo` and `hi`."""

    mode: str
    post: ModePosterior
    a: int  # its index among the posterior's gaps
    lo: int
    hi: int
    p: float  # P(the mode's rate changes inside it)
    inside: tuple[int, ...]  # its testable commits

    @property
    def seg_lo(self) -> Segment:
        return self.post.segment_at(self.lo)

    @property
    def seg_hi(self) -> Segment:
        return self.post.segment_at(self.hi)

    @property
    def varies(self) -> bool:
        return self.post.rho > RHO_VARIES


def gaps(view: SearchView, mode: str, skip: Collection[int] = ()) -> list[Gap]:
    """The gaps of `mode`'s posterior, leaving out those in `skip`."""
    post = view.posteriors[mode]
    pts = post.points
    return [Gap(mode, post, a, pts[a], pts[a + 1], float(p),
                tuple(j for j in range(pts[a] + 1, pts[a + 1]) if j not in view.skipped))
            for a, p in enumerate(post.gap_change) if a not in skip]


def gap_batch(view: SearchView, gap: Gap) -> int:
    """Samples for a start in or beside `gap`: sized to tell its two sides' rates apart, or where
    they look alike, the largest contrast the mode has shown."""
    seg_rates = [seg.rate for seg in gap.post.segments]
    r_lo, r_hi = sorted((gap.seg_lo.rate, gap.seg_hi.rate))
    if r_hi < 1.5 * r_lo + 0.01:
        r_lo, r_hi = min(seg_rates), max(seg_rates)
    return batch(view.options, r_lo, r_hi, gap.post.rho)


def split_need(view: SearchView, gap: Gap) -> Need | None:
    """A gap that may hold a change (P >= `explore`) with untested commits: split it."""
    if gap.inside and gap.p >= view.options.explore:
        return Need(gap.p, gap.inside, gap_batch(view, gap), split=True)
    return None


def bump_need(view: SearchView, gap: Gap) -> Need | None:
    """Both ends share a rate, but a rise and its fix may sit between them: worth a look in
    proportion to the prior's mass on two changes inside, sized to see a bump of three times the
    rate around it."""
    if not gap.inside or gap.p >= view.options.explore:
        return None
    bump = bump_probability(view, gap.hi - gap.lo)
    if bump >= view.options.bump_explore and gap.seg_lo is gap.seg_hi:
        return Need(bump, gap.inside, bump_batch(view.options, gap.seg_lo.rate, gap.post.rho), split=True)
    return None


def doubt_need(view: SearchView, gap: Gap) -> Need | None:
    """A gap down to one testable commit whose change is still unsure: one more start on the side
    with fewer samples, sized for the contrast the two commits' own counts show."""
    if gap.inside:
        return None
    post, a, lo, hi, p = gap.post, gap.a, gap.lo, gap.hi, gap.p
    likely = {b for b, q in enumerate(post.gap_change) if q > 0.5}
    # Where starts vary, a gap not beside a likely change is left under `explore`, as one
    # with commits inside is not split: odd starts leave 1-5 % on most gaps of a segment
    # probed commit by commit, and driving each under 1 - confidence walked an ICC 0.26
    # step from c66 down to c44 at 15-48 starts a commit (780 starts; 517 with this, still
    # unclaimed). A located change's neighbours, its alternatives, are still settled: left
    # at 1-5 %, two claims at ICC 0.35-0.37 of 100 were a commit or more off. Where starts
    # agree, a gap's last percent is thin counts, and settling it finds secondary changes:
    # without it, three changes in one mode were found in 77.7 % of cases, not 78.5 %.
    doubt_floor = view.options.explore if gap.varies and not {a - 1, a + 1} & likely else 1 - view.confidence
    if not doubt_floor < p < view.confidence:
        return None
    # (Both sides credibly below min_rate, by their segments and by their own counts: a
    # change between them is below resolution. The segments alone pool a bump's few
    # failing commits into the clean rate around it until it is cut, and it is not cut
    # while this gap is in doubt.)
    high = max(gap.seg_lo.high, gap.seg_hi.high, point_high(view, gap.mode, lo), point_high(view, gap.mode, hi))
    if high < view.options.min_rate or not may_differ(view, gap.mode, lo, hi):
        return None
    # The question is whether these two commits differ: a start planned for the contrast
    # their own counts show, not the mode's largest (a mode that also steps 25x elsewhere got
    # starts of 16 samples here, and reached its cap of starts with the gap still at P 0.4).
    # At least 2x: a smaller step adds starts instead; planned for 1.3x, the ramp of a drift
    # cost 40 % more GPU time, its neighbouring commits a few percent apart.
    r_lo, r_hi = sorted((point_rate(view, gap.mode, lo), point_rate(view, gap.mode, hi)))
    return resample(view, lo, hi, 2 * min(p, 1 - p), batch(view.options, r_lo, max(r_hi, 2 * r_lo), post.rho),
                    cap=max(view.start_cap(), view.options.max_starts_in_doubt),
                    segments=post if gap.varies else None)


def two_starts_need(view: SearchView, gap: Gap) -> Need | None:
    """A change located at the confidence needs two starts on each side."""
    if gap.inside or gap.p < view.confidence or two_starts_each(view, gap.lo, gap.hi):
        return None
    return resample(view, gap.lo, gap.hi, 0.5, gap_batch(view, gap), by_starts=True)


def dispersion_need(view: SearchView, gap: Gap) -> Need | None:
    """A located change the mixture over dispersions is sure of, but some credible dispersion is
    not (`robust_dispersion`): one more start on the side with fewer starts, up to
    `max_starts_varying`."""
    if (gap.inside or gap.p < view.confidence or not two_starts_each(view, gap.lo, gap.hi)
            or sure_at_any_dispersion(view, gap.post, gap.a)):
        return None
    # Sure only if starts vary little: more starts on each side tell a change
    # from a few odd starts. The data leave a varying rate credible, so the sides may
    # have the starts of one (a commit of six starts stopped a step at 0.96 for good).
    return resample(view, gap.lo, gap.hi, 2 * (1 - float(gap.post.gap_change_low[gap.a])), gap_batch(view, gap),
                    by_starts=True, cap=view.max_starts_varying, segments=gap.post if gap.varies else None)


# At most one of these wants a gap: their conditions exclude each other.
GAP_RULES = (split_need, bump_need, doubt_need, two_starts_need, dispersion_need)


def spread_needs(view: SearchView, mode: str, in_drift: Collection[int]) -> list[Need]:
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
    post = view.posteriors[mode]
    pts = post.points
    needs: list[Need] = []
    run: list[int] = []
    for a, p in enumerate([*post.gap_change, 1.0]):
        if a < len(post.gap_change) and p < view.options.explore and a not in in_drift:
            run.append(a)
            continue
        total = sum(float(post.gap_change[b]) for b in run)
        if run and total >= view.options.spread_explore:
            span = pts[run[0]:run[-1] + 2]
            # (Ends whose own counts leave no `min_contrast` step between them hold no one change:
            # a bump has two, and the bump rules look for those.)
            if (view.failures_at(mode, span[0]) and view.failures_at(mode, span[-1])
                    and may_differ(view, mode, span[0], span[-1])):
                rates = (post.segment_at(span[0]).rate, post.segment_at(span[-1]).rate)
                if (need := deepen(view, span, rates, post.rho, total)) is not None:
                    needs.append(need)
        run = []
    return needs


def odd_stretch_needs(view: SearchView, mode: str, in_drift: Collection[int]) -> list[Need]:
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
    level = view.options.odd_level
    if level is None:
        return []
    post = view.posteriors[mode]
    pts = post.points
    # Running sums over the points: a stretch's counts are two differences.
    k_sum = [0, *accumulate(view.failures_at(mode, x) for x in pts)]
    n_sum = [0, *accumulate(view.samples_at(x) for x in pts)]
    s_sum = [0, *accumulate(view.starts_at(x) for x in pts)]
    stretches: list[tuple[tuple[int, ...], float, float]] = []
    shrunk: list[tuple[int, int]] = []
    for seg in post.segments:
        first, last = pts.index(seg.first), pts.index(seg.last) + 1  # the segment's points: [first, last)
        k_all, n_all = k_sum[last] - k_sum[first], n_sum[last] - n_sum[first]
        for m in range(1, min(view.options.odd_len, last - first - 2) + 1):
            for a in range(first, last - m + 1):
                if any(b in in_drift for b in range(a - 1, a + m)):
                    continue  # a drift's probes are off its segments' rates by nature
                k, n = k_sum[a + m] - k_sum[a], n_sum[a + m] - n_sum[a]
                deff = 1 + max(0.0, n / (s_sum[a + m] - s_sum[a]) - 1) * post.rho
                stretches.append((pts[a:a + m], (k_all - k + 0.5) / (n_all - n + 1.0), (k + 0.5) / (n + 1.0)))
                shrunk.append((round(k / deff), max(1, round(n / deff))))
    if not stretches:
        return []
    # Both tails of every stretch in one call: a call a stretch was most of a varying-rate search.
    ke, ne = np.array(shrunk).T
    rest_all = np.array([rest for _, rest, _ in stretches])
    tails = np.minimum(binom.sf(ke - 1, ne, rest_all), binom.cdf(ke, ne, rest_all))
    odd = [(float(tail), *stretch) for tail, stretch in zip(tails, stretches, strict=True) if tail < level]
    for _, stretch, rest, rate in sorted(odd):
        if (need := deepen(view, stretch, (rest, rate), post.rho, view.options.explore)) is not None:
            return [need]
    return []


def no_change_needs(view: SearchView, mode: str) -> list[Need]:
    """A mode with no change in view whose P(no change) is short of the confidence (and above
    1 - confidence): more samples at the ends, then at any probed commit.

    Some change may be there but spread over every gap: only more samples at the ends can tell a
    small change from none. The search stops on evidence (P(no change) reaching the confidence, or
    P(change) reaching it and the change found), not when a change merely looks unlikely."""
    post, last = view.posteriors[mode], view.last
    if not 1 - view.confidence < post.no_change < view.confidence:
        return []
    seg_rates = [seg.rate for seg in post.segments]
    value, n = min(1 - post.no_change, post.no_change), batch(view.options, min(seg_rates), max(seg_rates), post.rho)
    if (odd := odd_start(view, mode)) is not None:
        # One start at one commit far off the rest: an odd start (which a rate varying between
        # starts explains) or a bump one commit wide. A second start there tells which; the
        # ends cannot (a scan's one-commit hit of 9/64 among clean commits drew 74 starts at
        # the ends and was left at P(no change) 0.77).
        r = point_rate(view, mode, odd)
        return [Need(value, (odd,), batch(view.options, r, post.segment_at(odd).rate, post.rho))]
    if any(view.probeable(x) for x in (0, last)):
        need = resample(view, 0, last, value, n)
        return [need] if need is not None else []
    pts = post.points
    if (open_points := [x for x in pts if view.probeable(x)]) and (
            sum(view.samples_at(x) for x in pts if x not in (0, last))
            < view.samples_at(0) + view.samples_at(last)):
        # The ends have had all the starts they may: any probed commit's samples count too,
        # until the commits between hold more samples than the ends. Past that, what is still
        # open is how an end compares with the rest, and only the capped end could tell: the
        # mode is left undecided with its cost, not sampled without end (a 1.4x step at c1,
        # c0 alone on the old rate, took 180 starts that way).
        return [Need(value, (min(open_points, key=lambda x: (view.samples_at(x), x)),), n)]
    return []


def mode_needs(view: SearchView, mode: str) -> list[Need]:
    """What the search for `mode`'s changes wants now: the gap rules on every gap outside a drift,
    then, if they want nothing, the rules that end a search."""
    if below_resolution(view, mode):
        return []  # below the search's resolution everywhere: reported, not searched
    post = view.posteriors[mode]
    in_drift = drift_gaps(view, mode)
    needs = [need for gap in gaps(view, mode, in_drift) for rule in GAP_RULES
             if (need := rule(view, gap)) is not None]
    located = any(p > 0.5 for p in post.gap_change)
    if not needs and located:
        needs = spread_needs(view, mode, in_drift)
    if not needs:
        needs = odd_stretch_needs(view, mode, in_drift)
    if not needs and not located:
        needs = no_change_needs(view, mode)
    return needs


# ---- scans -------------------------------------------------------------------------------


def scan_grid(inside: Sequence[int], width: int) -> tuple[int, ...]:
    """The fewest commits of a gap's testable ones (`inside`) that leave no run of `width` of them
    unprobed: len // width, evenly spaced. Any of them probed leaves the rest still the fewest for
    the two parts, so a scan spread over rounds ends with as few probes as one made at once (a
    scan that split the whole gap in halves took 15 starts where 13 do)."""
    g = len(inside)
    t = g // width
    return tuple(inside[(s + 1) * (g + 1) // (t + 1) - 1] for s in range(t))


def unprobed_runs(view: SearchView) -> list[tuple[int, tuple[int, ...]]]:
    """Per gap between neighbouring probed commits: its lower end and the testable commits inside."""
    probed = sorted(i for i in view.starts if view.starts[i])
    return [(lo, tuple(j for j in range(lo + 1, hi) if j not in view.skipped)) for lo, hi in pairwise(probed)]


def widest_unprobed(view: SearchView) -> int:
    """The most testable commits in a row with no probe between two probed ones: the widest
    regression fixed again inside the range that the probes could have missed entirely."""
    return max((len(inside) for _, inside in unprobed_runs(view)), default=0)


def scan_batch(view: SearchView, lo: int) -> int:
    """Samples for a scan's probe in the gap above `lo`: three times each mode's rate there."""
    n = view.options.first_batch
    for mode in view.modes:
        post = view.posteriors[mode]
        n = max(n, bump_batch(view.options, post.segment_at(lo).rate, post.rho))
    return n


def scan_needs(view: SearchView, width: int) -> list[Need]:
    """`bump_width` (or `quiet_scan`): split every gap between probed commits that holds `width` or
    more testable commits, mode or no mode (a bump from a clean rate shows no mode at either end).
    A probe is sized to see three times each mode's rate around it, as a bump need is."""
    return [Need(view.options.bump_explore, scan_grid(inside, width), scan_batch(view, lo), split=True)
            for lo, inside in unprobed_runs(view) if len(inside) >= width]


def scan_quote(view: SearchView, width: int) -> tuple[int, int, float]:
    """The probes a scan at `width` would add to those made: a gap of g testable commits needs
    g // width of them before no run of `width` is left unprobed."""
    starts, gpu_s = 0, 0.0
    for lo, inside in unprobed_runs(view):
        k = len(scan_grid(inside, width))
        if k:
            starts += k
            gpu_s += k * (view.options.start_s + scan_batch(view, lo) * view.options.request_s)
    return width, starts, gpu_s


# ---- all of them -------------------------------------------------------------------------


def needs(view: SearchView) -> list[Need]:
    """What the open searches want now, in a fixed order (`plan_round` breaks ties by it)."""
    wants = endpoint_needs(view)
    if wants and any(view.starts_at(i) == 0 for i in (0, view.last)):
        return wants
    if (passes := bad_passes_need(view)) is not None:
        wants.append(passes)
    for mode in view.modes:
        wants += mode_needs(view, mode)
    if view.options.bump_width:
        wants += scan_needs(view, view.options.bump_width)
    elif view.options.quiet_scan and not wants and not in_view(view):
        wants += scan_needs(view, view.options.quiet_scan)
    return wants


def plan_round(wants: Sequence[Need], in_flight: Collection[int], k: int) -> dict[int, tuple[int, float]]:
    """Up to k distinct commits -> (samples, value): greedy over the needs, merged across modes,
    leaving out commits `in_flight`.

    The t-th commit put into a gap is worth p * log2((t + 1) / t) (t evenly spaced commits
    split it in t + 1 parts); needs on the same gap from several modes add up, and so do
    needs that land on the same commit."""
    merged: dict[tuple[tuple[int, ...], bool], list[float]] = {}
    for need in wants:
        key = (tuple(j for j in need.commits if j not in in_flight), need.split)
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
