"""Bisect: the pure search for every change of every failure mode in a commit range.

Pure, all of it: `search` (the ask/tell search and its result types), `rules` (what the search wants
next, free functions of the read-only `view` of it), `sizing` (samples per server start), `options`
(its knobs), `segments` (the change-point posterior), `drift` (a rate that ramps instead of
stepping) and `select` (which cells to bisect). The per-start likelihood the posterior is built on
and the failure modes belong to `sweeper.judge`; the driver that runs probes is in `sweeper.drivers`,
the report and progress in `sweeper.reports`.
"""

from sweeper.bisect.search import (
    BadEndpoint,
    BisectReport,
    Change,
    Direction,
    ModeReport,
    Observation,
    ProbeRequest,
    Search,
    SearchOptions,
)
from sweeper.bisect.segments import Rate

__all__ = ["BadEndpoint", "BisectReport", "Change", "Direction", "ModeReport", "Observation", "ProbeRequest",
           "Rate", "Search", "SearchOptions"]
