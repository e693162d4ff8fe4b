"""What a sweep's manifest records of its plan (`sweeper.plan.sweep_plan`), and the parts of a plan a
manifest gives back to a resumed run. Pure: records in, records out; the store writes them.
"""

from __future__ import annotations

from sweeper.plan.budget import Fit
from sweeper.plan.design import Design
from sweeper.plan.sweep_plan import Plan
from sweeper.spec.matrix import AdaptiveSpec, DesignSpec, short_hash
from sweeper.store.manifest import (
    AdaptiveRecord,
    BudgetRecord,
    CostRecord,
    DesignRecord,
    PhaseRecord,
    SweepManifest,
)


def sweep_manifest(plan: Plan, run_id: str) -> SweepManifest:
    """What a run of `plan` records (the store stamps when, where and by which sweeper)."""
    return SweepManifest(
        run_id=run_id, matrix_path=str(plan.matrix.path), matrix=plan.matrix.raw,
        matrix_digest=short_hash(plan.matrix.raw, 16), suite_path=tuple(str(p) for p in plan.matrix.suite_paths),
        suite=plan.suite.name, suite_digest=plan.suite.digest, commits=plan.shas, commit_order=plan.commit_order,
        repo=str(plan.repo) if plan.repo else None, cells=plan.n_cells, groups=len(plan.groups),
        design=design_record(plan.design), cost=CostRecord(**plan.profile.record()),
        adaptive=adaptive_record(plan.adaptive), budget=budget_record(plan.budget),
        phases=(design_phase(plan),))


def budget_record(fit: Fit | None) -> BudgetRecord | None:
    if fit is None:
        return None
    return BudgetRecord(gpu_hours=fit.budget_s / 3600.0, modelled_hours=fit.modelled_s / 3600.0,
                        servers=len(fit.kept), cells=sum(len(g.cells) for g in fit.kept),
                        left_servers=len(fit.left), left_cells=sum(len(g.cells) for g in fit.left),
                        left_groups=tuple(g.group_id for g in fit.left))


def design_record(d: Design) -> DesignRecord:
    return DesignRecord(kind=d.spec.kind, strength=d.strength, seed=d.spec.seed, servers=len(d.groups),
                        cells=len(d.cells), digest=d.digest)


def design_phase(plan: Plan) -> PhaseRecord:
    """A sweep's first phase: its design's servers (those a budget kept)."""
    return PhaseRecord(1, "design", tuple(g.group_id for g in plan.groups), len(plan.cells), plan.design.describe())


def adaptive_record(spec: AdaptiveSpec | None) -> AdaptiveRecord | None:
    if spec is None:
        return None
    return AdaptiveRecord(threshold=spec.threshold, detect=spec.detect, confidence=spec.confidence,
                          round=spec.round, width=spec.width)


def recorded_adaptive(manifest: SweepManifest) -> AdaptiveSpec | None:
    r = manifest.adaptive
    if r is None:
        return None
    return AdaptiveSpec(threshold=r.threshold, detect=r.detect, confidence=r.confidence, round=r.round, width=r.width)


def recorded_design(manifest: SweepManifest) -> DesignSpec:
    """The design a manifest records (the full product before designs were recorded)."""
    record = manifest.design
    if record is None or record.kind == "full":
        return DesignSpec(kind="full")
    return DesignSpec(kind="covering", strength=record.strength, seed=record.seed)
