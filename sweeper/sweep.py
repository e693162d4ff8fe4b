"""`sweep matrix`: a matrix file in, a run folder of Parquet results out.

Loads and checks everything that can be checked before any server starts (matrix, suite, commits,
GPU fit), writes the manifest, hands the unfinished server groups to an executor (Ray by default),
writes each group's results as it finishes, and summarises. `--resume` runs only the groups
without stored results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from sweeper import __version__, gitrepo
from sweeper.errors import ConfigError, GitError, Interrupted, StoreError, clip
from sweeper.executor import ExecutorFactory, choose
from sweeper.install import kind_of
from sweeper.matrix import Matrix, MatrixFile, ServerGroup, canonical, load_matrix, short_hash
from sweeper.portable import RepoSource, portable_spec, repo_source
from sweeper.repos import repo_for
from sweeper.runner import GroupJob, GroupResult
from sweeper.storage import Location
from sweeper.store import SAMPLE_SCHEMA, RunDir, check_parquet, host_info, new_run_id, now_utc, open_run
from sweeper.suite import Suite, load_suites


@dataclass
class Plan:
    matrix: Matrix
    suite: Suite
    repo: Path | None
    shas: dict[str, str | None]
    groups: tuple[ServerGroup, ...]

    @property
    def job_spec(self) -> MatrixFile:
        return portable_spec(self.matrix)

    @property
    def repo_source(self) -> RepoSource | None:
        return repo_source(self.matrix.spec.install, self.repo)

    @property
    def n_cells(self) -> int:
        return len(self.matrix.cells)

    def requests_per_cell(self) -> int:
        return sum(c.repeat for c in self.suite.cases) * self.matrix.spec.repeats


@dataclass
class RunOutcome:
    run: RunDir
    plan: Plan
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was repaired before running


def make_plan(matrix_path: str | Path, runs_dir: str | Path, *, resolve: bool = True) -> Plan:
    """Everything checkable before a server starts. `resolve=False` (a dry run) leaves refs of a
    remote repository unresolved rather than cloning it."""
    matrix = load_matrix(matrix_path)
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
    return Plan(matrix, suite, repo, shas, matrix.groups())


def manifest(plan: Plan, run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id, "kind": "matrix", "created": now_utc().isoformat(), "sweeper": __version__,
        "host": host_info(), "matrix_path": str(plan.matrix.path), "matrix": plan.matrix.raw,
        "matrix_digest": short_hash(plan.matrix.raw, 16), "suite_path": [str(p) for p in plan.matrix.suite_paths],
        "suite": plan.suite.name, "suite_digest": plan.suite.digest,
        "commits": plan.shas, "repo": str(plan.repo) if plan.repo else None,
        "cells": len(plan.matrix.cells), "groups": len(plan.groups),
    }


def rebuild_manifest(run: RunDir, plan: Plan) -> str:
    """Write `run`'s lost or damaged manifest.json anew from `plan`, once the results say they were
    made from it: the manifest each cells file recorded (matrix and suite digests, resolved commits),
    and the cells' own ids, suite digests and commit shas. Raises StoreError saying what disagrees."""
    from sweeper import analysis

    where = run.manifest_file
    digest = short_hash(plan.matrix.raw, 16)
    recorded = run.recorded_manifests()
    why = []
    for rec in recorded:
        if rec.get("kind", "matrix") != "matrix":
            why.append(f"the results are of a {clip(rec.get('kind'))} run, not a sweep")
        if rec.get("matrix_digest") not in (None, digest):
            why.append(f"the results were made from another matrix (digest {clip(rec.get('matrix_digest'))}; "
                       f"{plan.matrix.path} now has {digest}): pass the matrix as it was")
        if rec.get("suite_digest") not in (None, plan.suite.digest):
            why.append("the results were made with another suite (its digest differs)")
        if rec.get("commits") not in (None, plan.shas):
            why.append(f"the results' commits {canonical(rec.get('commits'))[:200]} differ from what the refs "
                       "resolve to now")
    # Every result row that reads: the cells of sound groups, the samples of every group (those
    # of a group cut short between its two writes too).
    columns = ["cell_id", "suite_digest", "commit", "commit_sha"]
    facts = analysis.load_table(run, "cells", columns).to_pylist()
    samples = [f for f in run.files("samples")] + [run.samples_path(g).path for g in run.scan(probes=False,
                                                                                              manifest=False).partial]
    readable = [f for f in samples if not check_parquet(Location(run.fs, f, f, run.local),
                                                        run.fs.get_file_info(f)).problem]
    if readable:
        rows = ds.dataset(readable, schema=SAMPLE_SCHEMA, filesystem=run.fs).to_table(columns=columns)
        facts += rows.group_by(columns).aggregate([]).to_pylist()
    known = {c.cell_id for c in plan.matrix.cells}
    for row in facts:
        if row["cell_id"] not in known:
            why.append(f"the results hold cell {clip(row['cell_id'])}, which {plan.matrix.path} does not make")
        elif row["suite_digest"] not in (None, plan.suite.digest):
            why.append(f"cell {clip(row['cell_id'])} was run with another suite (its digest differs)")
        elif row["commit_sha"] and plan.shas.get(row["commit"]) not in (None, row["commit_sha"]):
            why.append(f"cell {clip(row['cell_id'])} ran commit {row['commit_sha'][:12]}, "
                       f"but {clip(row['commit'])} resolves to {str(plan.shas.get(row['commit']))[:12]} now")
    if why:
        raise StoreError(f"cannot rebuild {where}: {why[0]}")
    data = manifest(plan, run.run_id)
    first = recorded[0] if recorded else {}
    data.update({k: first[k] for k in ("created", "host", "sweeper") if k in first})
    n_cells = len({row["cell_id"] for row in facts})
    data["repaired"] = {"at": now_utc().isoformat(), "matrix_path": str(plan.matrix.path),
                        "checked_against": f"{len(recorded)} recorded manifests, {n_cells} cells"}
    kept = ""
    if where.exists():
        from sweeper.store import MANIFEST, Damage

        moved = run.move_aside([Damage(run.run_id, MANIFEST, "damaged", (MANIFEST,))])
        kept = f"; the damaged one is kept as {moved[0].split(' -> ')[1]}" if moved else ""
    run.write_manifest(data)
    return (f"run {run.run_id}: manifest.json rebuilt from {plan.matrix.path}, checked against "
            f"{len(recorded)} recorded manifests and the rows of {n_cells} cells{kept}")


def jobs_for(plan: Plan, run: RunDir, cache_dir: Path | None) -> list[GroupJob]:
    spec, source = plan.job_spec, plan.repo_source
    return [GroupJob(run_id=run.run_id, group=g, spec=spec, suite=plan.suite, sha=plan.shas.get(g.head.commit),
                     repo=source, cache_dir=str(Path(cache_dir).absolute()) if cache_dir else None)
            for g in plan.groups]


def record_retry(run: RunDir, job: GroupJob, attempt: int, error: str) -> None:
    """A group lost with its node or worker and submitted again: `manifest.json` lists it."""
    data = run.read_manifest()
    data.setdefault("retried", []).append({"group_id": job.group.group_id, "attempt": attempt, "error": error,
                                           "at": now_utc().isoformat()})
    run.write_manifest(data)


def run_matrix(matrix_path: str | Path, *, runs_dir: str | Path, run_id: str | None = None, resume: str | None = None,
               executor: ExecutorFactory | None = None, cache_dir: Path | None = None,
               on_group: Callable[[GroupJob, GroupResult], None] | None = None,
               on_plan: Callable[[Plan, int], None] | None = None) -> RunOutcome:
    plan = make_plan(matrix_path, runs_dir)
    notes: list[str] = []
    if resume:
        run = open_run(runs_dir, resume, create=False)
        if run.manifest_problem():
            # Rebuilt from this matrix, once the results say they were made from it.
            notes.append(rebuild_manifest(run, plan))
        old = run.read_manifest()
        if old.get("matrix_digest") != short_hash(plan.matrix.raw, 16) or old.get("suite_digest") != plan.suite.digest:
            raise StoreError(f"run {resume} was made from another matrix or suite; start a new run instead")
        if old.get("commits") != plan.shas:
            raise StoreError(f"run {resume}: a commit ref now resolves elsewhere ({canonical(old.get('commits'))}); "
                             "start a new run instead")
        # A damaged group is not done: its files go aside (kept) and the group runs again.
        damage = run.scan(probes=False, manifest=False).damage
        if damage:
            notes += [f"{d}: moved aside, runs again" for d in damage]
            run.move_aside(damage)
        run.clean_temp()
    else:
        run = open_run(runs_dir, run_id or new_run_id(plan.matrix.name), create=True)
        run.write_manifest(manifest(plan, run.run_id))
    done = run.done_groups()
    jobs = [j for j in jobs_for(plan, run, cache_dir) if j.group.group_id not in done]
    outcome = RunOutcome(run, plan, skipped=sorted(done), notes=notes)
    if on_plan:
        on_plan(plan, len(jobs))
    if not jobs:
        return outcome
    try:
        with (executor or choose())(plan.matrix) as ex:
            ex.preflight(plan.matrix.spec.gpus_per_cell)
            for job, result in ex.run(jobs, on_retry=lambda j, n, e: record_retry(run, j, n, e)):
                # The log first (a group without a server has none): a group is done once its cells are written.
                if result.log:
                    run.write_log(result.group_id, result.log_text())
                run.write_group(result.group_id, result.samples, result.cells)
                outcome.ran.append(result.group_id)
                if on_group:
                    on_group(job, result)
    except KeyboardInterrupt:
        raise Interrupted(run.uri, run.run_id) from None
    return outcome


