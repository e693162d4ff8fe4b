"""Bisect: find every change of every failure mode in a commit range.

Pure: `search` (the ask/tell search), `segments` (its statistics), `modes` (failed checks into
failure modes), `select` (which cells to bisect) and `report` (bisect.json and its text). The shell:
`evidence` (what is stored of each cell, read from the runs) and `driver` (probes through an
executor, results to the store).
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
