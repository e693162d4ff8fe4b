"""Bisect: find every change of every failure mode in a commit range.

`search` is the pure ask/tell search, `segments` its statistics, `modes` turns failed checks into
failure modes, and `driver` runs probes on Ray and stores them.
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
)
from sweeper.bisect.segments import Rate

__all__ = ["BadEndpoint", "BisectReport", "Change", "Direction", "ModeReport", "Observation", "ProbeRequest",
           "Rate", "Search"]
