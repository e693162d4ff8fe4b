"""`sweep matrix`: a matrix file in, a run folder of Parquet results out.

Loads and checks everything that can be checked before any server starts (matrix, suite, commits,
GPU fit), writes the manifest, hands the unfinished server groups to an executor (Ray by default),
writes each group's results as it finishes, and summarises. `--resume` runs only the groups
without stored results.

A covering design is the first phase of a run; unless the zoom is off, explain then reads every
phase's results and `sweeper.plan.zoom` chooses the servers of the next phase, until each failure mode is
identified or shown unexplained, no server left would tell its candidates apart, the phases run out
or the budget's hook (`ZoomOptions.afford`) refuses. Every phase writes into the same run folder,
and the manifest records each phase's servers and how the zoom ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sweeper.errors import ConfigError, GitError, Interrupted, StoreError, SweepError
from sweeper.execute.choice import choose
from sweeper.execute.executor import Executor, ExecutorFactory
from sweeper.execute.runner import GroupJob, GroupResult
from sweeper.install import git as gitrepo
from sweeper.install.matrix_loader import load_matrix
from sweeper.install.portable import portable_spec, repo_source
from sweeper.install.registry import kind_of, stated_profile
from sweeper.install.repository import repo_for
from sweeper.judge.axis_levels import axes_map, units
from sweeper.judge.explain import explain
from sweeper.plan import zoom
from sweeper.plan.budget import Ledger, budget_seconds
from sweeper.plan.sweep_plan import Plan, adaptive_spec, choose_design, plan_of
from sweeper.spec.matrix import AdaptiveSpec, DesignSpec, MatrixFile, ServerGroup, canonical, short_hash
from sweeper.spec.matrix_slice import Slice
from sweeper.spec.matrix_slice import apply as apply_slice
from sweeper.spec.suite import load_suites
from sweeper.store import frames as analysis
from sweeper.store.manifest import PhaseRecord, SweepManifest, commit_axis, phases_of
from sweeper.store.plan_records import recorded_adaptive, recorded_design, sweep_manifest
from sweeper.store.repair import rebuild_sweep
from sweeper.store.run_folder import RunDir, new_run_id, open_run

# A zoom phase's budget hook: (the phase's servers, most informative first; the servers this run
# has planned before them, the design's and earlier phases') -> the prefix to run.
Afford = Callable[[tuple[ServerGroup, ...], tuple[ServerGroup, ...]], tuple[ServerGroup, ...]]


@dataclass(frozen=True)
class ZoomOptions:
    """How a covering run zooms after its design phase (`sweeper.plan.zoom`)."""

    enabled: bool = True
    max_phases: int = 8  # zoom phases after the design, at most
    starts: int = zoom.STARTS
    alpha: float = 0.01  # explain's level: a mode is identified at 1 - alpha
    # The budget's hook: given the next phase's servers, most informative first, the ones to run
    # (a prefix of them, or none: the zoom stops, "budget spent"). None runs them all.
    afford: Afford | None = None
    on_phase: Callable[[PhaseRecord], None] | None = None  # told of each zoom phase before it runs
    # Samples and cells stored elsewhere (a triage's bisect at the commit swept, its commit named as
    # the matrix names it) that join the run's own whenever the zoom explains: servers that already
    # ran there are evidence, not servers the zoom has to start again to tell candidates apart.
    evidence: tuple[pd.DataFrame, pd.DataFrame] | None = None


@dataclass
class RunOutcome:
    run: RunDir
    plan: Plan
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was repaired before running
    phases: list[PhaseRecord] = field(default_factory=list)
    zoom: zoom.Step | None = None  # the zoom's last step: each mode's state (None: no zoom)
    zoom_summary: str | None = None


def make_plan(matrix_path: str | Path, runs_dir: str | Path, *, resolve: bool = True,
              design_spec: DesignSpec | None = None, adaptive: bool | AdaptiveSpec | None = None,
              budget_hours: float | None = None, cut: Slice | None = None) -> Plan:
    """Everything checkable before a server starts. `resolve=False` (a dry run) leaves refs of a
    remote repository unresolved rather than cloning it. `design_spec` overrides the matrix's
    `design:` key (default: the full product); `adaptive` its `adaptive:` key (True: the matrix's
    rule, else the default one); `budget_hours` fits the design's servers into that many GPU-hours; `cut` narrows the
    matrix to one commit or some cells (`sweeper.spec.matrix_slice`) before the design chooses."""
    matrix = load_matrix(matrix_path)
    if cut is not None:
        from sweeper.spec.yamlfile import load

        data, pos = load(matrix_path)
        matrix = apply_slice(matrix, data, pos, cut)
    chosen = choose_design(matrix, design_spec)
    rule = adaptive_spec(matrix.spec, adaptive)
    budget_s = None if budget_hours is None else budget_seconds(budget_hours)
    suite = load_suites(matrix.suite_paths)
    install = matrix.spec.install
    remote = install.repo is not None and gitrepo.is_url(install.repo)
    repo = None if (remote and not resolve) else repo_for(matrix, runs_dir)
    shas: dict[str, str | None] = {}
    commits = matrix.commits()
    kind = kind_of(install.kind)
    if problem := kind.commits_problem(commits):
        raise ConfigError(problem, file=matrix.path, key="axes.commit")
    releases = kind.release_package(install) is not None
    for ref in commits:
        if repo is None:
            # A release's version is its identity (what a bisect over the releases keys rows by).
            shas[ref] = ref if gitrepo.is_full_sha(ref) or releases else None
            if shas[ref] is None and not remote and (problem := kind.unresolved_problem(ref)):
                raise ConfigError(problem, file=matrix.path, key="axes.commit")
        else:
            try:
                shas[ref] = gitrepo.resolve(repo, ref)
            except GitError as exc:
                raise ConfigError(str(exc), file=matrix.path, key="axes.commit") from None
    order = history_order(repo, commit_axis(matrix.raw, shas), shas)
    return plan_of(matrix, suite, chosen, repo=repo, shas=shas, stated=stated_profile(matrix.spec), commit_order=order,
                   adaptive=rule, budget_s=budget_s)


def _resumed_design(run_id: str, old: SweepManifest, asked: DesignSpec | None) -> DesignSpec:
    """The design a run recorded (the full product before designs were recorded); `asked`, when
    given, must be the same."""
    spec = recorded_design(old)
    if asked is not None and _design_name(asked) != _design_name(spec):
        raise StoreError(f"run {run_id} ran the design {_design_name(spec)}, not {_design_name(asked)}; resume it "
                         "without --design, or start a new run")
    return spec


def _design_name(spec: DesignSpec) -> str:
    return "full" if spec.kind == "full" else f"covering:{spec.strength} (seed {spec.seed})"


def history_order(repo: Path | None, refs: Sequence[str], shas: Mapping[str, str | None]) -> tuple[str, ...] | None:
    """`refs` oldest first by their depth in `repo` (`git rev-list --count`), ties as listed; None
    when the depth of one is unknown (readers then keep the order the matrix lists)."""
    if repo is None or not refs or not Path(repo).is_dir():
        return None
    depth: dict[str, int] = {}
    for ref in refs:
        sha = shas.get(ref)
        try:
            depth[ref] = int(gitrepo.git(repo, "rev-list", "--count", str(sha))) if sha else -1
        except (SweepError, ValueError):
            depth[ref] = -1
    if any(d < 0 for d in depth.values()):
        return None
    return tuple(sorted(refs, key=lambda r: (depth[r], list(refs).index(r))))


def job_spec(plan: Plan) -> MatrixFile:
    """The matrix as a group's job carries it to a node (no driver path), with the plan's stopping rule."""
    return portable_spec(plan.matrix).model_copy(update={"adaptive": plan.adaptive or False})


def jobs_for(plan: Plan, run: RunDir, cache_dir: Path | None,
             groups: Sequence[ServerGroup] | None = None) -> list[GroupJob]:
    spec, source = job_spec(plan), repo_source(plan.matrix.spec.install, plan.repo)
    return [GroupJob(run_id=run.run_id, group=g, spec=spec, suite=plan.suite, sha=plan.shas.get(g.head.commit),
                     repo=source, cache_dir=str(Path(cache_dir).absolute()) if cache_dir else None)
            for g in (plan.groups if groups is None else groups)]


def run_matrix(matrix_path: str | Path, *, runs_dir: str | Path, run_id: str | None = None, resume: str | None = None,  # noqa: PLR0913  (the run's optional choices, by keyword)
               executor: ExecutorFactory | None = None, cache_dir: Path | None = None,
               on_group: Callable[[GroupJob, GroupResult], None] | None = None,
               on_plan: Callable[[Plan, int], None] | None = None,
               design_spec: DesignSpec | None = None, adaptive: bool | AdaptiveSpec | None = None,
               budget_hours: float | None = None, zoom_options: ZoomOptions | None = None,
               cut: Slice | None = None) -> RunOutcome:
    """Run `matrix_path`'s design (`design_spec`, else the matrix's `design:` key, else the full
    product), adaptive (`adaptive`, else the matrix's `adaptive:` key) and within `budget_hours`
    GPU-hours when given, over the slice `cut` of the matrix when given, then, for a covering design,
    its zoom (`zoom_options`; on by default). A resumed run keeps the design, rule and budget its
    manifest records (and must be given the same `cut`), and zooms on from every phase's results."""
    options = zoom_options or ZoomOptions()
    notes: list[str] = []
    if resume:
        run = open_run(runs_dir, resume, create=False)
        # The design the run recorded; a lost manifest's copies in the results' footers tell it too.
        recorded = [run.read_manifest()] if not run.manifest_problem() else run.recorded_manifests()
        sweeps = [m for m in recorded if isinstance(m, SweepManifest)]
        if sweeps:
            design_spec = _resumed_design(resume, sweeps[0], design_spec)
            adaptive = recorded_adaptive(sweeps[0]) or False
            if sweeps[0].budget is not None:
                budget_hours = sweeps[0].budget.gpu_hours
        plan = make_plan(matrix_path, runs_dir, design_spec=design_spec, adaptive=adaptive, budget_hours=budget_hours,
                         cut=cut)
        if run.manifest_problem():
            # Rebuilt from this matrix, once the results say they were made from it.
            notes.append(rebuild_manifest(plan, run))
        check_same_run(resume, run.read_manifest(), plan)
        # A damaged group is not done: its files go aside (kept) and the group runs again.
        damage = run.scan(probes=False, manifest=False).damage
        if damage:
            notes += [f"{d}: moved aside, runs again" for d in damage]
            run.move_aside(damage)
        run.clean_temp()
    else:
        plan = make_plan(matrix_path, runs_dir, design_spec=design_spec, adaptive=adaptive, budget_hours=budget_hours,
                         cut=cut)
        run = open_run(runs_dir, run_id or new_run_id(plan.matrix.name), create=True)
        run.write_manifest(sweep_manifest(plan, run.run_id))
    done = run.done_groups()
    # A run written before cell ids kept every value names its groups the old way.
    jobs = [j for j in jobs_for(plan, run, cache_dir)
            if j.group.group_id not in done and j.group.legacy_group_id not in done]
    outcome = RunOutcome(run, plan, skipped=sorted(done), notes=notes)
    manifest = run.read_manifest()
    outcome.phases = list(phases_of(manifest, sorted(done))) if isinstance(manifest, SweepManifest) else []
    zooming = options.enabled and plan.zooms
    if zooming and plan.budget is not None and options.afford is None:
        options = dataclasses.replace(options, afford=budget_afford(plan))
    if on_plan:
        on_plan(plan, len(jobs))
    if not jobs and not zooming:
        return outcome
    try:
        with (executor or choose())(plan.matrix) as ex:
            ex.preflight(plan.matrix.spec.gpus_per_cell)
            _run_jobs(ex, run, jobs, outcome, on_group)
            if zooming:
                _zoom(plan, run, ex, outcome, options, cache_dir, on_group)
    except KeyboardInterrupt:
        raise Interrupted(run.uri, run.run_id) from None
    return outcome


def rebuild_manifest(plan: Plan, run: RunDir) -> str:
    """`run`'s lost or damaged manifest made anew from `plan`, once its results agree (a zoom may have
    run any of the matrix's cells)."""
    return rebuild_sweep(run, sweep_manifest(plan, run.run_id), {c.cell_id for c in plan.matrix.cells})


def check_same_run(run_id: str, old: object, plan: Plan) -> None:
    """StoreError unless the run `run_id` (its manifest `old`) was made from `plan`'s matrix and suite,
    with the same commits, design and budget: what a resumed run (or a re-run of some cells) needs."""
    if not isinstance(old, SweepManifest) or old.matrix_digest != short_hash(plan.matrix.raw, 16) \
            or old.suite_digest != plan.suite.digest:
        raise StoreError(f"run {run_id} was made from another matrix or suite; start a new run instead")
    if old.commits != plan.shas:
        raise StoreError(f"run {run_id}: a commit ref now resolves elsewhere ({canonical(old.commits)}); "
                         "start a new run instead")
    if old.design is not None and old.design.digest != plan.design.digest:
        raise StoreError(f"run {run_id}: its design now chooses other cells than it ran; start a new run "
                         "instead")
    if old.budget is not None and plan.budget is not None \
            and set(old.budget.left_groups) != {g.group_id for g in plan.budget.left}:
        raise StoreError(f"run {run_id}: its budget now fits other servers than it ran; start a new run instead")


def resumed_plan(matrix_path: str | Path, runs_dir: str | Path, run: RunDir) -> Plan:
    """The plan of a stored sweep run, made again from its matrix file with the design, rule and
    budget its manifest records, and checked to be the run's (`check_same_run`)."""
    old = run.read_manifest()
    if not isinstance(old, SweepManifest):
        raise StoreError(f"run {run.run_id} is a {old.kind} run, not a sweep of a matrix")
    budget_hours = old.budget.gpu_hours if old.budget is not None else None
    plan = make_plan(matrix_path, runs_dir, design_spec=recorded_design(old),
                     adaptive=recorded_adaptive(old) or False, budget_hours=budget_hours)
    check_same_run(run.run_id, old, plan)
    return plan


def _run_jobs(ex: Executor, run: RunDir, jobs: Sequence[GroupJob], outcome: RunOutcome,
              on_group: Callable[[GroupJob, GroupResult], None] | None) -> None:
    if not jobs:
        return
    for job, result in ex.run(jobs, on_retry=lambda j, n, e: run.record_retry(j.group.group_id, n, e)):
        # The log first (a group without a server has none): a group is done once its cells are written.
        if result.log:
            run.write_log(result.group_id, result.log_text())
        run.write_group(result.group_id, result.samples, result.cells, result.metrics)
        outcome.ran.append(result.group_id)
        if on_group:
            on_group(job, result)


def _zoom(plan: Plan, run: RunDir, ex: Executor, outcome: RunOutcome, options: ZoomOptions,  # noqa: PLR0917
          cache_dir: Path | None, on_group: Callable[[GroupJob, GroupResult], None] | None) -> None:
    """Zoom phases until the zoom is done (see the module docstring); the manifest records each."""
    groups = plan.matrix.groups()
    seed = plan.design.spec.seed
    why = "every failure mode settled"
    elsewhere = None if options.evidence is None else \
        {str(c): zoom.server_levels(axes_map(a)) for c, a in zip(options.evidence[1]["cell_id"],
                                                                 options.evidence[1]["axes"], strict=True)}
    while True:
        cells, samples = analysis.load_cells(run), analysis.load_samples(run)
        read = cells
        if options.evidence is not None:
            samples = pd.concat([samples, options.evidence[0]], ignore_index=True)
            read = pd.concat([cells, options.evidence[1]], ignore_index=True)
        found = explain(samples, read, suite=plan.suite, commit_order=plan.commit_order, alpha=options.alpha)
        depth = sum(1 for p in outcome.phases if p.kind == "zoom")
        step = zoom.step(found.modes, groups, run.done_groups(), seed=seed + len(outcome.phases),
                         starts=options.starts, depth=depth, observed=ran_levels(cells),
                         elsewhere=elsewhere)
        outcome.zoom = step
        if step.done:
            if any(m.status is zoom.Status.EXHAUSTED for m in step.modes):
                why = "no informative servers left"
            break
        if depth >= options.max_phases:
            why = f"the zoom's {options.max_phases} phases are spent"
            break
        chosen = options.afford(step.groups, _held(plan, outcome)) if options.afford else step.groups
        if not chosen:
            why = "the budget is spent"
            break
        open_modes = [m for m in step.modes if m.status is zoom.Status.OPEN]
        reason = "; ".join(str(c) for m in open_modes for c in m.candidates)
        phase = PhaseRecord(len(outcome.phases) + 1, "zoom", tuple(g.group_id for g in chosen),
                            sum(len(g.cells) for g in chosen), reason)
        outcome.phases.append(phase)
        _record_phases(run, outcome.phases, None)
        if options.on_phase:
            options.on_phase(phase)
        _run_jobs(ex, run, jobs_for(plan, run, cache_dir, chosen), outcome, on_group)
    outcome.zoom_summary = zoom_summary(outcome.zoom, why)
    _record_phases(run, outcome.phases, outcome.zoom_summary)


def budget_afford(plan: Plan) -> Afford:
    """The zoom's hook under `sweep matrix --budget`: the longest prefix of a zoom phase's servers
    (most informative first) that fits into the budget once every phase so far is paid as the cost
    model prices it (`Plan.price_beside`): a sweep's ledger charges nothing measured, its phases are
    priced whole, the design's servers with them."""
    assert plan.budget is not None
    ledger = Ledger(plan.budget.budget_s)

    def afford(groups: tuple[ServerGroup, ...], held: tuple[ServerGroup, ...]) -> tuple[ServerGroup, ...]:
        return ledger.afford(groups, plan.price_beside(held))
    return afford


def _held(plan: Plan, outcome: RunOutcome) -> tuple[ServerGroup, ...]:
    """The servers a run has planned so far: its design's and every zoom phase's."""
    by_id = {g.group_id: g for g in plan.matrix.groups()}
    ran = {gid for p in outcome.phases for gid in p.groups} | {g.group_id for g in plan.groups}
    return tuple(by_id[g] for g in sorted(ran) if g in by_id)


def ran_levels(cells: pd.DataFrame) -> dict[str, dict[str, str | None]]:
    """Per group run, the levels that ran where they differ from what its cells asked for."""
    if cells.empty or "axes" not in cells.columns:
        return {}
    rows = cells.drop_duplicates("group_id").to_dict("records")
    keys = [(str(r["cell_id"]), str(r["group_id"])) for r in rows]
    table = units(keys, {str(r["cell_id"]): axes_map(r["axes"]) for r in rows},
                  {str(r["cell_id"]): str(r.get("commit")) for r in rows}, {str(r["cell_id"]): r for r in rows})
    out: dict[str, dict[str, str | None]] = {}
    for i, (_, gid) in enumerate(keys):
        moved = {d: table.dims[d][i] for d, subs in table.substituted.items() if subs[i]}
        if moved:
            out[gid] = moved
    return out


def zoom_summary(step: zoom.Step | None, why: str) -> str:
    """How the zoom ended: why it stopped, and each failure mode's state."""
    if step is None or not step.modes:
        return f"stopped: {why}; no failures"
    modes = "; ".join(f"{m.mode}: {m.status}" + (f" ({' or '.join(str(c).split(': ', 1)[1] for c in m.candidates)})"
                                                  if m.candidates else "") for m in step.modes)
    return f"stopped: {why}; {modes}"


def _record_phases(run: RunDir, phases: Sequence[PhaseRecord], summary: str | None) -> None:
    manifest = run.read_manifest()
    if isinstance(manifest, SweepManifest):
        run.write_manifest(dataclasses.replace(manifest, phases=tuple(phases), zoom=summary))


