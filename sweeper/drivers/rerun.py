"""`sweep matrix FILE --where AXIS=VALUE --resume RUN`: some cells of a stored sweep run again, into
the same run folder, their stored rows replaced and every other row kept.

The cells `--where` picks (`sweeper.spec.matrix_slice.matching`) run on a server of their own per server
group: only those cells' requests are sent. A group that has results keeps its other cells' rows;
the re-run cells' samples and cell rows take the place of theirs in the group's two files, written
as any group is (samples, then cells, each atomically), after the files as they were are copied to
`replaced/<time>/` (kept, never deleted). A driver killed between the two writes leaves the group
damaged: `sweep runs check` lists it, a resume runs it again whole, and the old files are still
under `replaced/`. The group's server log gets the new server's log appended. A group of the run
with no results yet runs whole (its other cells were never run either). The manifest records a
`rerun` phase: the groups, the cells and the `--where` pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from sweeper.drivers.sweep import RunOutcome, jobs_for, resumed_plan
from sweeper.errors import ConfigError, Interrupted, StoreError
from sweeper.execute.choice import choose
from sweeper.execute.executor import ExecutorFactory
from sweeper.execute.runner import GroupJob, GroupResult
from sweeper.plan.sweep_plan import Plan
from sweeper.spec.matrix import Cell, ServerGroup, legacy_cell_id
from sweeper.spec.matrix_slice import matching
from sweeper.store.manifest import PhaseRecord, SweepManifest, phases_of
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, now_utc, open_run


def check_options(where: Sequence[str] | None, resume: str | None, *, others: bool) -> None:
    """`--where` re-runs cells of a stored run: it needs `--resume`, and keeps the run's design."""
    if not where:
        return
    if not resume:
        raise ConfigError("re-runs cells of a stored run: add --resume RUN_ID", key="--where")
    if others:
        raise ConfigError("a re-run keeps the run's design, rule and budget: leave out --design, --adaptive "
                          "and --budget", key="--where")

@dataclass(frozen=True)
class Target:
    """One server to start: `group` (the cells to run), stored under `stored_id` (None: the group has
    no results yet, and runs whole)."""

    group: ServerGroup
    stored_id: str | None

    @property
    def name(self) -> str:
        return self.stored_id or self.group.group_id


def targets(plan: Plan, done: Collection[str], chosen: Sequence[Cell]) -> list[Target]:
    """Per server group of the run holding a chosen cell: the cells to run and where they are stored.
    A group neither stored nor in the plan (a covering design left it out, no zoom ran it) is not
    the run's: its cells are not run."""
    wanted = {c.cell_id for c in chosen}
    planned = {g.group_id for g in plan.groups}
    out = []
    for group in plan.matrix.groups():
        picked = tuple(c for c in group.cells if c.cell_id in wanted)
        if not picked:
            continue
        stored = next((gid for gid in (group.group_id, group.legacy_group_id) if gid in done), None)
        if stored is not None:
            out.append(Target(group if len(picked) == len(group.cells) else ServerGroup(group.server_key, picked),
                              stored))
        elif group.group_id in planned:
            out.append(Target(group, None))
    return out


def replaced(old: pa.Table, new: pa.Table, cells: Collection[Cell], group_id: str) -> pa.Table:
    """`old` without the rows of `cells` (by cell id, or the id a run written before cell ids kept
    every value gave them), then the rows of `new`, named after the stored group `group_id`."""
    gone = pa.array(sorted({c.cell_id for c in cells} | {legacy_cell_id(c)[0] for c in cells}), pa.string())
    kept = old.filter(pc.invert(pc.is_in(old["cell_id"], value_set=gone)))
    index = new.schema.get_field_index("group_id")
    new = new.set_column(index, new.schema.field(index), pa.array([group_id] * new.num_rows, pa.string()))
    return pa.concat_tables([kept.cast(new.schema), new])


def _read(run: RunDir, kind: str, group_id: str, schema: pa.Schema) -> pa.Table:
    path = run.file(kind, f"{group_id}.parquet").path
    table = ds.dataset([path], schema=schema, format="parquet", filesystem=run.fs).to_table()
    return table.replace_schema_metadata(schema.metadata)


def store_rerun(run: RunDir, target: Target, result: GroupResult, stamp: str) -> None:
    """The result of one re-run server in place of its cells' stored rows (see the module docstring)."""
    if target.stored_id is None:
        if result.log:
            run.write_log(result.group_id, result.log_text())
        run.write_group(result.group_id, result.samples, result.cells, result.metrics)
        return
    gid = target.stored_id
    samples = replaced(_read(run, "samples", gid, SAMPLE_SCHEMA), result.samples, target.group.cells, gid)
    cells = replaced(_read(run, "cells", gid, CELL_SCHEMA), result.cells, target.group.cells, gid)
    for kind in ("samples", "cells"):
        run.file("replaced", stamp, kind, f"{gid}.parquet").write_atomic(run.read_bytes(kind, f"{gid}.parquet"))
    old_log = run.read_log(gid)
    if old_log is not None:
        run.file("replaced", stamp, "logs", f"{gid}.log").write_atomic(old_log.encode("utf-8"))
    if result.log or old_log:
        ids = ", ".join(c.cell_id for c in target.group.cells)
        run.write_log(gid, (old_log or "") + f"\n===== sweep: re-run of {ids} at {stamp} =====\n" + result.log_text())
    run.write_group(gid, samples, cells)


def plan_rerun(matrix_path: str | Path, runs_dir: str | Path, run_id: str,
               where: Sequence[str]) -> tuple[RunDir, Plan, list[Target]]:
    """The run, its plan, and the servers that re-run the cells `where` picks (nothing is run)."""
    run = open_run(runs_dir, run_id, create=False)
    problem = run.manifest_problem()
    if problem:
        raise StoreError(f"{problem}; then re-run its cells")
    plan = resumed_plan(matrix_path, runs_dir, run)
    chosen = matching(plan.matrix, where)
    todo = targets(plan, run.done_groups(), chosen)
    if not todo:
        raise ConfigError(f"run {run_id} never ran a cell with {' '.join(where)} (its design left them out)",
                          key="--where")
    return run, plan, todo


def rerun(matrix_path: str | Path, *, runs_dir: str | Path, run_id: str, where: Sequence[str],
          executor: ExecutorFactory | None = None, cache_dir: Path | None = None,
          on_group: Callable[[GroupJob, GroupResult], None] | None = None,
          on_plan: Callable[[Plan, int], None] | None = None) -> RunOutcome:
    """Run the cells of run `run_id` that every `AXIS=VALUE` of `where` picks again (module docstring)."""
    run, plan, todo = plan_rerun(matrix_path, runs_dir, run_id, where)
    run.clean_temp()
    stamp = now_utc().strftime("%Y%m%dT%H%M%S.%fZ")
    outcome = RunOutcome(run, plan)
    jobs = jobs_for(plan, run, cache_dir, [t.group for t in todo])
    outcome.notes += [f"group {t.group.group_id} had no results: all its {len(t.group.cells)} cells run"
                      for t in todo if t.stored_id is None]

    def target_of(job: GroupJob) -> Target:
        return next(t for t in todo if t.group == job.group)

    if on_plan:
        on_plan(plan, len(jobs))
    try:
        with (executor or choose())(plan.matrix) as ex:
            ex.preflight(plan.matrix.spec.gpus_per_cell)
            for job, result in ex.run(jobs, on_retry=lambda j, n, e: run.record_retry(target_of(j).name, n, e)):
                target = target_of(job)
                store_rerun(run, target, result, stamp)
                outcome.ran.append(target.name)
                if on_group:
                    on_group(job, result)
    except KeyboardInterrupt:
        raise Interrupted(run.uri, run.run_id) from None
    _record(run, todo, where)
    return outcome


def _record(run: RunDir, todo: Sequence[Target], where: Sequence[str]) -> None:
    manifest = run.read_manifest()
    if not isinstance(manifest, SweepManifest):
        return
    phases = phases_of(manifest, sorted(run.done_groups()))
    phase = PhaseRecord(len(phases) + 1, "rerun", tuple(t.name for t in todo), sum(len(t.group.cells) for t in todo),
                        "--where " + " ".join(where))
    run.write_manifest(dataclasses.replace(manifest, phases=(*phases, phase)))
