"""A sweep's plan: which servers and cells a run of a matrix starts, with which stopping rule, at what
modelled GPU time, within what budget. Pure: made from a matrix, a suite and commits already loaded
and resolved (`sweeper.drivers.sweep.make_plan` does the loading), read by the driver that runs it
and by the dry run's text (`sweeper.reports.preview`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sweeper.judge.sequential import Rule
from sweeper.plan import budget, cost, design
from sweeper.spec.matrix import AdaptiveSpec, Cell, DesignSpec, Matrix, MatrixFile, ServerGroup
from sweeper.spec.suite import Suite


@dataclass(frozen=True)
class Plan:
    matrix: Matrix
    suite: Suite
    repo: Path | None
    shas: dict[str, str | None]
    design: design.Design
    stated: cost.Profile  # what the matrix's install kind states a start costs (its `cost:` key may override)
    commit_order: tuple[str, ...] | None = None  # the commit axis oldest first, where the repository tells
    adaptive: AdaptiveSpec | None = None  # cells stop when settled (`sweeper.judge.sequential`); None: whole suites
    budget: budget.Fit | None = None  # `--budget`: the design's servers that fit, and those left

    @property
    def groups(self) -> tuple[ServerGroup, ...]:
        """The servers this plan starts: the design's (all of the matrix's for the full product), less
        those a budget left out."""
        return self.budget.kept if self.budget is not None else self.design.groups

    @property
    def profile(self) -> cost.Profile:
        return cost.profile_for(self.matrix.spec, self.stated)

    @property
    def rule(self) -> Rule | None:
        return rule_of(self.adaptive)

    def estimate(self, groups: tuple[ServerGroup, ...] | None = None, *, adaptive: bool = True) -> cost.Estimate:
        """Modelled GPU time of this plan's servers (or of `groups`, e.g. the full product's); an
        adaptive plan's cells at the samples that settle a clean cell (`adaptive=False`: whole suites)."""
        return cost.estimate(self.groups if groups is None else groups, self.matrix.spec, self.profile,
                             self.modelled_requests_per_cell() if adaptive else self.requests_per_cell())

    def price_beside(self, held: Sequence[ServerGroup]) -> Callable[[Sequence[ServerGroup]], float]:
        """A ledger's price of more servers (`budget.Ledger.afford`): the modelled GPU-seconds of them
        together with the servers `held` (planned before them), as the design's servers were fitted;
        an install is paid once per commit."""
        return lambda groups: self.estimate((*held, *groups)).gpu_seconds

    def modelled_requests_per_cell(self) -> int:
        full, rule = self.requests_per_cell(), self.rule
        return rule.expected_samples(full) if rule is not None else full

    @property
    def n_cells(self) -> int:
        return len(self.cells)

    @property
    def cells(self) -> tuple[Cell, ...]:
        """The cells this plan runs (the design's, less a budget's left-out servers)."""
        return tuple(c for g in self.groups for c in g.cells)

    def requests_per_cell(self) -> int:
        return sum(c.repeat for c in self.suite.cases) * self.matrix.spec.repeats

    @property
    def zooms(self) -> bool:
        """Whether this plan's design leaves cells a zoom could add (a covering subset, not the product).
        A budgeted plan's zoom runs what the budget leaves."""
        return self.design.spec.kind == "covering" and len(self.design.groups) < self.design.full_groups


def rule_of(spec: AdaptiveSpec | None) -> Rule | None:
    if spec is None:
        return None
    return Rule(threshold=spec.threshold, detect=spec.detect, confidence=spec.confidence, width=spec.width,
                round=spec.round)


def adaptive_spec(spec: MatrixFile, adaptive: bool | AdaptiveSpec | None) -> AdaptiveSpec | None:
    """The stopping rule a sweep's cells run under: `adaptive` itself when a rule; True: the matrix's
    `adaptive:` rule, else the default one; None: the matrix's key (none without it); False: none."""
    if isinstance(adaptive, AdaptiveSpec):
        return adaptive
    if adaptive:
        return spec.adaptive_spec or AdaptiveSpec()
    if adaptive is None:
        return spec.adaptive_spec
    return None


def choose_design(matrix: Matrix, asked: DesignSpec | None) -> design.Design:
    """The design a sweep runs: `asked`, else the matrix's `design:` key (default: the full product)."""
    return design.choose(matrix, asked or matrix.spec.design_spec)


def plan_of(matrix: Matrix, suite: Suite, chosen: design.Design, *, repo: Path | None,
            shas: dict[str, str | None], stated: cost.Profile, commit_order: tuple[str, ...] | None,
            adaptive: AdaptiveSpec | None, budget_s: float | None) -> Plan:
    """The plan of `chosen` over `matrix`; with `budget_s`, its servers that fit into that many
    GPU-seconds (`budget.fit`), priced by the plan's own profile (never by what a run measured), so
    that a resumed run fits the same servers."""
    plan = Plan(matrix, suite, repo, shas, chosen, stated, commit_order, adaptive=adaptive)
    if budget_s is None:
        return plan
    fit = budget.fit(chosen.groups, plan.profile, requests_per_cell=plan.modelled_requests_per_cell(),
                     gpus=matrix.spec.gpus_per_cell, installs=True, budget_s=budget_s, bench=matrix.spec.bench)
    return dataclasses.replace(plan, budget=fit)
