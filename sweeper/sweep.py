"""`sweep matrix`: a matrix file in, a run folder of Parquet results out.

Loads and checks everything that can be checked before any server starts (matrix, suite, commits,
GPU fit), writes the manifest, fans the unfinished server groups over Ray, writes each group's
results as it finishes, and summarises. `--resume` runs only the groups without stored results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from sweeper import __version__, gitrepo, history
from sweeper.cluster import Cluster
from sweeper.errors import ConfigError, GitError, Interrupted, StoreError, clip
from sweeper.matrix import (
    Install,
    Matrix,
    MatrixFile,
    ServerGroup,
    canonical,
    load_matrix,
    resolve_path,
    short_hash,
    with_model_paths,
)
from sweeper.portable import RepoSource
from sweeper.runner import GroupJob, GroupResult
from sweeper.storage import Location, local_side
from sweeper.store import SAMPLE_SCHEMA, RunDir, check_parquet, host_info, new_run_id, now_utc, open_run
from sweeper.suite import Suite, load_suite

DEFAULT_LOGICAL_GPUS = 4


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


def sim_repo(spec: str, cache: Path) -> Path:
    """`sim:<scenario>`: a simulated vLLM history made once by the simulator's own command line."""
    scenario = spec.split(":", 1)[1] or "demo"
    target = cache / f"sim-{scenario}"
    if not (target / ".git").exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Made in a folder of its own and renamed into place: two runs starting together each make
        # one, the first rename wins and the other is dropped.
        work = Path(tempfile.mkdtemp(prefix=f".sim-{scenario}.", dir=cache))
        try:
            done = subprocess.run([sys.executable, "-m", "sweeper.sim", "make-repo", str(work / "repo"), "--scenario",
                                   scenario], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise ConfigError(f"cannot make the simulated history {spec!r}: {done.stderr.strip()[-300:]}")
            with contextlib.suppress(OSError):  # another run was first
                (work / "repo").rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def repo_for(matrix: Matrix, runs_dir: str | Path) -> Path | None:
    install = matrix.spec.install
    if install.kind == "preinstalled" or not install.repo:
        if install.kind in ("sim", "source"):
            raise ConfigError("install.repo is required for this install kind", file=matrix.path, key="install.repo")
        return None
    if install.repo.startswith("sim:"):
        return sim_repo(install.repo, local_side(runs_dir) / ".cache")
    if gitrepo.is_url(install.repo):
        return gitrepo.ensure_clone(install.repo, local_side(runs_dir) / ".cache" / "repos")
    return resolve_path(matrix.path, install.repo)


def load_suites(paths: tuple[Path, ...]) -> Suite:
    """One suite, or several combined: case ids become `<suite>/<case>`."""
    suites = [load_suite(p) for p in paths]
    if len(suites) == 1:
        return suites[0]
    cases = tuple(dataclasses.replace(c, case_id=f"{s.name}/{c.case_id}") for s in suites for c in s.cases)
    digest = hashlib.sha256("".join(s.digest for s in suites).encode()).hexdigest()
    return Suite(name="+".join(s.name for s in suites), path=",".join(s.path for s in suites), cases=cases,
                 digest=digest)


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
    if matrix.spec.install.kind == "preinstalled" and len(commits) > 1:
        raise ConfigError(f"a preinstalled vLLM is one commit, but the commit axis has {len(commits)} values",
                          file=matrix.path, key="axes.commit")
    releases = history.release_package(install) is not None
    for ref in commits:
        if repo is None:
            # A release's version is its identity (what a bisect over the releases keys rows by).
            shas[ref] = ref if gitrepo.is_full_sha(ref) or releases else None
            if matrix.spec.install.kind == "wheels" and shas[ref] is None and not remote:
                raise ConfigError(f"commit {ref!r} needs install.repo to resolve it to a full sha",
                                  file=matrix.path, key="axes.commit")
        else:
            try:
                shas[ref] = gitrepo.resolve(repo, ref)
            except GitError as exc:
                raise ConfigError(str(exc), file=matrix.path, key="axes.commit") from None
    return Plan(matrix, suite, repo, shas, matrix.groups())


def portable_spec(matrix: Matrix) -> MatrixFile:
    """The settings workers get. Paths that name a place on every node (model paths, install.cache_dir,
    install.python) become absolute, as the matrix meant them; nothing else names the driver's disk.
    `install.repo` stays as written: a worker reads the repository only from its `RepoSource`."""
    spec = with_model_paths(matrix.spec, matrix.path)
    install = spec.install
    update = {k: str(resolve_path(matrix.path, v)) for k, v in (("cache_dir", install.cache_dir),
                                                                  ("python", install.python)) if v}
    if not update:
        return spec
    return spec.model_copy(update={"install": install.model_copy(update=update)})


def repo_source(install: Install, repo: Path | None) -> RepoSource | None:
    """How workers get the repository: a URL is cloned on each node; a local repository or a `sim:`
    history travels as a git bundle (made once per state of the repository). Only
    the kinds that build from the repository on the node (sim, source) need one."""
    if repo is None or install.kind not in ("sim", "source") or not install.repo:
        return None
    if gitrepo.is_url(install.repo):
        return RepoSource.of_url(install.repo)
    return RepoSource.bundle_of(Path(repo))


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
               address: str | None = None, gpus: float | None = None, cache_dir: Path | None = None,
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
        with Cluster(address, logical_gpus=sweep_gpus(plan.matrix, gpus)) as cluster:
            cluster.preflight(plan.matrix.spec.gpus_per_cell)
            for job, result in cluster.run(jobs, on_retry=lambda j, n, e: record_retry(run, j, n, e)):
                # The log first (a group without a server has none): a group is done once its cells are written.
                if result.log:
                    run.write_log(result.group_id, result.log_text())
                run.write_group(result.group_id, result.samples, result.cells)
                outcome.ran.append(result.group_id)
                if on_group:
                    on_group(job, result)
    except KeyboardInterrupt:
        raise Interrupted(run.uri, resume_command("matrix", str(matrix_path), runs_dir=runs_dir,
                                                  run_id=run.run_id)) from None
    return outcome


def resume_command(command: str, *args: str, runs_dir: str | Path, run_id: str) -> str:
    """The command line that continues an interrupted run."""
    where = [] if str(runs_dir) == "runs" else ["--runs-dir", str(runs_dir)]
    return shlex.join(["sweep", command, *args, *where, "--resume", run_id])


def sweep_gpus(matrix: Matrix, gpus: float | None) -> float | None:
    """Logical GPU slots for a local cluster: declared for the simulator, never for real vLLM."""
    if matrix.spec.install.kind == "sim":
        return gpus if gpus is not None else DEFAULT_LOGICAL_GPUS
    return gpus


def plan_text(plan: Plan) -> list[tuple[str, list[str]]]:
    """For --dry-run: each server to start, with the cells that reuse it."""
    out = []
    for g in plan.groups:
        head = g.head
        sha = plan.shas.get(head.commit)
        parts = [f"commit {head.commit}" + (f" ({sha[:12]})" if sha and sha != head.commit else ""), f"spec {head.spec_method}"
                 + (f" x{head.num_speculative_tokens}" if head.num_speculative_tokens else "")]
        if head.async_scheduling is not None:
            parts.append("async" if head.async_scheduling else "no-async")
        if head.attention_backend:
            parts.append(head.attention_backend)
        parts += [f"{k}={v}" for k, v in head.env.items() if _is_axis(plan, f"env.{k}")]
        parts += [f"{k} {v}" for k, v in head.serve.items() if _is_axis(plan, f"serve.{k}")]
        cells = [c.cell_id + _request_desc(c.request, plan) for c in g.cells]
        out.append((", ".join(parts), cells))
    return out


def _is_axis(plan: Plan, name: str) -> bool:
    return any(n == name for n, _ in plan.matrix.axes) or any(name in c.values for c in plan.matrix.cells)


def _request_desc(request: Mapping[str, Any], plan: Plan) -> str:
    fields = [f"{k}={canonical(v)}" for k, v in request.items() if _is_axis(plan, f"request.{k}")]
    return f"  [{', '.join(fields)}]" if fields else ""
