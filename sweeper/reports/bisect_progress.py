"""The one line a bisect prints after each round: how far it got, what it spent, what it believes.

Rounds so far, server starts (this round's among them, and the stored ones reused), GPU time spent,
and for every mode still open the commit most likely to be its change with that probability: the
change density the model gives each commit, the highest over the cells that share the mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sweeper.bisect.search import BisectReport

MODE_CHARS = 48  # a mode's name in the line, cut beyond this


@dataclass(frozen=True)
class Belief:
    """A mode's most likely change so far: the commit and P(the mode's rate changes there)."""

    mode: str
    commit: str
    probability: float


def beliefs(reports: Sequence[BisectReport], commits: Sequence[str]) -> list[Belief]:
    """Per open mode (a cell's search is not done and the mode's changes are not all settled), the
    commit with the highest change density over the cells, most probable first."""
    best: dict[str, Belief] = {}
    for rep in reports:
        if rep.done:
            continue
        for m in rep.modes:
            settled = m.changes and all(c.found for c in m.changes)
            if settled or not m.gaps:
                continue
            density = m.change_density(len(commits))
            j = max(range(len(density)), key=lambda i: density[i])
            if density[j] <= 0:
                continue
            if m.mode not in best or density[j] > best[m.mode].probability:
                best[m.mode] = Belief(m.mode, commits[j], density[j])
    return sorted(best.values(), key=lambda b: (-b.probability, b.mode))


def _short(mode: str) -> str:
    return mode if len(mode) <= MODE_CHARS else mode[:MODE_CHARS - 1] + "…"


def round_line(round_no: int, positions: Sequence[int], n_commits: int, *, starts: int, reused_starts: int,
               gpu_seconds: float, found: Sequence[Belief]) -> str:
    """`round 3: 4 starts at positions 2, 5, 8, 10 of 11; 14 starts so far (+8 stored reused), 310
    GPU-s; open: MODE → b09fca018d 71% | ...`"""
    this_round = len(positions)
    where = ", ".join(str(p) for p in sorted(positions))
    line = (f"round {round_no}: {this_round} start{'' if this_round == 1 else 's'} at position"
            f"{'' if len(positions) == 1 else 's'} {where} of {n_commits}; {starts} start{'' if starts == 1 else 's'} "
            f"so far" + (f" (+{reused_starts} stored, reused)" if reused_starts else "")
            + f", {gpu_seconds:.0f} GPU-s")
    if found:
        line += "; best so far: " + " | ".join(f"{_short(b.mode)} → {b.commit[:10]} {100 * b.probability:.0f}%"
                                              for b in found)
    return line
