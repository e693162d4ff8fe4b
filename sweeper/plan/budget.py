"""A GPU-hour budget: which of a plan's servers fit into it, by the cost model. Pure.

Servers are taken one at a time, each time the one that adds the most server-axis values and pairs of
values not yet held per modelled GPU-second (its start, its cells' requests, and the install of its commit
when no server taken so far needs it), until the next would pass the budget; so what fits is spread
over the axes rather than the first servers of the list, and a commit's install is paid for only
when enough of its servers fit. What is left is reported as untested. Samples fit through the
requests the plan models per cell: an adaptive plan models the samples that settle a clean cell
(`sequential.Rule.expected_samples`), a full replay the whole suite.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from sweeper.plan.cost import Profile
from sweeper.plan.design import _encoded, server_axes
from sweeper.spec.matrix import ServerGroup


@dataclass(frozen=True)
class Fit:
    kept: tuple[ServerGroup, ...]  # in the plan's order
    left: tuple[ServerGroup, ...]
    modelled_s: float  # GPU-seconds of what was kept
    budget_s: float


def fit(groups: Sequence[ServerGroup], profile: Profile, *, requests_per_cell: int, gpus: float, installs: bool,
        budget_s: float) -> Fit:
    """The servers of `groups` that fit into `budget_s` GPU-seconds. `installs`: whether each commit
    costs an install (not for a preinstalled vLLM)."""
    if not groups:
        return Fit((), (), 0.0, budget_s)
    axes = server_axes([c for g in groups for c in g.cells])
    # What a server holds: its single values and its pairs of values (each tagged with its strength).
    pairs: list[frozenset[tuple[int, int]]] = [frozenset() for _ in groups]
    for strength in range(1, min(2, len(axes)) + 1):
        codes = _encoded(groups, axes, strength)
        pairs = [held | {(strength, c) for c in mine} for held, mine in zip(pairs, codes, strict=True)]
    own = [gpus * (profile.start_s + len(g.cells) * requests_per_cell * profile.request_s) for g in groups]
    install = gpus * profile.install_s if installs else 0.0
    held: set[tuple[int, int]] = set()
    commits: set[str] = set()
    taken: list[int] = []
    spent = 0.0

    def cost(i: int) -> float:
        return own[i] + (install if groups[i].head.commit not in commits else 0.0)

    def score(i: int) -> float:
        return (len(pairs[i] - held) + 1e-9) / max(cost(i), 1e-9)

    # Lazy greedy (as in `design.covering`): a stale score is re-scored when it comes up, and taken
    # when it still beats the next one; ties go to the plan's order.
    heap = [(-score(i), i) for i in range(len(groups))]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        fresh = -score(i)
        if heap and (fresh, i) > heap[0]:
            heapq.heappush(heap, (fresh, i))
            continue
        if spent + cost(i) > budget_s:
            continue  # does not fit: left untested; a cheaper one may still
        spent += cost(i)
        commits.add(groups[i].head.commit)
        held |= pairs[i]
        taken.append(i)
    kept = set(taken)
    return Fit(tuple(g for i, g in enumerate(groups) if i in kept),
               tuple(g for i, g in enumerate(groups) if i not in kept), spent, budget_s)
