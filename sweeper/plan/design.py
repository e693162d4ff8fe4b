"""Designs: which cells of an expanded matrix a phase runs. Pure.

The full product runs every cell. A covering design of strength T runs the servers of a subset of
them such that every T-way combination of server-key axis values that some cell of the matrix holds
is held by a chosen cell too. Request-only axes cost no server start, so each chosen server runs all
of its cells. Only the matrix's own cells are chosen from: what exclude rules remove, and values of
collapsed axes, never come back. The choice is a greedy set cover (AETG-like, lazily re-scored),
ties broken by a seeded shuffle, then pruned of servers the others make redundant.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sweeper.spec.matrix import Cell, DesignSpec, Matrix, ServerGroup, canonical, short_hash

# The value of an axis a cell does not bind (collapsed, e.g. num_speculative_tokens with no spec
# method; or a key only some include entries add): a value of its own, so it is covered like any other.
ABSENT = "\0absent"


@dataclass(frozen=True)
class Design:
    """The cells a design chose, and what it promises about them."""

    spec: DesignSpec
    server_axes: tuple[str, ...]
    strength: int  # every combination of this many server axes is covered (all of them: the product)
    groups: tuple[ServerGroup, ...]
    full_groups: int
    full_cells: int

    @property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(c for g in self.groups for c in g.cells)

    @property
    def digest(self) -> str:
        """Names the chosen cells: a resumed run checks it chooses the same ones."""
        return short_hash(sorted(c.cell_id for c in self.cells), 16)

    def describe(self) -> str:
        if self.spec.kind == "full":
            return "full product"
        return f"covering, strength {self.strength} over {len(self.server_axes)} server axes (seed {self.spec.seed})"


def server_axes(cells: Sequence[Cell]) -> tuple[str, ...]:
    """Every axis a cell binds that needs its own server (not `request.*`), in the cells' order."""
    names: dict[str, None] = {}
    for cell in cells:
        names.update((k, None) for k in cell.values if not k.startswith("request."))
    return tuple(names)


def server_row(cell: Cell, axes: Sequence[str]) -> tuple[str, ...]:
    """The cell's server-axis values, canonical, ABSENT where it binds none."""
    return tuple(canonical(cell.values[a]) if a in cell.values else ABSENT for a in axes)


def choose(matrix: Matrix, spec: DesignSpec) -> Design:
    """The design `spec` asks for over `matrix`'s expanded cells."""
    groups = matrix.groups()
    axes = server_axes(matrix.cells)
    n_cells = len(matrix.cells)
    if spec.kind == "full" or spec.strength >= len(axes):
        # Strength at or past the number of axes covers every allowed combination: the product.
        return Design(spec, axes, len(axes), groups, len(groups), n_cells)
    chosen = covering(groups, axes, spec.strength, spec.seed)
    return Design(spec, axes, spec.strength, chosen, len(groups), n_cells)


def covering(groups: Sequence[ServerGroup], axes: Sequence[str], strength: int, seed: int) -> tuple[ServerGroup, ...]:
    """A subset of `groups` holding every `strength`-way combination of `axes` that `groups` hold."""
    covers = _encoded(groups, axes, strength)
    rng = random.Random(seed)
    ties = list(range(len(groups)))
    rng.shuffle(ties)
    # Lazy greedy: a group's gain only falls as others are chosen, so a stale score is an upper bound;
    # re-score the top one and take it when it still beats the next bound.
    heap = [(-len(c), ties[i], i) for i, c in enumerate(covers)]
    heapq.heapify(heap)
    uncovered = set().union(*covers)
    picked: list[int] = []
    while uncovered and heap:
        _, tie, i = heapq.heappop(heap)
        gain = len(covers[i] & uncovered)
        if gain == 0:
            continue
        if heap and (-gain, tie) > heap[0][:2]:
            heapq.heappush(heap, (-gain, tie, i))
            continue
        picked.append(i)
        uncovered -= covers[i]
    # Greedy's early picks may be made redundant by later ones: drop those, latest picks kept.
    count = Counter(combo for i in picked for combo in covers[i])
    kept = []
    for i in picked:
        if all(count[combo] > 1 for combo in covers[i]):
            count.subtract(covers[i])
        else:
            kept.append(i)
    return tuple(groups[i] for i in sorted(kept))



def _encoded(groups: Sequence[ServerGroup], axes: Sequence[str], strength: int) -> list[frozenset[int]]:
    """Each group's combinations, one int each (the axes picked and a value number per axis): a
    matrix of 10,000 servers on many axes holds millions, too many as tuples of strings."""
    numbers: list[dict[str, int]] = [{} for _ in axes]
    rows = [[tuple(numbers[a].setdefault(v, len(numbers[a])) for a, v in enumerate(server_row(cell, axes)))
             for cell in g.cells] for g in groups]
    base = max(len(n) for n in numbers)
    subsets = list(itertools.combinations(range(len(axes)), strength))
    span = base ** strength
    out = []
    for group_rows in rows:
        codes = set()
        for row in group_rows:
            for k, picked in enumerate(subsets):
                code = 0
                for a in picked:
                    code = code * base + row[a]
                codes.add(k * span + code)
        out.append(frozenset(codes))
    return out
