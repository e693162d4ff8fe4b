"""The zoom's choice of next servers, on its own: explanations as data in, servers out. Every need
is checked here by enumerating the matrix's servers, apart from `sweeper.plan.zoom`'s own bookkeeping."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from sweeper.install.matrix_loader import load_matrix
from sweeper.judge.explain import Count, ModeExplanation, Term, Verdict
from sweeper.plan.zoom import Candidate, Status, levels_of, step
from sweeper.spec.matrix import Matrix, ServerGroup

SUITE = "cases: [{id: a, body: {messages: [{role: user, content: hi}]}}]\n"
MATRIX = """model: m
suite: s.yaml
install: {kind: sim, repo: "sim:demo"}
axes:
  commit: [c1, c2]
  env.A: [a0, a1]
  env.B: [b0, b1, b2]
  env.C: [c0, c1]
  env.D: [d0, d1]
  request.temperature: [0, 1]
exclude:
  - {env.B: b2, env.C: c1}
"""


def matrix(tmp_path: Path) -> Matrix:
    (tmp_path / "s.yaml").write_text(SUITE)
    (tmp_path / "m.yaml").write_text(MATRIX)
    return load_matrix(tmp_path / "m.yaml")


def mode(verdict: Verdict, *conjunctions: Sequence[tuple[str, str]], commits: tuple[str, ...] = ("c1",),
         name: str = "json_schema") -> ModeExplanation:
    terms = [tuple(Term(a, v) for a, v in c) for c in conjunctions]
    return ModeExplanation(mode=name, verdict=verdict, terms=terms[0] if terms else (), inside=Count(1, 1),
                           outside=Count(0, 1), p_value=None, p_adjusted=None, tried=1, cases=(), commits=commits,
                           clean_commits=(), alternatives=tuple(terms[1:]))


def holds(group: ServerGroup, terms: Sequence[tuple[str, str]], commits: Sequence[str]) -> bool:
    values = {k: str(v) for k, v in group.head.values.items()}
    return values["commit"] in commits and all(values.get(a) == v for a, v in terms)


def check_settled(groups: Sequence[ServerGroup], ran: set[str], terms: Sequence[tuple[str, str]],
                  commits: Sequence[str], starts: int) -> None:
    """What settles a candidate, by enumeration: enough held servers, every value of every other axis
    among them wherever the matrix has one, and enough servers of each part alone."""
    done = [g for g in groups if g.group_id in ran]
    held = [g for g in done if holds(g, terms, commits)]
    assert len(held) >= min(starts, sum(holds(g, terms, commits) for g in groups))
    used = {a for a, _ in terms}
    for axis in ("env.A", "env.B", "env.C", "env.D"):
        if axis in used:
            continue
        possible = {str(g.head.values[axis]) for g in groups if holds(g, terms, commits)}
        assert possible <= {str(g.head.values[axis]) for g in held}, (axis, possible)
    for i, (axis, value) in enumerate(terms):
        rest = [t for j, t in enumerate(terms) if j != i]
        alone = [g for g in groups if holds(g, rest, commits) and str(g.head.values[axis]) != value]
        assert sum(g in done for g in alone) >= min(starts, len(alone))


def run_to_the_end(groups: Sequence[ServerGroup], first: set[str], explained: Sequence[ModeExplanation],
                   seed: int = 0) -> tuple[set[str], list[int]]:
    ran, sizes = set(first), []
    while True:
        got = step(explained, groups, ran, seed=seed)
        if got.done:
            return ran, sizes
        assert not {g.group_id for g in got.groups} & ran  # never a server twice
        sizes.append(len(got.groups))
        ran |= {g.group_id for g in got.groups}


def test_aliases_are_told_apart_and_each_candidate_is_settled(tmp_path: Path) -> None:
    m = matrix(tmp_path)
    groups = m.groups()
    # The first phase ran only servers where A=a1 and C=c1 go together: the two are aliases.
    first = {g.group_id for g in groups if (g.head.values["env.A"] == "a1") == (g.head.values["env.C"] == "c1")
             and g.head.values["env.D"] == "d0"}
    explained = [mode(Verdict.NOT_IDENTIFIABLE, [("env.A", "a1")], [("env.C", "c1")])]
    got = step(explained, groups, first)
    assert got.groups and got.modes[0].status is Status.OPEN
    assert [str(c) for c in got.modes[0].candidates] == ["json_schema: env.A=a1", "json_schema: env.C=c1"]
    chosen = got.groups
    # Servers that hold one alias and not the other, on the mode's commit only, each request cell with them.
    assert any(holds(g, [("env.A", "a1")], ["c1"]) and g.head.values["env.C"] != "c1" for g in chosen)
    assert any(holds(g, [("env.C", "c1")], ["c1"]) and g.head.values["env.A"] != "a1" for g in chosen)
    assert all(g.head.values["commit"] == "c1" and len(g.cells) == 2 for g in chosen)
    ran = first | {g.group_id for g in chosen}
    for terms in ([("env.A", "a1")], [("env.C", "c1")]):
        check_settled(groups, ran, terms, ["c1"], 2)
    # Once they have run and explain still cannot say which, each need asks one more start at a
    # time (the samples were too few), on servers that still tell the aliases apart, until the matrix
    # has no more such servers: then nothing is left to tell them apart with.
    again = step(explained, groups, ran)
    assert again.groups and again.modes[0].status is Status.OPEN
    assert all(holds(g, [("env.A", "a1")], ["c1"]) != holds(g, [("env.C", "c1")], ["c1"])
               or holds(g, [("env.A", "a1"), ("env.C", "c1")], ["c1"]) for g in again.groups)
    ran, _ = run_to_the_end(groups, ran, explained)
    final = step(explained, groups, ran)
    assert final.done and final.modes[0].status is Status.EXHAUSTED


def test_an_explained_mode_is_identified_once_its_needs_are_met(tmp_path: Path) -> None:
    groups = matrix(tmp_path).groups()
    explained = [mode(Verdict.EXPLAINED, [("env.A", "a1"), ("env.B", "b1")], commits=("c1", "c2"))]
    first = {groups[0].group_id}
    ran, sizes = run_to_the_end(groups, first, explained)
    check_settled(groups, ran, [("env.A", "a1"), ("env.B", "b1")], ["c1", "c2"], 2)
    assert sizes and len(ran) < len(groups)  # a fraction of the product
    final = step(explained, groups, ran)
    assert final.done and final.modes[0].status is Status.IDENTIFIED and final.modes[0].unmet == 0


def test_three_terms_and_an_excluded_corner(tmp_path: Path) -> None:
    """A part alone that the matrix excludes is not asked for; every need that can be met is."""
    groups = matrix(tmp_path).groups()
    terms = [("env.B", "b2"), ("env.A", "a0"), ("env.D", "d1")]
    explained = [mode(Verdict.TOO_FEW, terms)]
    ran, _ = run_to_the_end(groups, set(), explained)
    check_settled(groups, ran, terms, ["c1"], 2)
    assert not any(g.head.values["env.B"] == "b2" and g.head.values["env.C"] == "c1" for g in groups)
    assert step(explained, groups, ran).modes[0].status is Status.EXHAUSTED


def test_nothing_to_zoom_on(tmp_path: Path) -> None:
    groups = matrix(tmp_path).groups()
    for verdict, status in ((Verdict.UNEXPLAINED, Status.UNEXPLAINED), (Verdict.EVERYWHERE, Status.EVERYWHERE)):
        got = step([mode(verdict)], groups, set())
        assert got.done and got.modes[0].status is status and not got.modes[0].candidates
    assert step([], groups, set()).done


def test_request_and_effective_only_terms_choose_no_server(tmp_path: Path) -> None:
    groups = matrix(tmp_path).groups()
    only = mode(Verdict.EXPLAINED, [("request.temperature", "1"), ("model_runner (effective)", "V2")])
    got = step([only], groups, set())
    assert got.done and got.modes[0].status is Status.IDENTIFIED
    # With a server term beside them, servers are chosen on that term alone.
    mixed = mode(Verdict.EXPLAINED, [("request.temperature", "1"), ("env.D", "d1")])
    chosen = step([mixed], groups, set()).groups
    assert chosen and any(g.head.values["env.D"] == "d1" for g in chosen)
    assert any(g.head.values["env.D"] == "d0" for g in chosen)


def test_the_choice_is_seeded_and_most_informative_first(tmp_path: Path) -> None:
    groups = matrix(tmp_path).groups()
    explained = [mode(Verdict.NOT_IDENTIFIABLE, [("env.A", "a1")], [("env.D", "d0")]),
                 mode(Verdict.TOO_FEW, [("env.B", "b0"), ("env.C", "c0")], name="finish_reason")]
    a = step(explained, groups, set(), seed=3)
    assert [g.group_id for g in a.groups] == [g.group_id for g in step(explained, groups, set(), seed=3).groups]
    assert {g.group_id for g in a.groups} != {g.group_id for g in step(explained, groups, set(), seed=4).groups} \
        or len(a.groups) == len(step(explained, groups, set(), seed=4).groups)
    # The first server chosen meets at least as many needs as any later one: a budget that keeps a
    # prefix keeps the most informative servers.
    first = a.groups[0]
    assert holds(first, [("env.A", "a1")], ["c1"]) or holds(first, [("env.B", "b0"), ("env.C", "c0")], ["c1"])
    assert Candidate("m", (("env.A", "a1"),), ("c1",)).__str__() == "m: env.A=a1"
    assert levels_of(first)["commit"] == "c1"


def test_a_conjunction_too_weak_to_be_significant_zooms_on_its_failing_corner(tmp_path: Path) -> None:
    """One term of a three-term bug: the servers that failed share two more values, and each of
    those refinements is a candidate whose corner the next phase runs."""
    groups = matrix(tmp_path).groups()
    corner = [g for g in groups if holds(g, [("env.A", "a1"), ("env.B", "b0"), ("env.C", "c0")], ["c1"])]
    weak = mode(Verdict.TOO_FEW, [("env.A", "a1")])
    weak = ModeExplanation(**{**weak.__dict__, "failing_cells": tuple((c.cell_id, Count(2, 3))
                                                                      for g in corner for c in g.cells)})
    got = step([weak], groups, {g.group_id for g in corner})
    terms = [c.terms for c in got.modes[0].candidates]
    assert terms == [(("env.A", "a1"),), (("env.A", "a1"), ("env.B", "b0")), (("env.A", "a1"), ("env.C", "c0"))]
    ran = {g.group_id for g in corner} | {g.group_id for g in got.groups}
    for candidate in terms:
        check_settled(groups, ran, candidate, ["c1"], 2)


def test_a_mode_still_unsettled_when_its_needs_are_met_gets_starts_where_the_doubt_is(tmp_path: Path) -> None:
    """Explain still says too few samples once every need of the phase has run: more starts go first
    to where explain places the doubt, a part that does not credibly fail or a term not yet shown
    needed, and else one more start to every need; the mode is not left as if nothing could tell."""
    groups = matrix(tmp_path).groups()
    one = [("env.A", "a1")]
    ran, _ = run_to_the_end(groups, set(), [mode(Verdict.EXPLAINED, one)])
    unsure = dataclasses.replace(mode(Verdict.TOO_FEW, one), unsure_parts=((Term("env.B", "b1"), Count(0, 4)),))
    got = step([unsure], groups, ran)
    corner = [g for g in groups if holds(g, [*one, ("env.B", "b1")], ["c1"]) and g.group_id not in ran]
    assert got.modes[0].status is Status.OPEN and corner
    assert len(got.groups) == min(2, len(corner)) and all(g in corner for g in got.groups)
    two = [("env.A", "a1"), ("env.B", "b1")]
    ran, _ = run_to_the_end(groups, set(), [mode(Verdict.EXPLAINED, two)])
    unneeded = dataclasses.replace(mode(Verdict.TOO_FEW, two), unneeded=(Term("env.B", "b1"),))
    got = step([unneeded], groups, ran)
    assert got.groups and all(holds(g, one, ["c1"]) and g.head.values["env.B"] != "b1" for g in got.groups)
    # No doubt named: one more start for every need, each server chosen meeting one.
    plain = step([mode(Verdict.TOO_FEW, two)], groups, ran)
    assert plain.groups and plain.modes[0].status is Status.OPEN
    assert all(holds(g, [], ["c1"]) for g in plain.groups)
    # The same mode explained is identified: its needs are met.
    assert step([mode(Verdict.EXPLAINED, two)], groups, ran).modes[0].status is Status.IDENTIFIED
