"""The automatic zoom: which servers a run's next phase starts so that the candidate conjunctions
explain proposes for each failure mode can be told apart. Pure.

After a phase, every failure mode's explanation (`sweeper.judge.explain`) is read as a set of candidate
conjunctions: the one it names and, where the design could not tell them apart, its aliases. A
candidate is settled by two kinds of servers, on the commits that show the mode:

* **held, the rest varied**: servers where every term of the candidate holds, and among them every
  value of every other server axis on at least `starts` of them. A candidate too broad (the truth
  needs one more term) then has a clean corner of more than one start, an alias that is not the
  truth fails where it does not hold, and a flaky mode gets more than one start to show itself.
* **each part alone**: for each term, at least `starts` servers where the other terms hold and this
  one does not. A candidate too narrow (a term it does not need) then fails outside itself.

Where explain's best conjunction is not significant yet, each refinement of it by one more term
that every failing cell shares is a candidate too: a conjunction too broad for its evidence (one
term of a three-term bug) zooms towards its failing corner instead of only adding starts across it.

Where explain cannot settle a mode yet (its best conjunction is not significant, or has aliases),
each phase asks one more start per need. Where those are all met and explain still cannot settle
it, more starts go where explain places the doubt: each part of its conjunction that does not
credibly fail and each term not yet shown needed (that corner: `starts + depth` more than ran
there); with no doubt named, one more start per need at a time. Servers already run count towards
these needs (at the levels that ran on them); the next phase is a greedy cover of what is left
(the server meeting most unmet needs first, ties broken by a seeded shuffle), so cutting a phase
short (a budget) keeps its most informative servers. A mode is **identified** once explain names one
conjunction without aliases, significant at its level, and every need of that conjunction is met;
it is **unexplained** (or fails in every setting) when explain finds no candidate; otherwise it is
still open, and open with nothing left to run once no server of the matrix meets a need.

Terms are read on the levels that ran where a server has run; a server not yet run is read on what
it asks for, except where a run server asking alike fell back silently to another value (the
nearest such server's fallback is assumed). Terms on request axes hold on every server (each server
runs all of its request cells), and terms on effective settings no axis asks for (" (effective)")
cannot be asked for: both are left out of the choice (explain reads them from what ran).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.judge.axis_levels import COMMIT, EFFECTIVE_SUFFIX, level
from sweeper.judge.explain import ModeExplanation, Verdict
from sweeper.spec.matrix import ServerGroup

MAX_TERMS = 3  # explain's largest conjunction
STARTS = 2  # servers per need: a flaky mode shows in one start of two where one alone may miss it


class Status(enum.StrEnum):
    IDENTIFIED = "identified"  # one conjunction, significant, no aliases, every need met
    OPEN = "open"  # candidates whose needs servers not yet run can meet
    EXHAUSTED = "no informative servers left"  # open, but no server of the matrix meets a need
    UNEXPLAINED = "unexplained"  # explain proposes no conjunction
    EVERYWHERE = "every setting"  # fails alike everywhere: no setting to zoom on


Terms = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Candidate:
    """A conjunction proposed for a mode: (axis, level) terms as explain names them."""

    mode: str
    terms: Terms
    commits: tuple[str, ...]  # the commits that show the mode (its scope)

    def __str__(self) -> str:
        return f"{self.mode}: " + (" ∧ ".join(f"{a}={v}" for a, v in self.terms) or "every setting")


@dataclass(frozen=True)
class ModeState:
    mode: str
    status: Status
    candidates: tuple[Candidate, ...]
    unmet: int = 0  # needs no server run so far meets


@dataclass(frozen=True)
class Step:
    """What the zoom proposes after a phase: the next servers (none: it is done) and each mode's state."""

    groups: tuple[ServerGroup, ...]
    modes: tuple[ModeState, ...]

    @property
    def done(self) -> bool:
        return not self.groups


def candidates(mode: ModeExplanation, levels: Mapping[str, Mapping[str, str | None]] | None = None,
               max_terms: int = MAX_TERMS) -> tuple[Candidate, ...]:
    """The conjunctions a mode's explanation leaves in play: its own and its aliases; where its
    evidence is too weak to be significant, also each one-term refinement on a value every failing
    cell shares (`levels`: each cell's levels, by cell id), as a too-broad conjunction's true corner."""
    if mode.verdict in (Verdict.UNEXPLAINED, Verdict.EVERYWHERE) or not mode.terms:
        return ()
    named: list[Terms] = [tuple((t.axis, t.value) for t in terms) for terms in (mode.terms, *mode.alternatives)]
    failing = [levels[c] for c, _ in mode.failing_cells if levels and c in levels]
    if mode.verdict is Verdict.TOO_FEW and failing and len(named[0]) < max_terms:
        used = {a for a, _ in named[0]}
        shared = sorted((a, v) for a, v in failing[0].items() if a not in used and a != COMMIT and v is not None
                        and all(f.get(a) == v for f in failing[1:]))
        named += [(*named[0], term) for term in shared]
    return tuple(Candidate(mode.mode, terms, mode.commits) for terms in named)


def levels_of(group: ServerGroup) -> dict[str, str | None]:
    """A server's requested level on each of its axes, as explain spells levels."""
    return server_levels(group.head.values)


def server_levels(values: Mapping[str, Any]) -> dict[str, str | None]:
    """The server levels of a cell whose axis values are `values` (its request fields left out)."""
    return {axis: level(values, axis) for axis in values if not axis.startswith("request.")}


def predicted(requested: Mapping[str, Mapping[str, str | None]], ran: set[str],
              observed: Mapping[str, Mapping[str, str | None]]) -> dict[str, dict[str, str | None]]:
    """Each server's levels: what ran, for those run; for the others, what they ask for, except on
    an axis where a run server asking for the same value ran another (a silent fallback): there,
    what ran on the run server that asks most alike."""
    out = {gid: dict(lv) for gid, lv in requested.items()}
    for gid, seen in observed.items():
        if gid in out:
            out[gid].update(seen)
    moved = {a for seen in observed.values() for a in seen}
    if not moved:
        return out
    done = [g for g in requested if g in ran]
    for gid, asked in requested.items():
        if gid in ran:
            continue
        for axis in moved:
            alike = [g for g in done if requested[g].get(axis) == asked.get(axis)]
            if not alike:
                continue
            nearest = max(alike, key=lambda g: sum(requested[g].get(a) == v for a, v in asked.items()))
            out[gid][axis] = out[nearest].get(axis)
    return out


def _choosable(terms: Terms, axes: Iterable[str]) -> Terms:
    known = set(axes)
    return tuple((a, v) for a, v in terms
                 if a in known and not a.startswith("request.") and not a.endswith(EFFECTIVE_SUFFIX))


Need = tuple[str, ...]  # a need's key (unique per candidate and kind)


@dataclass(frozen=True)
class _Needs:
    demand: dict[Need, int]
    tests: dict[Need, tuple[Terms, Terms, tuple[str, ...]]]  # key -> (must hold, must not hold, commits)


def needs(candidate: Candidate, groups: Sequence[ServerGroup], starts: int = STARTS) -> _Needs:
    """What settles `candidate`, among `groups` (the matrix's servers): see the module docstring."""
    axes = {a for g in groups for a in levels_of(g) if a != COMMIT}
    terms = _choosable(candidate.terms, axes)
    demand: dict[Need, int] = {}
    tests: dict[Need, tuple[Terms, Terms, tuple[str, ...]]] = {}
    if not terms:
        return _Needs(demand, tests)
    name = str(candidate)
    scope = candidate.commits

    def add(key: Need, hold: Terms, off: Terms, count: int) -> None:
        demand[key], tests[key] = count, (hold, off, scope)

    add((name, "held"), terms, (), starts)
    used = {a for a, _ in terms}
    holding = [levels_of(g) for g in groups if _meets(levels_of(g), terms, (), scope)]
    for axis in sorted(axes - used):
        for value in sorted({str(lv.get(axis)) for lv in holding if lv.get(axis) is not None}):
            add((name, "held", axis, value), (*terms, (axis, value)), (), starts)
    for i, term in enumerate(terms):
        rest = terms[:i] + terms[i + 1:]
        add((name, "without", *term), rest, (term,), starts)
    return _Needs(demand, tests)


Test = tuple[Terms, Terms, tuple[str, ...]]  # (must hold, must not hold, commits)
ESCALATE = 8  # at most this many more starts per need than a phase's due, for an unsettled mode


def _demands(cands: Sequence[Candidate], groups: Sequence[ServerGroup], per: int) -> list[tuple[Need, int, Test]]:
    out = []
    for cand in cands:
        got = needs(cand, groups, per)
        out += [(key, count, got.tests[key]) for key, count in got.demand.items()]
    return out


def _escalate(mode: ModeExplanation, cands: Sequence[Candidate], groups: Sequence[ServerGroup], per: int,
              met: Callable[[Test], int], reachable: Callable[[Test], bool]) -> dict[Need, tuple[int, Test]]:
    """More starts for a mode explain cannot settle although its needs at `per` are met. First
    where explain says the doubt is: each part of the named conjunction that does not credibly
    fail (`unsure_parts`: its held corner) and each term whose need is not shown (`unneeded`: its
    corner without it), `per` more starts there than have run; else every need, one more start at
    a time, up to `ESCALATE` more."""
    name = str(cands[0])
    weak: set[Need] = {(name, "held", t.axis, t.value) for t, _ in mode.unsure_parts} | \
        {(name, "without", t.axis, t.value) for t in mode.unneeded}
    all_needs = _demands(cands, groups, per)
    got: dict[Need, tuple[int, Test]] = {key: (per, test) for key, _, test in all_needs
                                         if key in weak and reachable(test)}
    if got:
        return got
    for more in range(1, ESCALATE + 1):
        got = {key: (count + more - met(test), test) for key, count, test in all_needs}
        if any(left > 0 and reachable(test) for left, test in got.values()):
            return got
    return {}


def _meets(levels: Mapping[str, str | None], hold: Terms, off: Terms, commits: Sequence[str]) -> bool:
    if commits and str(levels.get(COMMIT)) not in commits:
        return False
    return all(levels.get(a) == v for a, v in hold) and all(levels.get(a) != v for a, v in off)


def step(explained: Sequence[ModeExplanation], groups: Sequence[ServerGroup], ran: Iterable[str], *,
         seed: int = 0, starts: int = STARTS, depth: int = 0,
         observed: Mapping[str, Mapping[str, str | None]] | None = None,
         elsewhere: Mapping[str, Mapping[str, str | None]] | None = None) -> Step:
    """The next phase's servers, from the modes explained so far. `groups`: every server of the
    matrix; `ran`: the group ids already run (every phase); `depth`: zoom phases run so far (a mode
    explain cannot yet settle asks for `starts + depth` servers per need); `observed`: the levels
    that ran on servers already run, by group id, where they differ from what was asked; `elsewhere`:
    the levels of cells the explanation read that are none of `groups` (samples from another run),
    by cell id, so that a too-broad conjunction's refinements are drawn from every failing cell."""
    done = set(ran)
    by_id = {g.group_id: g for g in groups}
    levels = predicted({g.group_id: levels_of(g) for g in groups}, done, observed or {})
    run_ids = [gid for gid in by_id if gid in done]
    todo = [gid for gid in by_id if gid not in done]
    demand: dict[Need, int] = {}
    tests: dict[Need, tuple[Terms, Terms, tuple[str, ...]]] = {}
    states: list[tuple[ModeExplanation, tuple[Candidate, ...], list[Need]]] = []
    by_cell = {**(elsewhere or {}), **{c.cell_id: levels[g.group_id] for g in groups for c in g.cells}}

    def met(test: Test) -> int:
        return sum(1 for gid in run_ids if _meets(levels[gid], *test))

    def can_meet(test: Test) -> bool:
        return any(_meets(levels[gid], *test) for gid in todo)

    for mode in explained:
        cands = candidates(mode, by_cell)
        # Evidence too weak to settle (too few starts, or aliases): more starts per need each phase.
        per = starts if mode.verdict is Verdict.EXPLAINED else starts + depth
        got = {key: (count - met(test), test) for key, count, test in _demands(cands, groups, per)}
        if mode.verdict is not Verdict.EXPLAINED and cands and \
                not any(left > 0 and can_meet(test) for left, test in got.values()):
            got = _escalate(mode, cands, groups, per, met, can_meet)
        keys = [key for key, (left, _) in got.items() if left > 0]
        for key in keys:
            demand[key], tests[key] = got[key]
        states.append((mode, cands, keys))
    # Which unmet needs each server not yet run would meet.
    meets = {gid: [k for k in demand if _meets(levels[gid], *tests[k])] for gid in todo}
    order = list(todo)
    random.Random(seed).shuffle(order)
    rank = {gid: i for i, gid in enumerate(order)}
    chosen: list[str] = []
    left = dict(demand)
    while True:
        best = max(todo, key=lambda g: (sum(1 for k in meets[g] if left[k] > 0), -rank[g]), default=None)
        if best is None or not any(left[k] > 0 for k in meets[best]):
            break
        chosen.append(best)
        todo.remove(best)
        for k in meets[best]:
            left[k] = max(0, left[k] - 1)
    reachable = {k for gid in meets for k in meets[gid]}
    modes = []
    for mode, cands, keys in states:
        if not cands:
            status = Status.EVERYWHERE if mode.verdict is Verdict.EVERYWHERE else Status.UNEXPLAINED
        elif mode.verdict is Verdict.EXPLAINED and not any(k in reachable for k in keys):
            status = Status.IDENTIFIED  # every need met that a server of the matrix can meet
        elif any(k in reachable for k in keys):
            status = Status.OPEN
        else:
            status = Status.EXHAUSTED
        modes.append(ModeState(mode.mode, status, cands, len(keys)))
    return Step(tuple(by_id[g] for g in chosen), tuple(modes))
