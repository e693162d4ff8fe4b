"""The failure search's limits and knobs (`sweeper.bisect.search`); the defaults are the calibrated ones."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.bisect.segments import Prior


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
