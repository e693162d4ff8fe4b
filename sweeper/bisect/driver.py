"""`sweep bisect`: run the pure searches (`sweeper.bisect.search`) with real probes on Ray.

A bisect has one or more targets: cells of a matrix (all settings but the commit), each with its
own search over the same first-parent range. A round asks every open search what it wants, merges
the wants by (commit, server key) so that cells sharing a server share its start, and runs the K
most valuable server groups at once (K = GPU slots). One probe = one server start replaying the
requests of every cell it serves; each cell's samples are split into failure modes
(`sweeper.bisect.modes`) and told to that cell's search.

An install failure, a hang, or a server that won't start for a reason naming none of the cell's
settings (a port in use, a full disk) makes the commit untestable for that cell (skipped). A server
that crashes while serving the cell's requests is the cell failing: its samples count, and the
unanswered ones form the crash's own mode, named by its signature (exception type + innermost vLLM
frame); a start refused with a reason that names the cell's settings is one failing sample of the
mode `refused: <reason>` (see `sweeper.vllm.crash`). Samples already stored for the same commit +
cell settings + suite digest, in
any run under `runs/`, are used before anything runs, which is also how `--resume` spends no probe
twice: the searches are rebuilt from what is on disk, in the same order every time.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sweeper import __version__, analysis
from sweeper.bisect import modes as fm
from sweeper.bisect.report import describe
from sweeper.bisect.search import BisectReport, Search
from sweeper.catalogue import Wanted
from sweeper.errors import BisectError, Interrupted, SweepError
from sweeper.executor import Executor, ExecutorFactory, choose
from sweeper.history import History, history_for
from sweeper.matrix import Cell, Matrix, ServerGroup, canonical, make_cell
from sweeper.portable import portable_spec, repo_source
from sweeper.records import BisectManifest, SweepManifest
from sweeper.repos import repo_for
from sweeper.runner import GroupJob, GroupResult
from sweeper.status import ProbeStatus
from sweeper.storage import Location
from sweeper.store import (
    PROBE_SCHEMA,
    RunDir,
    new_run_id,
    now_utc,
    open_run,
    table,
)
from sweeper.suite import Suite, load_suites


@dataclass
class StartRecord:
    """One server start of one cell at one commit: the label sets of its samples."""

    key: tuple[str, str]  # (run_id, group_id): sorts the same way on every rebuild
    sets: list[tuple[str, frozenset[str]]]  # per sample: (case_id, failed check labels)
    reused: bool


@dataclass
class Evidence:
    starts: list[StartRecord] = field(default_factory=list)
    skip: str | None = None


@dataclass
class Target:
    """One bisected cell: its settings (the commit aside) and what is known at each commit."""

    cell: Cell
    evidence: dict[str, Evidence] = field(default_factory=lambda: defaultdict(Evidence))

    @property
    def settings_key(self) -> str:
        return self.cell.settings_key

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v if isinstance(v, str) else canonical(v)}"
                        for k, v in self.cell.values.items() if k != "commit") or "(the only cell)"


@dataclass
class BisectOutcome:
    run: RunDir
    reports: list[BisectReport]
    targets: list[Target]
    summary: dict[str, Any]


def select_cell(matrix: Matrix, where: Sequence[str]) -> Cell:
    """The one cell (settings apart from the commit) that `--where AXIS=VALUE` pairs pick."""
    cells = select_cells(matrix, where)
    if len(cells) > 1:
        listed = "; ".join(" ".join(f"{k}={_text(v)}" for k, v in c.values.items() if k != "commit")
                           for c in cells[:8])
        raise BisectError(f"{len(cells)} cells match {' '.join(where) or '(nothing)'}; add --where to pick "
                          f"one of: {listed}")
    return cells[0]


def _text(v: Any) -> str:
    return v if isinstance(v, str) else canonical(v)


def select_cells(matrix: Matrix, where: Sequence[str]) -> list[Cell]:
    """Every distinct cell setting (commit aside) matching `--where AXIS=VALUE` pairs."""
    wanted: dict[str, str] = {}
    for item in where:
        if "=" not in item:
            raise BisectError(f"--where {item!r}: expected AXIS=VALUE")
        key, value = item.split("=", 1)
        wanted[key.strip()] = value.strip()
    axis_names = {n for n, _ in matrix.axes} | {k for c in matrix.cells for k in c.values}
    for key in wanted:
        if key not in axis_names:
            raise BisectError(f"--where {key}: not an axis of {matrix.path}; axes: {', '.join(sorted(axis_names))}")
    matches = [c for c in matrix.cells if all(k == "commit" or _text(c.values.get(k)) == v for k, v in wanted.items())]
    by_settings: dict[str, Cell] = {}
    for c in matches:
        by_settings.setdefault(c.settings_key, c)
    if not by_settings:
        raise BisectError(f"no cell of {matrix.path} matches {' '.join(where) or '(nothing)'}")
    return list(by_settings.values())


def cell_at(matrix: Matrix, cell: Cell, sha: str) -> Cell:
    order = [n for n, _ in matrix.axes]
    return make_cell(matrix.spec, {**cell.values, "commit": sha}, order)


def load_evidence(runs_dir: str | os.PathLike[str] | Location, targets: Sequence[Target], suite: Suite,
                  shas: set[str], labels: dict[tuple[str, str], str], this_run: str) -> None:
    """Fill each target's evidence from every stored run: samples grouped by server start, and the
    commits where the cell could not be tested. Only the files whose catalogue entries hold these
    settings, commits and suite are opened, and only the columns and rows asked for are read: the
    cost follows what matches, not the size of the whole folder."""
    by_key = {t.settings_key: t for t in targets}
    wanted = Wanted(frozenset(by_key), suite.digest, frozenset(shas))
    base = (pc.field("suite_digest") == suite.digest) & pc.field("settings_key").isin(pa.array(sorted(by_key))) \
        & pc.field("commit_sha").isin(pa.array(sorted(shas)))
    read = analysis.read_matching(runs_dir, wanted, {
        "cells": ["run_id", "group_id", "settings_key", "commit_sha", "status", "status_detail", "failure_signature"],
        "samples": ["run_id", "group_id", "settings_key", "commit_sha", "case_id", "failed_checks"]}, base)
    cells, samples = read["cells"], read["samples"]
    starts: dict[tuple[str, str, str, str], list[tuple[str, list[str] | None]]] = defaultdict(list)
    for row in samples.to_pylist():
        starts[(row["settings_key"], row["commit_sha"], row["run_id"], row["group_id"])].append(
            (row["case_id"], row["failed_checks"]))
    started: dict[tuple[str, str, str, str], tuple[str, str | None, str]] = {}
    for row in cells.to_pylist():
        key = (row["settings_key"], row["commit_sha"], row["run_id"], row["group_id"])
        started[key] = (row["status"], row["failure_signature"], row["status_detail"] or "")
    for key in sorted(started):
        status, signature, detail = started[key]
        ev = by_key[key[0]].evidence[key[1]]
        sets = fm.start_sets(status, signature, starts.get(key, []), labels)
        if sets:
            ev.starts.append(StartRecord((key[2], key[3]), sets, key[2] != this_run))
        else:
            ev.skip = f"{status}: {detail}"


class Bisector:
    """One bisect run: the targets, their searches, the probes, and their records on disk."""

    def __init__(self, *, matrix: Matrix, targets: list[Target], suite: Suite, repo: Path | None,
                 history: History, run: RunDir,
                 runs_dir: str | Path, commits: list[str], search_options: dict[str, Any], cache_dir: Path | None,
                 on_event: Callable[[str], None]) -> None:
        self.matrix, self.targets, self.suite, self.repo, self.run = matrix, targets, suite, repo, run
        self.history = history
        self.runs_dir, self.commits, self.options = runs_dir, commits, search_options
        self.cache_dir = cache_dir
        self.say = on_event
        self.labels = fm.check_labels(suite)
        self.case_checks = fm.case_checks(suite, self.labels)
        load_evidence(runs_dir, targets, suite, set(commits), self.labels, run.run_id)
        probes = analysis.load_table(run, "probes")
        self.probe_no = len(set(probes.column("group_id").to_pylist())) if probes.num_rows else 0
        self.round = int(pc.max(probes["round"]).as_py() or 0) if probes.num_rows else 0
        self.gpu_seconds = float(pc.sum(probes["gpu_seconds"]).as_py() or 0.0) if probes.num_rows else 0.0

    # ---- the searches -----------------------------------------------------------------

    def mode_names(self) -> dict[tuple[str, frozenset[str]], str]:
        """Failure signatures -> modes, from every sample seen so far (of every target: a mode is
        the same bug in every cell)."""
        seen: dict[tuple[str, frozenset[str]], set[str]] = defaultdict(set)
        for t in self.targets:
            for sha, ev in t.evidence.items():
                for st in ev.starts:
                    for case, labels in st.sets:
                        if labels:
                            seen[(case, labels)].add(sha)
        return fm.assign(seen, self.case_checks)

    def searches(self) -> list[Search]:
        """Each target's search rebuilt from its evidence: mode names depend on all samples seen."""
        merged = self.mode_names()
        out = []
        for t in self.targets:
            search = Search(self.commits, **self.options)
            for sha in self.commits:
                ev = t.evidence.get(sha)
                if ev is None:
                    continue
                for st in ev.starts:
                    search.record(sha, len(st.sets), fm.count_modes(st.sets, merged))
                if ev.skip is not None:
                    search.record_skip(sha, ev.skip)
            search.rounds = self.round
            out.append(search)
        return out

    def reused_samples(self) -> int:
        return sum(len(st.sets) for t in self.targets for ev in t.evidence.values() for st in ev.starts if st.reused)

    # ---- probing ----------------------------------------------------------------------

    def plan_round(self, searches: list[Search], slots: int) -> list[tuple[str, list[tuple[Target, int]]]]:
        """The round's server starts: (commit, [(target, samples)]) per server group, the most
        valuable first. Wants of several targets on one (commit, server key) share a start."""
        jobs: dict[tuple[str, str], list[tuple[Target, int]]] = defaultdict(list)
        value: dict[tuple[str, str], float] = defaultdict(float)
        for t, search in zip(self.targets, searches, strict=True):
            if search.done:
                continue
            for req, v in search.wants(slots):
                key = (req.commit, cell_at(self.matrix, t.cell, req.commit).server_key)
                jobs[key].append((t, req.samples))
                value[key] += v
        best = sorted(jobs, key=lambda k: (-value[k], self.commits.index(k[0]), k[1]))[:slots]
        return [(commit, jobs[(commit, skey)]) for commit, skey in best]

    def _requests_per_repeat(self) -> int:
        return max(1, sum(c.repeat for c in self.suite.cases))

    def probe(self, executor: Executor, plan: list[tuple[str, list[tuple[Target, int]]]]) -> None:
        """Run one round: one server start per planned group; store and remember the results."""
        self.round += 1
        jobs, served = [], {}
        for sha, wants in plan:
            cells = tuple(cell_at(self.matrix, t.cell, sha) for t, _ in wants)
            group = ServerGroup(cells[0].server_key, cells)
            self.probe_no += 1
            repeats = max(1, math.ceil(max(n for _, n in wants) / self._requests_per_repeat()))
            job = GroupJob(run_id=self.run.run_id, group=group, spec=portable_spec(self.matrix),
                           suite=self.suite, sha=sha, repo=repo_source(self.matrix.spec.install, self.repo),
                           cache_dir=str(Path(self.cache_dir).absolute()) if self.cache_dir else None,
                           cell_ids=tuple(c.cell_id for c in cells), repeats_override=repeats)
            jobs.append(job)
            served[group.group_id] = (self.probe_no, [t for t, _ in wants])
        for job, result in executor.run(jobs):
            probe_no, targets = served[job.group.group_id]
            self._store(job, result, probe_no, targets)

    def _store(self, job: GroupJob, result: GroupResult, probe_no: int, targets: list[Target]) -> None:
        sha = job.sha or job.group.head.commit
        name = f"p{probe_no:04d}-{sha[:10]}"
        # One probe is one server start: its rows carry the probe's name, so stored evidence keeps
        # repeated starts of one server key apart (per-start variation is learned from them).
        samples_t = _with_group(result.samples, name)
        cells_t = _with_group(result.cells, name)
        # Log, samples and cells first, the probe rows last: a probe row means its samples are on disk.
        if result.log:
            self.run.write_log(name, result.log_text())
        self.run.write_group(name, samples_t, cells_t)
        result = GroupResult(name, samples_t, cells_t, result.statuses)
        found = []
        for t in targets:
            cells = result.cells.filter(pc.equal(result.cells["settings_key"], t.settings_key))
            samples = result.samples.filter(pc.equal(result.samples["settings_key"], t.settings_key))
            status = ProbeStatus(cells.column("status")[0].as_py()) if cells.num_rows else ProbeStatus.MISSING
            signature = cells.column("failure_signature")[0].as_py() if cells.num_rows else None
            rows_in = list(zip(samples.column("case_id").to_pylist(), samples.column("failed_checks").to_pylist(),
                               strict=True))
            sets = fm.start_sets(status, signature, rows_in, self.labels) or []
            ev = t.evidence[sha]
            if sets:
                ev.starts.append(StartRecord((self.run.run_id, name), sets, False))
            else:
                ev.skip = f"{status}: {cells.column('status_detail')[0].as_py() if cells.num_rows else ''}"
            found.append((t, cells, status, sets))
        merged = self.mode_names()
        rows = []
        for t, cells, status, sets in found:
            gpu = float(pc.sum(cells["gpu_seconds"]).as_py() or 0.0) if cells.num_rows else 0.0
            self.gpu_seconds += gpu
            counts = fm.count_modes(sets, merged)
            rows.append({"run_id": self.run.run_id, "probe": probe_no, "round": self.round, "commit_sha": sha,
                         "position": self.commits.index(sha), "settings_key": t.settings_key,
                         "cell_id": cells.column("cell_id")[0].as_py() if cells.num_rows else None,
                         "status": status, "n_samples": len(sets), "n_failed": sum(counts.values()),
                         "mode_failures": list(counts.items()), "reused": False, "group_id": name,
                         "gpu_seconds": gpu})
            self.say(f"probe {probe_no} round {self.round}: {sha[:10]} (position {self.commits.index(sha)}) "
                     f"{t.label} -> {status}, {sum(counts.values())}/{len(sets)} failed")
        self.run.write_table(f"probes/{name}.parquet", table(rows, PROBE_SCHEMA))

    def drive(self, executor: Executor, slots: int) -> list[BisectReport]:
        """Rounds until no search wants a probe; the state after each round goes to bisect.json."""
        first = self.round
        while True:
            searches = self.searches()
            reports = [s.result() for s in searches]
            if self.round > first:
                self.save_state(reports, final=False)
            plan = self.plan_round(searches, slots)
            if not plan:
                return reports
            self.probe(executor, plan)

    def save_state(self, reports: list[BisectReport], *, final: bool) -> dict[str, Any]:
        summary = describe(reports, self.targets, self.history, self.commits)
        summary.update({"run_id": self.run.run_id, "final": final, "rounds": self.round, "server_starts": self.probe_no,
                        "reused_samples": self.reused_samples(), "gpu_seconds": self.gpu_seconds,
                        "sweeper": __version__, "updated": now_utc().isoformat()})
        self.run.write_json("bisect.json", summary)
        return summary


def _with_group(tbl: pa.Table, name: str) -> pa.Table:
    i = tbl.schema.get_field_index("group_id")
    return tbl.set_column(i, tbl.schema.field(i), pa.array([name] * tbl.num_rows, pa.string()))


def run_bisect(*, good: str, bad: str, matrix_path: Path | None = None, from_run: str | None = None,
               where: Sequence[str] = (), repo: str | None = None, parallel: int | None = None,
               confidence: float = 0.99, max_samples: int | None = None, runs_dir: str | Path = "runs",
               run_id: str | None = None, resume: str | None = None,
               executor: ExecutorFactory | None = None, cache_dir: Path | None = None, widen: bool = False,
               on_event: Callable[[str], None] = lambda _: None) -> BisectOutcome:
    """Bisect between good and bad. With `matrix_path`, the one cell `where` picks; without it, every
    cell of a sweep run (the latest, or `from_run`) that fails differently at bad than at good."""
    from sweeper.matrix import load_matrix

    if resume and matrix_path is None:
        # The cells of an interrupted bisect are in its manifest, whatever runs came since.
        old = open_run(runs_dir, resume, create=False).read_manifest()
        matrix = _with_repo(load_matrix(old.matrix_path or ""), repo)
        keys = set(old.settings_keys or ()) if isinstance(old, BisectManifest) else set()
        cells = list({c.settings_key: c for c in matrix.cells if c.settings_key in keys}.values())
    elif matrix_path is not None:
        matrix = _with_repo(load_matrix(matrix_path), repo)
        cells = [select_cell(matrix, where)]
    else:
        matrix, cells = cells_from_run(runs_dir, from_run, good, bad, where, repo, on_event)
    suite = load_suites(matrix.suite_paths)
    return bisect_cells(matrix=matrix, cells=cells, suite=suite, good=good, bad=bad, parallel=parallel,
                        confidence=confidence, max_samples=max_samples, runs_dir=runs_dir, run_id=run_id,
                        resume=resume, executor=executor, cache_dir=cache_dir, widen=widen,
                        on_event=on_event)


def _with_repo(matrix: Matrix, repo: str | None) -> Matrix:
    if not repo:
        return matrix
    return dataclasses.replace(matrix, spec=matrix.spec.model_copy(
        update={"install": matrix.spec.install.model_copy(update={"repo": repo})}))


def sweep_run(runs_dir: str | Path, run_id: str | None) -> RunDir:
    """The sweep run a bisect starts from: `run_id`, or the latest `sweep matrix` run."""
    if run_id is not None:
        run = open_run(runs_dir, run_id, create=False)
        if not isinstance(run.read_manifest(), SweepManifest):
            raise BisectError(f"run {run_id} is not a sweep run (`sweep matrix`); pass a sweep run's id to --run")
        return run
    sweeps = [r for r in analysis.run_dirs(runs_dir) if _kind(r) == "matrix"]
    if not sweeps:
        raise BisectError(f"no sweep run under {runs_dir}: run `sweep matrix MATRIX.yaml` first, "
                          "or pass --matrix MATRIX.yaml --where AXIS=VALUE")
    return sweeps[-1]


def _kind(run: RunDir) -> str | None:
    try:
        return run.read_manifest().kind
    except (OSError, ValueError, SweepError):
        return None


def cells_from_run(runs_dir: str | Path, from_run: str | None, good: str, bad: str, where: Sequence[str],
                   repo: str | None, on_event: Callable[[str], None]) -> tuple[Matrix, list[Cell]]:
    """The matrix of a sweep run and its cells worth bisecting: those where some failure mode is
    credibly more (a regression) or less (a fix) frequent at bad than at good, by Fisher's exact test
    at 1 %, Bonferroni-corrected over the modes tried; and cells the run did not measure at both
    endpoints but saw failing somewhere (the bisect measures their endpoints first)."""
    from scipy.stats import fisher_exact

    from sweeper.matrix import load_matrix, short_hash

    run = sweep_run(runs_dir, from_run)
    manifest = run.read_manifest()
    assert isinstance(manifest, SweepManifest)  # sweep_run picks sweep runs only
    path = Path(manifest.matrix_path or "")
    if not path.is_file():
        raise BisectError(f"run {run.run_id}: its matrix {path} is gone; pass --matrix FILE --where AXIS=VALUE")
    matrix = _with_repo(load_matrix(path), repo)
    if short_hash(matrix.raw, 16) != manifest.matrix_digest:
        raise BisectError(f"run {run.run_id}: {path} changed since the run; run `sweep matrix {path}` again, "
                          "or pass --matrix")
    suite = load_suites(matrix.suite_paths)
    if suite.digest != manifest.suite_digest:
        raise BisectError(f"run {run.run_id}: its suite changed since the run; run `sweep matrix {path}` again")
    history = history_for(matrix.spec.install, repo_for(matrix, runs_dir), good=good, bad=bad)
    good_sha, bad_sha = history.resolve(good), history.resolve(bad)
    candidates = {c.settings_key: c for c in (select_cells(matrix, where) if where else matrix.cells)}
    samples = analysis.load_table(run, "samples").select(["settings_key", "commit_sha", "group_id", "case_id",
                                                          "failed_checks"])
    cell_rows = analysis.load_table(run, "cells").select(["settings_key", "commit_sha", "group_id", "status",
                                                          "failure_signature"])
    labels = fm.check_labels(suite)
    per_start: dict[tuple[str, str, str], list[tuple[str, list[str] | None]]] = defaultdict(list)
    for r in samples.to_pylist():
        if r["settings_key"] in candidates:
            per_start[(r["settings_key"], r["commit_sha"], r["group_id"])].append((r["case_id"], r["failed_checks"]))
    rows: dict[str, dict[str, list[tuple[str, frozenset[str]]]]] = defaultdict(lambda: defaultdict(list))
    seen: dict[tuple[str, frozenset[str]], set[str]] = defaultdict(set)
    for r in cell_rows.to_pylist():
        start = (r["settings_key"], r["commit_sha"], r["group_id"])
        if r["settings_key"] not in candidates:
            continue
        for case, failed in fm.start_sets(r["status"], r["failure_signature"], per_start.get(start, []), labels) or []:
            rows[r["settings_key"]][r["commit_sha"]].append((case, failed))
            if failed:
                seen[(case, failed)].add(r["commit_sha"])
    modes = fm.assign(seen, fm.case_checks(suite, labels))
    chosen, checked, unclear = [], 0, 0
    for key, cell in candidates.items():
        by_commit = rows.get(key, {})
        at_good, at_bad = by_commit.get(good_sha, []), by_commit.get(bad_sha, [])
        if not at_good or not at_bad:
            if any(failed for commit_rows in by_commit.values() for _, failed in commit_rows):
                chosen.append(cell)
            continue
        checked += 1
        cg, cb = fm.count_modes(at_good, modes), fm.count_modes(at_bad, modes)
        tried = sorted(set(cg) | set(cb))
        for mode in tried:
            k_g, k_b = cg.get(mode, 0), cb.get(mode, 0)
            p = fisher_exact([[k_g, len(at_good) - k_g], [k_b, len(at_bad) - k_b]]).pvalue
            if p * len(tried) < 0.01:
                chosen.append(cell)
                break
        else:
            unclear += bool(tried)
    if not chosen:
        hint = (f"; {unclear} fail at either but not credibly differently (more repeats, or pick one with "
                "--matrix FILE --where AXIS=VALUE)") if unclear else ""
        raise BisectError(f"run {run.run_id}: no cell fails differently at {bad} than at {good} "
                          f"({checked} cell(s) measured at both{hint}); nothing to bisect")
    on_event(f"run {run.run_id}: {len(chosen)} of {len(candidates)} cell(s) change between {good} and {bad}")
    return matrix, sorted(chosen, key=lambda c: c.cell_id)


def bisect_cells(*, matrix: Matrix, cells: list[Cell], suite: Suite, good: str, bad: str, parallel: int | None,
                 confidence: float, max_samples: int | None, runs_dir: str | Path, run_id: str | None, resume: str | None,
                 executor: ExecutorFactory | None, cache_dir: Path | None, widen: bool,
                 on_event: Callable[[str], None]) -> BisectOutcome:
    repo_path = repo_for(matrix, runs_dir)
    history = history_for(matrix.spec.install, repo_path, good=good, bad=bad)
    good_sha, bad_sha = history.resolve(good), history.resolve(bad)
    commits = history.range(good_sha, bad_sha)
    keys = sorted(c.settings_key for c in cells)
    if resume:
        run = open_run(runs_dir, resume, create=False)
        old = run.read_manifest()
        if not isinstance(old, BisectManifest) or old.good_sha != good_sha or old.bad_sha != bad_sha \
                or old.settings_keys != tuple(keys):
            raise BisectError(f"run {resume} bisected another range or other cells; start a new bisect instead")
        commits = list(old.commits) if old.commits is not None else commits
    else:
        run = open_run(runs_dir, run_id or new_run_id(f"bisect-{matrix.name}"), create=True)
    options = {"confidence": confidence, "max_samples": max_samples}
    on_event(f"bisecting {len(commits) - 1} commits {good_sha[:10]}..{bad_sha[:10]} for {len(cells)} cell(s)")
    try:
        with (executor or choose())(matrix) as ex:
            ex.preflight(matrix.spec.gpus_per_cell)
            k = parallel or max(1, ex.free_slots(matrix.spec.gpus_per_cell))
            on_event(f"{k} server start{'' if k == 1 else 's'} per round")
            while True:
                run.write_manifest(BisectManifest(
                    run_id=run.run_id, matrix_path=str(matrix.path), matrix=matrix.raw, good=good, bad=bad,
                    good_sha=good_sha, bad_sha=bad_sha, commits=tuple(commits), settings_keys=tuple(keys),
                    cells=tuple({k: v for k, v in c.values.items() if k != "commit"} for c in cells),
                    suite_digest=suite.digest, repo=history.where))
                b = Bisector(matrix=matrix, targets=[Target(c) for c in cells], suite=suite, repo=repo_path,
                             history=history, run=run,
                             runs_dir=runs_dir, commits=commits, search_options=options, cache_dir=cache_dir,
                             on_event=on_event)
                if b.reused_samples():
                    on_event(f"reusing {b.reused_samples()} stored samples")
                reports = b.drive(ex, k)
                older = _widen_to(reports, history, commits, bad_sha) if widen else None
                if older is None:
                    break
                on_event(f"a mode fails at {commits[0][:10]} with no change in range; widening to {older[:10]}")
                commits = history.range(older, bad_sha)
    except KeyboardInterrupt:
        raise Interrupted(run.uri, run.run_id) from None
    summary = b.save_state(reports, final=True)
    return BisectOutcome(run, reports, b.targets, summary)


def _widen_to(reports: list[BisectReport], history: History, commits: list[str], bad_sha: str) -> str | None:
    """An older good endpoint when a mode failing at bad started before the range, else None."""
    older_needed = any(m.fails_at_bad and m.fails_at_good and m.started is None for r in reports for m in r.modes)
    if not older_needed:
        return None
    older = history.older(bad_sha, 2 * (len(commits) - 1))
    return None if older is None or older == commits[0] else older
