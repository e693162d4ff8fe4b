"""A GPU-hour budget, by the cost model. Pure.

Two questions of one budget. Before a run, which of a design's servers fit (`fit`). As phases run,
what is left and how much of the next phase it covers (`Ledger`): the sweep's zoom phases, the
triage's phases and the bisect's rounds all ask a ledger, each pricing what it would run by the cost
model and charging what it spent.

`fit` takes servers one at a time, each time the one that adds the most server-axis values and pairs of
values not yet held per modelled GPU-second (its start, its cells' requests, and the install of its commit
when no server taken so far needs it), until the next would pass the budget; so what fits is spread
over the axes rather than the first servers of the list, and a commit's install is paid for only
when enough of its servers fit. What is left is reported as untested. Samples fit through the
requests the plan models per cell: an adaptive plan models the samples that settle a clean cell
(`sequential.Rule.expected_samples`), a full replay the whole suite.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sweeper.errors import ConfigError
from sweeper.plan.cost import Profile, server_seconds
from sweeper.plan.design import _encoded, server_axes
from sweeper.spec.bench import BenchSpec
from sweeper.spec.matrix import ServerGroup

T = TypeVar("T")


def budget_seconds(hours: float) -> float:
    """`--budget`'s GPU-hours in GPU-seconds; ConfigError unless a finite number above 0."""
    if not (hours > 0 and hours < float("inf")):
        raise ConfigError(f"expected a number of GPU-hours above 0, got {hours:g}", key="--budget")
    return hours * 3600.0


@dataclass
class Ledger:
    """A budget in GPU-seconds (None: no budget, everything is affordable), what was spent of it,
    and what is held for work planned but not yet spent (a triage's phase under way)."""

    budget_s: float | None
    spent_s: float = 0.0
    held_s: float = 0.0
    exhausted: bool = False  # whether an `afford` found nothing of what it was offered within the budget

    @classmethod
    def of_hours(cls, hours: float | None, *, spent_s: float = 0.0, held_s: float = 0.0) -> Ledger:
        return cls(None if hours is None else hours * 3600.0, spent_s, held_s)

    def left(self) -> float | None:
        """GPU-seconds left (below 0 once overspent: a phase is priced before it runs, and runs as it
        runs); None without a budget."""
        if self.budget_s is None:
            return None
        return self.budget_s - self.spent_s - self.held_s

    def fits(self, seconds: float | None) -> bool:
        """Whether work priced at `seconds` fits into what is left (work not priced always does)."""
        left = self.left()
        return left is None or seconds is None or seconds <= left

    def afford(self, items: Sequence[T], price: Callable[[Sequence[T]], float]) -> tuple[T, ...]:
        """The longest prefix of `items` (the most wanted first) whose `price`, the modelled
        GPU-seconds of a prefix as a whole, fits into what is left. A prefix is priced whole, not item
        by item, because items share costs (a commit's install, paid once). Nothing of a non-empty
        offer fitting marks the ledger exhausted."""
        left = self.left()
        if left is None:
            return tuple(items)
        n = 0
        while n < len(items) and price(items[:n + 1]) <= left:
            n += 1
        if n == 0 and items:
            self.exhausted = True
        return tuple(items[:n])

    def charge(self, seconds: float) -> None:
        """Count `seconds` as spent."""
        self.spent_s += seconds


@dataclass(frozen=True)
class Fit:
    kept: tuple[ServerGroup, ...]  # in the plan's order
    left: tuple[ServerGroup, ...]
    modelled_s: float  # GPU-seconds of what was kept
    budget_s: float


def fit(groups: Sequence[ServerGroup], profile: Profile, *, requests_per_cell: int, gpus: float, installs: bool,
        budget_s: float, bench: BenchSpec | None = None) -> Fit:
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
    own = [gpus * server_seconds(g, profile, requests_per_cell, bench) for g in groups]  # a bench's starts and load too
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
