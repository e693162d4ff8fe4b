"""`sweep bisect`: ask the pure searches (`sweeper.bisect.search`) what to probe, run the probes
through an executor, and hand what comes back to the store.

A bisect has one or more targets: cells of a matrix (all settings but the commit), each with its
own search over the same first-parent range. A round asks every open search what it wants, merges
the wants by (commit, server key) so that cells sharing a server share its start, and runs the K
most valuable server groups at once (K = GPU slots). One probe = one server start replaying the
requests of every cell it serves; each cell's samples are split into failure modes
(`sweeper.judge.modes`) and told to that cell's search.

An install failure, a hang, or a server that won't start for a reason naming none of the cell's
settings (a port in use, a full disk) makes the commit untestable for that cell (skipped). A server
that crashes while serving the cell's requests is the cell failing: its samples count, and the
unanswered ones form the crash's own mode, named by its signature (exception type + innermost vLLM
frame); a start refused with a reason that names the cell's settings is one failing sample of the
mode `refused: <reason>` (see `sweeper.vllm.crash`). Samples already stored for the same commit +
cell settings + suite digest, in any run under `runs/`, are used before anything runs
(`sweeper.drivers.bisect_evidence`), which is also how `--resume` spends no probe twice: the searches are
rebuilt from what is on disk, in the same order every time. Which cells to bisect after a sweep is
`sweeper.bisect.select`'s answer on the sweep's counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sweeper.bisect.search import BisectReport, Observation, Search, SearchOptions
from sweeper.bisect.segments import Prior
from sweeper.bisect.select import ends, screen, select_cell, select_cells
from sweeper.drivers.bisect_evidence import (
    CELL_COLUMNS,
    SAMPLE_COLUMNS,
    ServerStart,
    Sets,
    Target,
    load_evidence,
    run_starts,
    server_starts,
)
from sweeper.drivers.probes_on_disk import as_probe, budget_record, probes_on_disk
from sweeper.errors import BisectError, ConfigError, Interrupted, SweepError
from sweeper.execute.choice import choose
from sweeper.execute.executor import Executor, ExecutorFactory
from sweeper.execute.runner import GroupJob, GroupResult
from sweeper.install.history import History, history_for
from sweeper.install.portable import portable_spec, repo_source
from sweeper.install.registry import stated_profile
from sweeper.install.repository import repo_for
from sweeper.judge import modes as fm
from sweeper.plan import cost
from sweeper.plan.budget import Ledger
from sweeper.reports.bisect import ReportCell, describe, named_commits
from sweeper.reports.bisect_progress import beliefs, round_line
from sweeper.spec.matrix import Cell, Matrix, ServerGroup, make_cell
from sweeper.spec.status import ProbeStatus
from sweeper.spec.suite import Suite, load_suites
from sweeper.store import frames as analysis
from sweeper.store.manifest import SWEEPER_VERSION as __version__
from sweeper.store.manifest import BisectManifest, SweepManifest
from sweeper.store.run_folder import (
    PROBE_SCHEMA,
    RunDir,
    new_run_id,
    now_utc,
    open_run,
    table,
)

# A probe's group name: its number, then the commit (see Bisector._store).


@dataclass(frozen=True)
class BisectScope:
    """What to bisect: the range from `good` to `bad`, and the cells. With `matrix_path`, the one
    cell `where` picks; without it, every cell of a sweep run (`from_run`, or the latest) that fails
    differently at bad than at good. `repo` stands in for the matrix's install.repo."""

    good: str
    bad: str
    matrix_path: Path | None = None
    from_run: str | None = None
    where: Sequence[str] = ()
    repo: str | None = None


@dataclass(frozen=True)
class BisectOptions:
    """How a bisect searches and runs, and which run records it."""

    confidence: float = 0.99  # a change is settled when its posterior probability reaches this
    max_samples: int | None = None  # requests per cell before the search stops
    parallel: int | None = None  # server starts per round; None: the GPU slots of the whole cluster
    widen: bool = False  # move good back while a mode failing at bad started before the range
    cache_dir: Path | None = None  # per-commit environments
    runs_dir: str | Path = "runs"
    run_id: str | None = None  # the name of a new bisect run
    resume: str | None = None  # the bisect run to continue
    # GPU-hours for the whole run (what earlier invocations of a resumed run spent counts): a round
    # is started only as far as the cost model prices it within what is left.
    budget_h: float | None = None
    # Also look for a regression fixed again inside the range at least this many commits wide
    # (`SearchOptions.bump_width`): a probe in every run of that many commits, whatever the ends show.
    bump_width: int | None = None
    # Without a scan asked for, scan every 3 commits before reporting that nothing changed
    # (`SearchOptions.quiet_scan`); False (`--bumps 0`): never scan.
    quiet_scan: bool = True
    # The changes per range the search's prior expects (`Prior.expected_changes`): above 1 for a range
    # likely to hold several (a release range, a mode seen to change back and forth), where a second
    # or third change is searched for sooner, at more GPU time per bisect (BENCHMARKS.md).
    expected_changes: float = 1.0

    @property
    def search(self) -> SearchOptions:
        quiet = SearchOptions.quiet_scan if self.quiet_scan else None
        return SearchOptions(confidence=self.confidence, max_samples=self.max_samples, bump_width=self.bump_width,
                             quiet_scan=quiet, prior=Prior.default(expected_changes=self.expected_changes))


def search_choices(bumps: int | None, expect_changes: float) -> dict[str, Any]:
    """`--bumps` and `--expect-changes`, checked, as `BisectOptions`' fields (`sweep bisect` and
    `sweep triage` take both): one line naming the flag when a value is out of range."""
    if bumps is not None and bumps < 0:
        raise ConfigError(f"expected a number of commits >= 1, or 0 for no scan, got {bumps}", key="--bumps")
    if not (0 < expect_changes < math.inf):
        raise ConfigError(f"expected a number of changes per range above 0, got {expect_changes:g}",
                          key="--expect-changes")
    return {"bump_width": bumps or None, "quiet_scan": bumps != 0, "expected_changes": expect_changes}


@dataclass(frozen=True)
class Subject:
    """What a bisect works on: cells of a matrix (their settings; the commit is what varies) and the
    suite they replay."""

    matrix: Matrix
    cells: list[Cell]
    suite: Suite
    from_run: str | None = None  # the sweep run the cells were chosen from


@dataclass(frozen=True)
class Range:
    """The commits one pass of a bisect searches, oldest first (`--widen` makes another pass over a
    longer range), their history, and the repository installs come from (None: releases)."""

    history: History
    repo: Path | None
    commits: list[str]


@dataclass
class BisectOutcome:
    run: RunDir
    reports: list[BisectReport]
    targets: list[Target]
    summary: dict[str, Any]


def cell_at(matrix: Matrix, cell: Cell, sha: str) -> Cell:
    order = [n for n, _ in matrix.axes]
    return make_cell(matrix.spec, {**cell.values, "commit": sha}, order)


class Bisector:
    """One pass of a bisect run over a range: the targets, their searches, the probes, and their
    records on disk."""

    def __init__(self, subject: Subject, span: Range, run: RunDir, options: BisectOptions,
                 on_event: Callable[[str], None]) -> None:
        self.matrix, self.suite, self.span, self.run, self.options = subject.matrix, subject.suite, span, run, options
        self.from_run = subject.from_run
        self.targets = [Target(c) for c in subject.cells]
        self.commits = span.commits
        self.say = on_event
        self.labels = fm.check_labels(self.suite)
        self.case_checks = fm.case_checks(self.suite, self.labels)
        load_evidence(options.runs_dir, self.targets, self.suite, set(self.commits), self.labels, run.run_id)
        done = probes_on_disk(run)
        self.probe_no, self.starts, self.round = done.last_number, done.starts, done.rounds
        # The budget of the whole run: what earlier invocations of a resumed run spent counts.
        self.ledger = Ledger.of_hours(options.budget_h, spent_s=done.gpu_seconds)
        self.installed = set(done.installed)
        self.profile = cost.profile_for(self.matrix.spec, stated_profile(self.matrix.spec))

    # ---- the searches -----------------------------------------------------------------

    def mode_names(self) -> dict[tuple[str, frozenset[str]], str]:
        """Failure signatures -> modes, from every sample seen so far (of every target: a mode is
        the same bug in every cell)."""
        return fm.name_modes(((sha, st.sets) for t in self.targets for sha, ev in t.evidence.items()
                              for st in ev.starts), self.case_checks)

    def searches(self) -> list[Search]:
        """Each target's search rebuilt from its evidence, as of this round: mode names depend on
        all samples seen. A round's searches live for that round: what one was asked and not told
        (a want no server start of the round served) goes with it."""
        merged = self.mode_names()
        # The searches price a start and a request as the budget does (the install kind's profile,
        # under the matrix's `cost:`): how many samples a start gets before another start is cheaper
        # where starts vary, and what deciding or a scan would cost, are the install's, not a default's.
        g = self.matrix.spec.gpus_per_cell
        options = dataclasses.replace(self.options.search, start_s=self.profile.start_s * g,
                                      request_s=self.profile.request_s * g)
        return [Search(self.commits, options, observations=self._observations(t, merged),
                       rounds=self.round) for t in self.targets]

    def _observations(self, target: Target, modes: dict[tuple[str, frozenset[str]], str]) -> list[Observation]:
        """What is known of a target, commit by commit: its server starts counted by mode, then
        whether the commit proved untestable for it."""
        out = []
        for sha in self.commits:
            ev = target.evidence.get(sha)
            if ev is None:
                continue
            out += [Observation(sha, len(st.sets), fm.count_modes(st.sets, modes)) for st in ev.starts]
            if ev.skip is not None:
                out.append(Observation(sha, skip_reason=ev.skip))
        return out

    def reused_samples(self) -> int:
        return sum(len(st.sets) for t in self.targets for ev in t.evidence.values() for st in ev.starts if st.reused)

    def reused_starts(self) -> list[dict[str, str]]:
        """The stored server starts used before any probe: (run, group, commit), each once however
        many of the targets it served."""
        seen = {(st.key[0], st.key[1], sha) for t in self.targets for sha, ev in t.evidence.items()
                for st in ev.starts if st.reused}
        return [{"run_id": r, "group_id": g, "commit": sha} for r, g, sha in sorted(seen)]

    # ---- probing ----------------------------------------------------------------------

    def plan_round(self, searches: list[Search], slots: int) -> list[tuple[str, list[tuple[Target, int]]]]:
        """The round's server starts: (commit, [(target, samples)]) per server group, the most
        valuable first. Wants of several targets on one (commit, server key) share a start."""
        jobs: dict[tuple[str, str], list[tuple[Target, int]]] = defaultdict(list)
        value: dict[tuple[str, str], float] = defaultdict(float)
        for t, search in zip(self.targets, searches, strict=True):
            if search.done:
                continue
            for req in search.ask(slots):
                key = (req.commit, cell_at(self.matrix, t.cell, req.commit).server_key)
                jobs[key].append((t, req.samples))
                value[key] += req.value
        best = sorted(jobs, key=lambda k: (-value[k], self.commits.index(k[0]), k[1]))[:slots]
        return [(commit, jobs[(commit, skey)]) for commit, skey in best]

    def round_cost(self, plan: list[tuple[str, list[tuple[Target, int]]]]) -> list[float]:
        """Modelled GPU-seconds of each of a round's server starts under the matrix's cost profile:
        the start, its cells' requests, and the install of a commit this run has not installed yet."""
        spec = self.matrix.spec
        installs = spec.install.kind != "preinstalled"
        seen = set(self.installed)
        out = []
        for sha, wants in plan:
            requests = len(wants) * self._repeats(wants) * self._requests_per_repeat()
            out.append(cost.Estimate(installs=int(installs and sha not in seen), starts=1, requests=requests,
                                     gpus_per_cell=spec.gpus_per_cell, profile=self.profile).gpu_seconds)
            seen.add(sha)
        return out

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds the run's probes took, this invocation's and earlier ones'."""
        return self.ledger.spent_s

    def afford(self, plan: list[tuple[str, list[tuple[Target, int]]]]) -> list[tuple[str, list[tuple[Target, int]]]]:
        """The longest prefix of `plan` (most valuable first) the budget still covers; none when the
        budget is spent (the ledger is then exhausted)."""
        costs = self.round_cost(plan)
        return list(self.ledger.afford(plan, lambda prefix: sum(costs[:len(prefix)])))

    def _repeats(self, wants: list[tuple[Target, int]]) -> int:
        return max(1, math.ceil(max(n for _, n in wants) / self._requests_per_repeat()))

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
            repeats = self._repeats(wants)
            cache_dir = self.options.cache_dir
            job = GroupJob(run_id=self.run.run_id, group=group, spec=portable_spec(self.matrix),
                           suite=self.suite, sha=sha, repo=repo_source(self.matrix.spec.install, self.span.repo),
                           cache_dir=str(Path(cache_dir).absolute()) if cache_dir else None,
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
        samples_t = as_probe(result.samples, name)
        cells_t = as_probe(result.cells, name)
        # Log, samples and cells first, the probe rows last: a probe row means its samples are on disk.
        if result.log:
            self.run.write_log(name, result.log_text())
        self.run.write_group(name, samples_t, cells_t)
        self.starts += 1
        self.installed.add(sha)
        starts = {st.settings_key: st for st in server_starts(cells_t.select(CELL_COLUMNS).to_pylist(),
                                                              samples_t.select(SAMPLE_COLUMNS).to_pylist(), self.labels)}
        found: list[tuple[Target, pa.Table, ProbeStatus, Sets]] = []
        for t in targets:
            cells = cells_t.filter(pc.equal(cells_t["settings_key"], t.settings_key))
            # The probe's group returned no row for the cell: the commit is untestable for it.
            start = starts.get(t.settings_key) or ServerStart(t.settings_key, sha, self.run.run_id, name,
                                                              ProbeStatus.MISSING, "", [])
            t.add(start, reused=False)
            found.append((t, cells, ProbeStatus(start.status), start.sets))
        merged = self.mode_names()
        rows = []
        for t, cells, status, sets in found:
            gpu = float(pc.sum(cells["gpu_seconds"]).as_py() or 0.0) if cells.num_rows else 0.0
            self.ledger.charge(gpu)
            counts = fm.count_modes(sets, merged)
            rows.append({"run_id": self.run.run_id, "probe": probe_no, "round": self.round, "commit_sha": sha,
                         "position": self.commits.index(sha), "settings_key": t.settings_key,
                         "cell_id": cells.column("cell_id")[0].as_py() if cells.num_rows else None,
                         "status": status, "n_samples": len(sets), "n_failed": sum(counts.values()),
                         "mode_failures": list(counts.items()), "reused": False, "group_id": name,
                         "gpu_seconds": gpu})
        self.run.write_table(f"probes/{name}.parquet", table(rows, PROBE_SCHEMA))

    def drive(self, executor: Executor, slots: int) -> list[BisectReport]:
        """Rounds until no search wants a probe; the state after each round goes to bisect.json."""
        first = self.round
        plan: list[tuple[str, list[tuple[Target, int]]]] = []
        reused = len(self.reused_starts())
        while True:
            searches = self.searches()
            reports = [s.result() for s in searches]
            if self.round > first:
                self.save_state(reports, final=False)
                self.say(round_line(self.round, [self.commits.index(sha) for sha, _ in plan], len(self.commits) - 1,
                                    starts=self.starts, reused_starts=reused, gpu_seconds=self.gpu_seconds,
                                    found=beliefs(reports, self.commits)))
            plan = self.afford(self.plan_round(searches, slots))
            if not plan:
                if self.ledger.exhausted and self.round > first:
                    self.say(f"budget spent: {self.gpu_seconds / 3600:.2f} of {self.options.budget_h:g} GPU-h; "
                             "the next probe is priced past what is left")
                return reports
            self.probe(executor, plan)

    def save_state(self, reports: list[BisectReport], *, final: bool) -> dict[str, Any]:
        cells = [ReportCell(t.settings, t.label, t.settings_key) for t in self.targets]
        summary = describe(reports, cells, self.commits,
                           {sha: self.span.history.info(sha) for sha in named_commits(reports)})
        summary.update({"run_id": self.run.run_id, "final": final, "rounds": self.round, "server_starts": self.starts,
                        "reused_samples": self.reused_samples(), "reused_starts": self.reused_starts(),
                        "issue_run": self.from_run or self.run.run_id, "gpu_seconds": self.gpu_seconds,
                        "sweeper": __version__, "updated": now_utc().isoformat()})
        if (budget := budget_record(self.options.budget_h, self.ledger)) is not None:
            summary["budget"] = budget
        self.run.write_json("bisect.json", summary)
        return summary


def run_bisect(scope: BisectScope, options: BisectOptions | None = None, *,
               executor: ExecutorFactory | None = None,
               on_event: Callable[[str], None] = lambda _: None) -> BisectOutcome:
    """Bisect the cells `scope` names between its good and bad; `executor` runs the probes (default:
    Ray, a local cluster or RAY_ADDRESS's)."""
    from sweeper.install.matrix_loader import load_matrix

    options = options or BisectOptions()
    runs_dir, resume, repo = options.runs_dir, options.resume, scope.repo
    if resume and scope.matrix_path is None:
        # The cells of an interrupted bisect are in its manifest, whatever runs came since.
        old = open_run(runs_dir, resume, create=False).read_manifest()
        matrix = _with_repo(load_matrix(old.matrix_path or ""), repo)
        keys = set(old.settings_keys or ()) if isinstance(old, BisectManifest) else set()
        cells = list({c.settings_key: c for c in matrix.cells if c.settings_key in keys}.values())
    elif scope.matrix_path is not None:
        matrix = _with_repo(load_matrix(scope.matrix_path), repo)
        cells = [select_cell(matrix, scope.where)]
    else:
        return bisect_cells(cells_from_run(scope, runs_dir, on_event), scope, options, executor=executor,
                            on_event=on_event)
    return bisect_cells(Subject(matrix, cells, load_suites(matrix.suite_paths)), scope, options, executor=executor,
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


def cells_from_run(scope: BisectScope, runs_dir: str | Path, on_event: Callable[[str], None]) -> Subject:
    """The matrix of a sweep run and its cells worth bisecting (`sweeper.bisect.select.screen` on
    the run's counts at good and at bad)."""
    from sweeper.install.matrix_loader import load_matrix
    from sweeper.spec.matrix import short_hash

    good, bad, where, repo = scope.good, scope.bad, scope.where, scope.repo
    run = sweep_run(runs_dir, scope.from_run)
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
    labels = fm.check_labels(suite)
    starts = run_starts(run, set(candidates), labels)
    by_cell: dict[str, dict[str, Sets]] = defaultdict(lambda: defaultdict(list))
    for st in starts:
        by_cell[st.settings_key][st.commit_sha] += st.sets
    modes = fm.name_modes(((st.commit_sha, st.sets) for st in starts), fm.case_checks(suite, labels))
    found = screen({key: ends(by_cell.get(key, {}), good_sha, bad_sha, modes) for key in candidates})
    if not found.chosen:
        hint = (f"; {found.unclear} fail at either but not credibly differently (more repeats, or pick one with "
                "--matrix FILE --where AXIS=VALUE)") if found.unclear else ""
        raise BisectError(f"run {run.run_id}: no cell fails differently at {bad} than at {good} "
                          f"({found.checked} cell(s) measured at both{hint}); nothing to bisect")
    on_event(f"run {run.run_id}: {len(found.chosen)} of {len(candidates)} cell(s) change between {good} and {bad}")
    return Subject(matrix, sorted((candidates[k] for k in found.chosen), key=lambda c: c.cell_id), suite,
                   from_run=run.run_id)


def bisect_cells(subject: Subject, scope: BisectScope, options: BisectOptions, *,
                 executor: ExecutorFactory | None, on_event: Callable[[str], None]) -> BisectOutcome:
    """Bisect these cells over the range from `scope.good` to `scope.bad` (the cells `scope` names
    were chosen already)."""
    matrix, cells, suite = subject.matrix, subject.cells, subject.suite
    good, bad, runs_dir, resume = scope.good, scope.bad, options.runs_dir, options.resume
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
        run = open_run(runs_dir, options.run_id or new_run_id(f"bisect-{matrix.name}"), create=True)
    on_event(f"bisecting {len(commits) - 1} commits {good_sha[:10]}..{bad_sha[:10]} for {len(cells)} cell(s)")
    try:
        with (executor or choose())(matrix) as ex:
            ex.preflight(matrix.spec.gpus_per_cell)
            k = options.parallel or max(1, ex.slots(matrix.spec.gpus_per_cell))
            on_event(f"{k} server start{'' if k == 1 else 's'} per round")
            while True:
                run.write_manifest(BisectManifest(
                    run_id=run.run_id, matrix_path=str(matrix.path), matrix=matrix.raw, good=good, bad=bad,
                    good_sha=good_sha, bad_sha=bad_sha, commits=tuple(commits), settings_keys=tuple(keys),
                    cells=tuple({k: v for k, v in c.values.items() if k != "commit"} for c in cells),
                    suite_digest=suite.digest, repo=history.where))
                b = Bisector(subject, Range(history, repo_path, commits), run, options, on_event)
                if b.reused_samples():
                    runs = sorted({st["run_id"] for st in b.reused_starts()})
                    on_event(f"reusing {b.reused_samples()} stored samples of {len(b.reused_starts())} server "
                             f"start(s) (run {', '.join(runs)}) before any probe")
                reports = b.drive(ex, k)
                older = _widen_to(reports, history, commits, bad_sha) if options.widen else None
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
