"""`sweep bisect --metric NAME`: which commit moved a serving metric (TPOT, throughput, acceptance
length) by more than `--min-effect`, and how sure. The pure search is `sweeper.bisect.metric_search`
(ask/tell per cell); this driver runs what it asks for through an executor and stores it.

A probe is ONE server start at one commit with the cell's settings that runs the bench only: the matrix
is copied with `bench.after = "instead"`, `bench.starts = 1` and the load cut down to the chosen load
point, so a start is the unit the search models. Several starts at one commit are several group jobs.
A start's valid metrics row is told to the search (`tell(commit, row[metric], row[se column] or 0)`); an
invalid row is no evidence (the round's line says why), and `MAX_INVALID` invalid starts at one commit make
it untestable; a start that does not install, or whose server does not come up, makes its commit untestable
for the cell (`tell_skip`).

Evidence: the metrics rows any other run under `runs/` stored for the same cell settings, commit, load
point and bench settings (a sweep's starts at good and bad, an earlier metric bisect's probes) are told
before the first ask. `--resume RUN` tells the run's own probes again, in probe order: nothing runs twice.
Each probe is stored as the failure bisect stores its probes: the group's files under the run folder
named `p<NNNN>-<sha>` (samples, cells, metrics, log), then its probe row. The state after each round, and
the verdict, go to `bisect.json` (schema `sweep-metric-bisect/1`, `sweeper.reports.metric_bisect`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sweeper.bisect.metric_search import MetricObservation, MetricReport, MetricSearch, MetricSearchOptions
from sweeper.bisect.select import select_cell, select_cells
from sweeper.drivers.probes_on_disk import PROBE_NAME, as_probe, budget_record, probes_on_disk
from sweeper.errors import BisectError, ConfigError, Interrupted, SweepError
from sweeper.execute.choice import choose
from sweeper.execute.executor import Executor, ExecutorFactory
from sweeper.execute.runner import GroupJob, GroupResult
from sweeper.install.history import History, history_for
from sweeper.install.portable import portable_spec, repo_source
from sweeper.install.registry import stated_profile
from sweeper.install.repository import repo_for
from sweeper.judge import serving
from sweeper.judge.metric_names import METRICS, SPEC_DECODE, MetricName
from sweeper.plan import cost
from sweeper.plan.budget import Ledger
from sweeper.reports.metric_bisect import (
    CellReport,
    Question,
    best_so_far,
    describe,
    is_metric_bisect,
    round_line,
)
from sweeper.spec.bench import INF, BenchSpec, Load, LoadPoint
from sweeper.spec.matrix import Cell, Matrix, MatrixFile, ServerGroup, canonical, make_cell
from sweeper.spec.status import Status
from sweeper.spec.suite import Suite, load_suites
from sweeper.store import frames as analysis
from sweeper.store.manifest import SWEEPER_VERSION, BisectManifest, SweepManifest
from sweeper.store.metrics_table import METRICS_SCHEMA
from sweeper.store.run_folder import PROBE_SCHEMA, RunDir, new_run_id, now_utc, open_run, table

# A probe's group name: its number, then the commit (as the failure bisect names its probes).
# Starts at one commit that gave no valid figures before the commit counts as untestable for the cell:
# a server that keeps stalling or crashing in its load phase there would otherwise be asked for forever.
MAX_INVALID = 3
# Starts whose engine died with the same failure signature (vLLM's own root cause, such as "TypeError in
# vllm/...") before the commit counts as untestable: a crash repeated with one cause is the release, not
# the machine; a one-off crash (a killed process, an OOM) still gets MAX_INVALID tries.
MAX_SAME_CRASH = 2
# The bench settings two stored rows must share to be starts of the same measurement.
BENCH_COLUMNS = ("dataset", "endpoint", "input_len", "output_len", "num_prompts", "num_warmups", "seed",
                 "temperature")


@dataclass(frozen=True)
class MetricBisectOptions:
    """What a metric bisect asks (`metric`, `load_point`, `min_effect`), how it runs, and which run
    records it. `min_effect` is relative: 0.03 is 3 %."""

    metric: str | None = None  # None only to resume a metric bisect: its stored question is taken
    load_point: str | None = None  # a `LoadPoint.point_id`; required when the bench has several
    min_effect: float | None = None  # default 3 %, or the resumed run's
    confidence: float = 0.99
    parallel: int | None = None  # starts per round; None: the cluster's GPU slots
    budget_h: float | None = None  # GPU-hours for the whole run, earlier invocations' spending counted
    expected_changes: float = 1.0
    max_rounds: int | None = None  # rounds for the whole run (a library knob: stop early, resume later)
    cache_dir: Path | None = None
    runs_dir: str | Path = "runs"
    run_id: str | None = None
    resume: str | None = None


@dataclass
class MetricBisectOutcome:
    run: RunDir
    reports: list[MetricReport]
    summary: dict[str, Any]


def parse_min_effect(text: str) -> float:
    """`--min-effect 3%` as a fraction (0.03); one line naming what was expected otherwise."""
    raw = text.strip()
    value = math.nan
    if raw.endswith("%"):
        try:
            value = float(raw[:-1].strip())
        except ValueError:
            value = math.nan
    if not (0 < value < 100):
        raise ConfigError(f"expected a positive percentage below 100 such as 3%, got {text!r}", key="--min-effect")
    return value / 100.0


def metric_of(name: str, flag: str = "--metric") -> MetricName:
    """A figure the bench measures and a bisect may follow (`METRICS`), or one line naming them."""
    found = METRICS.get(name)
    if found is None:
        raise ConfigError(f"unknown metric {name!r}; expected one of: {', '.join(METRICS)}", key=flag)
    return found


def load_point_of(matrix: Matrix, wanted: str | None) -> LoadPoint:
    """The bench's load point `wanted` names (its only one when None), or one line naming the choices."""
    bench = matrix.spec.bench
    if bench is None:
        raise ConfigError(f"{matrix.path} has no bench: section, so no metric is measured; --metric needs a "
                          "matrix whose bench: measures it", key="--metric")
    points = bench.points()
    ids = [p.point_id for p in points]
    if wanted is None:
        if len(points) > 1:
            raise ConfigError(f"the bench has {len(points)} load points; pick one with --load-point "
                              f"({', '.join(ids)})", key="--load-point")
        return points[0]
    for p in points:
        if p.point_id == wanted.strip():
            return p
    raise ConfigError(f"the bench has no load point {wanted!r}; expected one of: {', '.join(ids)}",
                      key="--load-point")


def check_cells(metric: MetricName, cells: Sequence[Cell]) -> None:
    """A speculative-decoding figure exists only in cells that speculate."""
    if metric.name in SPEC_DECODE:
        plain = [c for c in cells if c.spec_method == "none"]
        if plain:
            raise ConfigError(f"{metric.name} is measured only with speculative decoding; the cell "
                              f"{_label(plain[0])} has none", key="--metric")


def probe_spec(matrix: Matrix, point: LoadPoint) -> MatrixFile:
    """The settings a probe's worker gets: the matrix's, its bench run instead of the replay, on one
    server start, at the one load point."""
    spec = portable_spec(matrix)
    bench = spec.bench
    assert bench is not None  # load_point_of refused a matrix without one
    # Lists, as a matrix writes them (the model takes one value or a list).
    load = Load.model_validate({
        "concurrency": [point.concurrency] if point.concurrency is not None else [],
        "request_rate": [point.request_rate] if point.request_rate != INF or point.concurrency is None else []})
    return spec.model_copy(update={"bench": bench.model_copy(update={"after": "instead", "starts": 1, "load": load})})


def _label(cell: Cell) -> str:
    settings = {k: v for k, v in cell.values.items() if k != "commit"}
    return " ".join(f"{k}={v if isinstance(v, str) else canonical(v)}" for k, v in settings.items()) \
        or "(the only cell)"


# ---- what is known of a cell -------------------------------------------------------------------

@dataclass(frozen=True)
class StartRow:
    """One server start of one cell at one commit, as far as the metric goes: its value and SE, or why it
    is no evidence (`invalid`), or why its commit cannot be started (`skip`)."""

    key: tuple[str, str, int]  # (run_id, group_id, start): sorts the same on every rebuild
    commit: str
    value: float = math.nan
    se: float = 0.0
    invalid: str | None = None
    skip: str | None = None
    reused: bool = False
    crash: str | None = None  # the failure signature of an engine that died in this start


@dataclass
class MetricTarget:
    """One bisected cell and every start known of it."""

    cell: Cell
    rows: list[StartRow] = field(default_factory=list)

    @property
    def settings_key(self) -> str:
        return self.cell.settings_key

    def observations(self, metric: str) -> list[MetricObservation]:
        """What the search is told, in a fixed order: every valid start (stored ones first, then the
        probes in order), then the commits that proved untestable."""
        rows = sorted(self.rows, key=lambda r: (not r.reused, r.key))
        out = [MetricObservation(r.commit, r.value, r.se) for r in rows if r.invalid is None and r.skip is None]
        invalid = Counter(r.commit for r in rows if r.invalid is not None)
        crashes = Counter((r.commit, r.crash) for r in rows if r.invalid is not None and r.crash)
        skips: dict[str, str] = {}
        for r in rows:
            if r.skip is not None:
                skips.setdefault(r.commit, r.skip)
        for (sha, signature), n in crashes.items():
            if n >= MAX_SAME_CRASH and sha not in skips:
                skips[sha] = f"the engine crashed in {n} starts ({signature})"
        for sha, n in invalid.items():
            if n >= MAX_INVALID and sha not in skips:
                last = next(r.invalid for r in reversed(rows) if r.commit == sha and r.invalid)
                skips[sha] = f"{n} starts gave no valid {metric}: {last}"
        out += [MetricObservation(sha, skip_reason=why) for sha, why in skips.items()]
        return out


def row_value(row: dict[str, Any], metric: MetricName) -> tuple[float, float, str | None]:
    """A metrics row's (value, SE, why it is no evidence)."""
    if not row.get("valid"):
        return math.nan, 0.0, str(row.get("invalid_reason") or "marked invalid")
    value = row.get(metric.name)
    if value is None or not math.isfinite(value) or value <= 0:
        return math.nan, 0.0, f"{metric.name} is {value}"
    se = row.get(metric.se) if metric.se else None
    return float(value), float(se) if se is not None and math.isfinite(se) and se >= 0 else 0.0, None


def _same_bench(row: dict[str, Any], probe: dict[str, Any]) -> bool:
    return all(row.get(c) == probe.get(c) for c in BENCH_COLUMNS)


def stored_rows(runs_dir: str | Path, targets: Sequence[MetricTarget], commits: set[str], *, point: LoadPoint,
                bench: BenchSpec, metric: MetricName, this_run: str) -> list[tuple[MetricTarget, StartRow]]:
    """The matching metrics rows every other run stored: same settings, a commit of the range, the same
    load point and bench settings. Invalid ones are left out: another run's bad start is no evidence."""
    by_key = {t.settings_key: t for t in targets}
    want = {"dataset": bench.dataset_name, "endpoint": bench.effective_endpoint,
            "input_len": bench.effective_input_len, "output_len": bench.effective_output_len,
            "num_prompts": bench.num_prompts, "num_warmups": bench.num_warmups, "seed": bench.seed,
            "temperature": bench.temperature}
    flt = (pc.field("settings_key").isin(pa.array(sorted(by_key))) & pc.field("commit_sha").isin(pa.array(sorted(commits)))
           & (pc.field("load_point") == point.point_id))
    out = []
    for run in analysis.run_dirs(runs_dir):
        if run.run_id == this_run:
            continue
        for path in run.files("metrics"):
            rows = pq.read_table(path, filesystem=run.fs, schema=METRICS_SCHEMA, filters=flt).to_pylist()
            for r in rows:
                value, se, why = row_value(r, metric)
                if why is None and _same_bench(r, want):
                    out.append((by_key[r["settings_key"]],
                                StartRow((r["run_id"] or run.run_id, r["group_id"], int(r["start"] or 0)),
                                         r["commit_sha"], value, se, reused=True)))
    return out


def own_rows(run: RunDir, targets: Sequence[MetricTarget], point: LoadPoint,
             metric: MetricName) -> list[tuple[MetricTarget, StartRow]]:
    """The starts this run's probes stored (a resumed run): each probe's metrics row for its cell, or its
    cells row's status when it never benched."""
    by_key = {t.settings_key: t for t in targets}
    cells = analysis.load_table(run, "cells", ["group_id", "settings_key", "commit_sha", "status", "status_detail",
                                             "failure_signature"])
    metrics: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for path in run.files("metrics"):
        for r in pq.read_table(path, filesystem=run.fs, schema=METRICS_SCHEMA).to_pylist():
            if r["load_point"] == point.point_id:
                metrics[(r["group_id"], r["settings_key"])].append(r)
    out = []
    for c in sorted(cells.to_pylist(), key=lambda r: (r["group_id"], r["settings_key"])):
        t = by_key.get(c["settings_key"])
        if t is None or not PROBE_NAME.match(c["group_id"]):
            continue
        out += [(t, row) for row in _start_rows(run.run_id, c, metrics.get((c["group_id"], c["settings_key"]), []),
                                                metric)]
    return out


def _start_rows(run_id: str, cell_row: dict[str, Any], metric_rows: list[dict[str, Any]],
                metric: MetricName) -> list[StartRow]:
    """A probe's start as the search sees it: its metrics row, or why its commit could not be started."""
    sha, group = cell_row["commit_sha"], cell_row["group_id"]
    if not metric_rows:
        if cell_row["status"] == Status.OK:
            return [StartRow((run_id, group, 0), sha, invalid="the start returned no metrics row")]
        return [StartRow((run_id, group, 0), sha,
                         skip=f"{cell_row['status']}: {cell_row.get('status_detail') or ''}".strip(": "))]
    died = (cell_row.get("failure_signature") or None) if cell_row["status"] == Status.CRASHED else None
    out = []
    for r in metric_rows:
        value, se, why = row_value(r, metric)
        crash = (serving.crash_of(r.get("invalid_reason")) or died) if why is not None else None
        out.append(StartRow((run_id, group, int(r["start"] or 0)), sha, value, se, invalid=why, crash=crash))
    return out


# ---- the driver --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """What a metric bisect works on: the matrix and suite, the cells, the range and its history (`repo`:
    where installs come from; None: releases), and the question."""

    matrix: Matrix
    suite: Suite
    targets: list[MetricTarget]
    history: History
    repo: Path | None
    commits: list[str]
    question: Question
    point: LoadPoint


class MetricBisector:
    """A metric bisect run over one range: its targets, their searches, the probes and their records."""

    def __init__(self, setting: Setting, run: RunDir, options: MetricBisectOptions,
                 on_event: Callable[[str], None]) -> None:
        matrix, targets, commits, point = setting.matrix, setting.targets, setting.commits, setting.point
        self.matrix, self.suite, self.targets, self.history = matrix, setting.suite, targets, setting.history
        self.repo, self.commits, self.question, self.point = setting.repo, commits, setting.question, point
        self.run, self.options = run, options
        self.metric = METRICS[setting.question.metric]
        self.say = on_event
        self.spec = probe_spec(matrix, point)
        assert self.spec.bench is not None
        self.bench = self.spec.bench
        self.profile = cost.profile_for(matrix.spec, stated_profile(matrix.spec))
        # One start's modelled price: the server start and its one load phase; an install the first time.
        # A cell without GPUs (a CPU build) still holds one of the executor's slots: priced per slot-second.
        g = matrix.spec.gpus_per_cell or 1.0
        self.uses_gpus = matrix.spec.gpus_per_cell > 0  # what a GPU-hour budget counts
        self.start_s = g * (self.profile.start_s + cost.load_phase_seconds(self.bench, self.profile))
        self.install_s = g * self.profile.install_s if matrix.spec.install.kind != "preinstalled" else 0.0
        for t, row in stored_rows(options.runs_dir, targets, set(commits), point=point, bench=self.bench,
                                  metric=self.metric, this_run=run.run_id):
            t.rows.append(row)
        for t, row in own_rows(run, targets, point, self.metric):
            t.rows.append(row)
        done = probes_on_disk(run)
        self.probe_no, self.starts, self.round = done.last_number, done.starts, done.rounds
        self.ledger = Ledger.of_hours(options.budget_h, spent_s=done.gpu_seconds)
        self.installed = set(done.installed)

    # ---- the searches ------------------------------------------------------------------------

    def search_options(self) -> MetricSearchOptions:
        return MetricSearchOptions(min_effect=self.question.min_effect, higher_is_better=self.metric.higher_is_better,
                                   confidence=self.question.confidence, start_s=self.start_s,
                                   install_s=self.install_s, expected_changes=self.options.expected_changes)

    def searches(self) -> list[MetricSearch]:
        """Each target's search rebuilt from what is known, as of this round (a round's asks live for it)."""
        opts = self.search_options()
        return [MetricSearch(self.commits, opts, observations=t.observations(self.metric.name), rounds=self.round)
                for t in self.targets]

    def reused_starts(self) -> list[dict[str, Any]]:
        seen = {(r.key[0], r.key[1], r.key[2], r.commit) for t in self.targets for r in t.rows if r.reused}
        return [{"run_id": a, "group_id": b, "start": s, "commit": sha} for a, b, s, sha in sorted(seen)]

    def invalid_starts(self, target: MetricTarget | None = None) -> int:
        return sum(1 for t in self.targets if target is None or t is target for r in t.rows
                   if r.invalid is not None and not r.reused)

    # ---- probing -----------------------------------------------------------------------------

    def plan_round(self, searches: list[MetricSearch], slots: int) -> list[tuple[MetricTarget, str]]:
        """The round's starts, (target, commit) each, the most informative per GPU-second first."""
        wants: list[tuple[float, int, int, MetricTarget, str]] = []
        for n, (t, search) in enumerate(zip(self.targets, searches, strict=True)):
            if search.done:
                continue
            for probe in search.ask(slots):
                wants += [(-probe.value, probe.index, n, t, probe.commit)] * probe.starts
        wants.sort(key=lambda w: (w[0], w[1], w[2]))
        return [(t, sha) for _, _, _, t, sha in wants[:slots]]

    def afford(self, plan: list[tuple[MetricTarget, str]]) -> list[tuple[MetricTarget, str]]:
        """The longest prefix of the plan the budget covers, by the cost model."""
        def price(prefix: Sequence[tuple[MetricTarget, str]]) -> float:
            if not self.uses_gpus:
                return 0.0
            seen, total = set(self.installed), 0.0
            for _, sha in prefix:
                total += self.start_s + (self.install_s if sha not in seen else 0.0)
                seen.add(sha)
            return total
        return list(self.ledger.afford(plan, price))

    def probe(self, executor: Executor, plan: list[tuple[MetricTarget, str]]) -> list[str]:
        """Run one round; store and remember each start. Returns why each invalid start is no evidence."""
        self.round += 1
        jobs, served = [], {}
        cache_dir = self.options.cache_dir
        order = [n for n, _ in self.matrix.axes]
        for t, sha in plan:
            cell = make_cell(self.matrix.spec, {**t.cell.values, "commit": sha}, order)
            self.probe_no += 1
            job = GroupJob(run_id=self.run.run_id, group=ServerGroup(cell.server_key, (cell,)), spec=self.spec,
                           suite=self.suite, sha=sha, repo=repo_source(self.matrix.spec.install, self.repo),
                           cache_dir=str(Path(cache_dir).absolute()) if cache_dir else None,
                           cell_ids=(cell.cell_id,))
            jobs.append(job)
            # Several starts at one commit are equal jobs: told apart by identity, not by value.
            served[id(job)] = (self.probe_no, t)
        invalid = []
        for job, result in executor.run(jobs):
            probe_no, t = served[id(job)]
            invalid += self._store(job, result, probe_no, t)
        return invalid

    def _store(self, job: GroupJob, result: GroupResult, probe_no: int, target: MetricTarget) -> list[str]:
        sha = job.sha or job.group.head.commit
        name = f"p{probe_no:04d}-{sha[:10]}"
        samples, cells, metrics = (as_probe(tbl, name) for tbl in (result.samples, result.cells, result.metrics))
        # Log and the group's files first, the probe row last: a probe row means its results are on disk.
        if result.log:
            self.run.write_log(name, result.log_text())
        self.run.write_group(name, samples, cells, metrics)
        self.starts += 1
        self.installed.add(sha)
        mine = cells.filter(pc.equal(cells["settings_key"], target.settings_key)).to_pylist()
        cell_row = mine[0] if mine else {"group_id": name, "commit_sha": sha, "status": "missing",
                                         "status_detail": "the probe returned no row for the cell"}
        rows = [r for r in metrics.to_pylist() if r["settings_key"] == target.settings_key
                and r["load_point"] == self.point.point_id]
        found = _start_rows(self.run.run_id, {**cell_row, "commit_sha": sha}, rows, self.metric)
        target.rows += found
        gpu = float(sum(r.get("gpu_seconds") or 0.0 for r in mine))
        self.ledger.charge(gpu)
        status = next(("invalid" for r in found if r.invalid), None) or str(cell_row["status"])
        self.run.write_table(f"probes/{name}.parquet", table([{
            "run_id": self.run.run_id, "probe": probe_no, "round": self.round, "commit_sha": sha,
            "position": self.commits.index(sha), "settings_key": target.settings_key,
            "cell_id": cell_row.get("cell_id"), "status": status, "n_samples": 0, "n_failed": 0,
            "mode_failures": [], "reused": False, "group_id": name, "gpu_seconds": gpu}], PROBE_SCHEMA))
        return [r.invalid for r in found if r.invalid is not None]

    def drive(self, executor: Executor, slots: int) -> list[MetricReport]:
        """Rounds until every search is done (or the budget or round limit stops it); the state after
        each round goes to bisect.json."""
        reused = len(self.reused_starts())
        plan: list[tuple[MetricTarget, str]] = []
        invalid: list[str] = []
        while True:
            searches = self.searches()
            reports = [s.result() for s in searches]
            self.save_state(reports, final=False)
            if plan:  # the round just run, with what the searches believe after it
                best = next((b for b in map(best_so_far, reports) if b), None)
                self.say(round_line(self.round, [self.commits.index(sha) for _, sha in plan], len(self.commits) - 1,
                                    starts=self.starts, reused_starts=reused, gpu_seconds=self.gpu_seconds,
                                    invalid=invalid, best=best))
            if self.options.max_rounds is not None and self.round >= self.options.max_rounds:
                return reports
            plan = self.afford(self.plan_round(searches, slots))
            if not plan:
                if self.ledger.exhausted:
                    self.say(f"budget spent: {self.gpu_seconds / 3600:.3f} of {self.options.budget_h:g} GPU-h; "
                             "the next start is priced past what is left")
                return reports
            invalid = self.probe(executor, plan)

    @property
    def gpu_seconds(self) -> float:
        return self.ledger.spent_s

    def probed(self, target: MetricTarget) -> list[dict[str, Any]]:
        by_commit: dict[str, list[float]] = defaultdict(list)
        for r in target.rows:
            if r.invalid is None and r.skip is None:
                by_commit[r.commit].append(r.value)
        return [{"position": self.commits.index(sha), "sha": sha, "starts": len(v),
                 "mean": math.exp(sum(math.log(x) for x in v) / len(v))}
                for sha, v in sorted(by_commit.items(), key=lambda kv: self.commits.index(kv[0]))]

    def save_state(self, reports: list[MetricReport], *, final: bool) -> dict[str, Any]:
        cells = [CellReport({k: v for k, v in t.cell.values.items() if k != "commit"}, _label(t.cell),
                            t.settings_key, rep, self.probed(t), self.invalid_starts(t))
                 for t, rep in zip(self.targets, reports, strict=True)]
        summary = describe(self.question, cells, self.commits, self.history.info)
        summary.update({"run_id": self.run.run_id, "final": final, "rounds": self.round, "server_starts": self.starts,
                        "invalid_starts": self.invalid_starts(), "reused_starts": self.reused_starts(),
                        "gpu_seconds": self.gpu_seconds, "sweeper": SWEEPER_VERSION, "updated": now_utc().isoformat()})
        if (budget := budget_record(self.options.budget_h, self.ledger)) is not None:
            summary["budget"] = budget
        self.run.write_json("bisect.json", summary)
        return summary


def _with_repo(matrix: Matrix, repo: str | None) -> Matrix:
    if not repo:
        return matrix
    return dataclasses.replace(matrix, spec=matrix.spec.model_copy(
        update={"install": matrix.spec.install.model_copy(update={"repo": repo})}))


@dataclass(frozen=True)
class _Subject:
    matrix: Matrix
    cells: list[Cell]
    from_run: str | None = None


def stored_question(runs_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """The question a stored metric bisect asked (its bisect.json), or None for any other run."""
    try:
        summary = open_run(runs_dir, run_id, create=False).read_json("bisect.json")
    except (OSError, ValueError, SweepError):
        return None
    return dict(summary["question"]) if is_metric_bisect(summary) and isinstance(summary.get("question"), dict) \
        else None


def _has_verdict(run: RunDir) -> bool:
    try:
        return isinstance(run.read_json("bisect.json"), dict)
    except (OSError, ValueError, SweepError):
        return False


def is_metric_run(runs_dir: str | Path, run_id: str) -> bool:
    """Whether run `run_id` is a metric bisect (so `--resume` goes on with one)."""
    return stored_question(runs_dir, run_id) is not None


def _subject(scope: Any, options: MetricBisectOptions) -> _Subject:
    """The matrix and cells: a resumed run's, the one `--matrix --where` picks, or a sweep run's cells
    that stored metrics rows at both ends."""
    from sweeper.install.matrix_loader import load_matrix

    if options.resume and scope.matrix_path is None:
        old = open_run(options.runs_dir, options.resume, create=False).read_manifest()
        if not isinstance(old, BisectManifest):
            raise BisectError(f"run {options.resume} is not a bisect run; start a new bisect instead")
        matrix = _with_repo(load_matrix(old.matrix_path or ""), scope.repo)
        keys = set(old.settings_keys or ())
        return _Subject(matrix, list({c.settings_key: c for c in matrix.cells if c.settings_key in keys}.values()))
    if scope.matrix_path is not None:
        matrix = _with_repo(load_matrix(scope.matrix_path), scope.repo)
        return _Subject(matrix, [select_cell(matrix, scope.where)])
    return _cells_from_run(scope, options)


def _cells_from_run(scope: Any, options: MetricBisectOptions) -> _Subject:
    """A sweep run's cells (those `--where` picks) with valid metrics rows at the load point at both good
    and bad: a metric can be bisected only where it was measured."""
    from sweeper.drivers.bisect import sweep_run
    from sweeper.install.matrix_loader import load_matrix
    from sweeper.spec.matrix import short_hash

    run = sweep_run(options.runs_dir, scope.from_run)
    manifest = run.read_manifest()
    assert isinstance(manifest, SweepManifest)  # sweep_run picks sweep runs only
    path = Path(manifest.matrix_path or "")
    if not path.is_file():
        raise BisectError(f"run {run.run_id}: its matrix {path} is gone; pass --matrix FILE --where AXIS=VALUE")
    matrix = _with_repo(load_matrix(path), scope.repo)
    if short_hash(matrix.raw, 16) != manifest.matrix_digest:
        raise BisectError(f"run {run.run_id}: {path} changed since the run; run `sweep matrix {path}` again, "
                          "or pass --matrix")
    point = load_point_of(matrix, options.load_point)
    history = history_for(matrix.spec.install, repo_for(matrix, options.runs_dir), good=scope.good, bad=scope.bad)
    ends = {history.resolve(scope.good), history.resolve(scope.bad)}
    candidates = {c.settings_key: c for c in (select_cells(matrix, scope.where) if scope.where else matrix.cells)}
    seen: dict[str, set[str]] = defaultdict(set)
    for path_ in run.files("metrics"):
        for r in pq.read_table(path_, filesystem=run.fs, schema=METRICS_SCHEMA,
                               columns=["settings_key", "commit_sha", "load_point", "valid"]).to_pylist():
            if r["valid"] and r["load_point"] == point.point_id and r["commit_sha"] in ends:
                seen[r["settings_key"]].add(r["commit_sha"])
    chosen = sorted((c for k, c in candidates.items() if seen.get(k) == ends), key=lambda c: c.cell_id)
    if not chosen:
        raise BisectError(f"run {run.run_id}: no cell has valid metrics rows at {point.point_id} at both "
                          f"{scope.good} and {scope.bad}; pass --matrix FILE --where AXIS=VALUE")
    return _Subject(matrix, chosen, run.run_id)


def run_metric_bisect(scope: Any, options: MetricBisectOptions, *, executor: ExecutorFactory | None = None,
                      on_event: Callable[[str], None] = lambda _: None) -> MetricBisectOutcome:
    """Bisect `options.metric` at one load point over `scope`'s range (a `sweeper.drivers.bisect.BisectScope`:
    good, bad, and `matrix_path` + `where`, or a sweep run's cells). Every bad input is refused before
    anything starts."""
    old = stored_question(options.runs_dir, options.resume) if options.resume else None
    # A missing run is one line naming it; a failure bisect's verdict is no metric bisect to go on with.
    if options.resume and old is None and _has_verdict(open_run(options.runs_dir, options.resume, create=False)):
        raise BisectError(f"run {options.resume} is a failure bisect; resume it without --metric")
    metric_name = options.metric or (old or {}).get("metric")
    if metric_name is None:
        raise ConfigError("expected a metric to bisect, such as mean_tpot_ms", key="--metric")
    metric = metric_of(metric_name)
    load_point = options.load_point or (old or {}).get("load_point")
    min_effect = options.min_effect if options.min_effect is not None else float((old or {}).get("min_effect") or 0.03)
    if not (0 < min_effect < 1):
        raise ConfigError(f"expected a positive percentage below 100, got {100 * min_effect:g}%", key="--min-effect")
    options = dataclasses.replace(options, load_point=load_point)
    subject = _subject(scope, options)
    matrix, cells = subject.matrix, subject.cells
    point = load_point_of(matrix, load_point)
    check_cells(metric, cells)
    question = Question(metric.name, metric.unit, point.point_id, min_effect, metric.higher_is_better,
                        options.confidence)
    if old is not None and (old.get("metric"), old.get("load_point"), old.get("min_effect")) != \
            (question.metric, question.load_point, question.min_effect):
        raise BisectError(f"run {options.resume} bisected {old.get('metric')} at {old.get('load_point')} "
                          f"(min effect {100 * float(old.get('min_effect') or 0):g}%); start a new bisect instead")
    suite = load_suites(matrix.suite_paths)
    repo_path = repo_for(matrix, options.runs_dir)
    history = history_for(matrix.spec.install, repo_path, good=scope.good, bad=scope.bad)
    good_sha, bad_sha = history.resolve(scope.good), history.resolve(scope.bad)
    commits = history.range(good_sha, bad_sha)
    keys = sorted(c.settings_key for c in cells)
    if options.resume:
        run = open_run(options.runs_dir, options.resume, create=False)
        manifest = run.read_manifest()
        if not isinstance(manifest, BisectManifest) or manifest.good_sha != good_sha or manifest.bad_sha != bad_sha \
                or manifest.settings_keys != tuple(keys):
            raise BisectError(f"run {options.resume} bisected another range or other cells; start a new bisect instead")
        commits = list(manifest.commits) if manifest.commits is not None else commits
    else:
        run = open_run(options.runs_dir, options.run_id or new_run_id(f"bisect-{matrix.name}"), create=True)
    run.write_manifest(BisectManifest(
        run_id=run.run_id, matrix_path=str(matrix.path), matrix=matrix.raw, good=scope.good, bad=scope.bad,
        good_sha=good_sha, bad_sha=bad_sha, commits=tuple(commits), settings_keys=tuple(keys),
        cells=tuple({k: v for k, v in c.values.items() if k != "commit"} for c in cells),
        suite_digest=suite.digest, repo=history.where))
    targets = [MetricTarget(c) for c in sorted(cells, key=lambda c: c.settings_key)]
    on_event(f"bisecting {metric.name} at {point.point_id} over {len(commits) - 1} commits "
             f"{good_sha[:10]}..{bad_sha[:10]} for {len(cells)} cell(s)")
    try:
        with (executor or choose())(matrix) as ex:
            ex.preflight(matrix.spec.gpus_per_cell)
            k = options.parallel or max(1, ex.slots(matrix.spec.gpus_per_cell))
            b = MetricBisector(Setting(matrix, suite, targets, history, repo_path, commits, question, point), run,
                               options, on_event)
            reused = b.reused_starts()
            if reused:
                runs = sorted({r["run_id"] for r in reused})
                on_event(f"reusing {len(reused)} stored start(s) of run {', '.join(runs)} before any probe")
            if b.starts:
                on_event(f"resuming: {b.starts} stored probe(s) of run {run.run_id} told again, none run twice")
            on_event(f"{k} server start{'' if k == 1 else 's'} per round")
            reports = b.drive(ex, k)
    except KeyboardInterrupt:
        raise Interrupted(run.uri, run.run_id) from None
    summary = b.save_state(reports, final=True)
    return MetricBisectOutcome(run, reports, summary)


def options_from_flags(*, metric: str | None, load_point: str | None, min_effect: str | None, resume: str | None,
                       runs_dir: str | Path, failure_only: Sequence[str], **rest: Any) -> MetricBisectOptions | None:
    """`sweep bisect`'s flags as a metric bisect's options, or None for a failure bisect (no `--metric`, and
    no metric bisect resumed). `failure_only`: the failure bisect's flags given (`--max-samples`, ...), which
    a metric bisect refuses; `rest`: `MetricBisectOptions`' other fields. One line for a bad value."""
    if metric is None and not (resume and is_metric_run(runs_dir, resume)):
        for flag, given in (("--load-point", load_point), ("--min-effect", min_effect)):
            if given is not None:
                raise ConfigError("goes with --metric NAME (a metric bisect)", key=flag)
        return None
    if failure_only:
        raise ConfigError("is for a failure bisect; a metric bisect (--metric) does not take it", key=failure_only[0])
    if metric is not None:
        metric_of(metric)
    effect = parse_min_effect(min_effect) if min_effect is not None else None
    return MetricBisectOptions(metric=metric, load_point=load_point, min_effect=effect, resume=resume,
                               runs_dir=runs_dir, **rest)
