"""`sweep triage`: from a matrix and a commit range to one bug report per failure mode.

The phases, each a run of its own under `<triage run>/phases/` (so `sweep report` reads any of
them), recorded in `triage.json` (`sweeper.store.triage_record`) as they finish:

1. `bad`: the matrix at the bad commit, on a covering design (`sweeper.plan.design`) and, where it
   leaves servers out, the zoom's phases (`sweeper.plan.zoom`) until each mode's conjunction is settled;
2. `good`: the good commit on the cells that failed at bad on the servers step 4 will bisect (a
   covering design over those, no zoom);
3. explain: every failure mode of both, so a mode's scope says "fails at bad, not at good";
4. `bisect`: one `sweeper.drivers.bisect` search over the cheapest cell holding each mode's
   conjunction (fewest GPUs, quickest start, a cell already chosen for another mode first): it
   takes the samples of the phases before as stored evidence and shares starts between its cells;
   `metric-bisect-N`: a mode of an `expect:` bound (a metric outside it at bad) is bisected by
   `sweeper.drivers.metric_bisect` instead, one run per such mode: the bound's metric at the load
   point where most of its cell's starts broke it, `min_effect` the smallest change it claims, on the
   cell chosen as above; the sweeps' stored starts there are its evidence at good and bad;
5. `at-<sha>`: for a mode the bisect found brought and fixed inside the range (so absent at bad),
   the matrix at the commit that brought it, to explain it: the servers the bisect started there
   are not started again, their stored samples join the sweep's;
6. the reports (`sweeper.reports.triage`): one Markdown per mode, one HTML page over all.

Resuming runs only what is not done: a finished phase is read back, an interrupted sweep or bisect
is resumed by its own driver, which spends no stored probe twice. A budget (GPU-hours, as the cost
model prices a phase before it runs) skips a phase that would pass it and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sweeper.drivers.bisect import BisectOptions, BisectScope, Subject, bisect_cells
from sweeper.drivers.metric_bisect import MetricBisectOptions, metric_of, run_metric_bisect
from sweeper.drivers.sweep import Afford, ZoomOptions, make_plan, run_matrix
from sweeper.errors import ConfigError, GitError, Interrupted, StoreError, SweepError
from sweeper.execute.executor import ExecutorFactory
from sweeper.install import git as gitrepo
from sweeper.install.history import History, history_for
from sweeper.install.matrix_loader import load_matrix
from sweeper.install.repository import repo_for
from sweeper.judge.axis_levels import axes_map, value_text
from sweeper.judge.expectations import is_expect_mode
from sweeper.judge.explain import ModeExplanation
from sweeper.judge.metric_changes import change_evidence
from sweeper.plan.budget import Ledger
from sweeper.plan.sweep_plan import Plan
from sweeper.reports import triage as triage_report
from sweeper.reports.expectations import WATCHED, cells_with_expectations, expectation_evidence
from sweeper.reports.tables import is_failing
from sweeper.spec.matrix import Cell, DesignSpec, ServerGroup, canonical
from sweeper.spec.matrix_slice import Slice
from sweeper.store import frames as analysis
from sweeper.store.metrics_table import read_metrics
from sweeper.store.run_folder import RunDir, new_run_id, now_utc, open_run
from sweeper.store.triage_record import RECORD, Phase, TriageRecord, from_json, to_json

DEFAULT_DESIGN = DesignSpec(kind="covering", strength=3)


@dataclass(frozen=True)
class TriageScope:
    """What to triage: a matrix, and the range from a good commit to a bad one."""

    matrix_path: Path
    good: str
    bad: str


@dataclass(frozen=True)
class TriageOptions:
    runs_dir: str | Path = "runs"
    run_id: str | None = None  # the new triage run's name
    resume: str | None = None  # the triage run to continue
    design: DesignSpec | None = None  # of the sweeps (default: covering:3)
    budget_h: float | None = None  # GPU-hours, as the cost model prices each phase
    cache_dir: Path | None = None
    confidence: float = 0.99
    max_samples: int | None = None
    parallel: int | None = None
    # The bisects' search, as `sweep bisect --bumps/--expect-changes` set it (`BisectOptions`' fields):
    # the defaults are tuned for one change per mode; more is opt-in at its measured price.
    bump_width: int | None = None
    quiet_scan: bool = True
    expected_changes: float = 1.0
    # A metric mode's bisect (an `expect:` bound broken at bad): the smallest relative change it claims;
    # and for `watch`, the smallest change between good and bad that is a mode.
    min_effect: float = 0.03
    # Metrics whose change from good to bad is a failure mode without an `expect:` bound
    # (`sweeper.judge.metric_changes`): the good sweep then runs every cell the bad sweep ran.
    watch: tuple[str, ...] = ()


@dataclass
class TriageOutcome:
    run: RunDir
    record: TriageRecord
    reports: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class PhasePlan:
    """What `--dry-run` shows: a phase and its modelled GPU time."""

    name: str
    what: str
    starts: int | None
    gpu_s: float | None
    bound: str = ""  # "at most", "about" when the phase's size depends on what the ones before find


def design_name(spec: DesignSpec) -> str:
    return "full" if spec.kind == "full" else f"covering:{spec.strength}"


# ---- where things are -------------------------------------------------------------------------

def phases_dir(run: RunDir) -> str:
    return str(run.file("phases").shown)


def ref_name(repo: Path | None, given: str, sha: str) -> str:
    """A name for `sha` that the matrix's commit axis can hold and a person reads: `given` when it
    resolves there, else a tag on it, else the sha."""
    if repo is None:
        return sha
    try:
        if gitrepo.resolve(repo, given) == sha:
            return given
        tags = [t for t in gitrepo.git(repo, "tag", "--points-at", sha).split() if t]
    except GitError:
        return sha
    return min(tags) if tags else sha


def starts_of(run: RunDir) -> int:
    """Server starts a run made, counted from its server logs (one per start)."""
    try:
        return sum(1 for f in run.file("logs").listing() if f.base_name.endswith(".log"))
    except (OSError, SweepError):
        return 0


def gpu_seconds_of(run: RunDir) -> float:
    cells = analysis.load_table(run, "cells", ["gpu_seconds"])
    return float(sum(v or 0.0 for v in cells.column("gpu_seconds").to_pylist())) if cells.num_rows else 0.0


# ---- the driver -------------------------------------------------------------------------------

class Triage:
    """One triage run: its record, its phases, and what the phases found."""

    def __init__(self, scope: TriageScope, options: TriageOptions, executor: ExecutorFactory | None,
                 on_event: Callable[[str], None]) -> None:
        self.scope, self.options, self.executor, self.say = scope, options, executor, on_event
        self.design = options.design or DEFAULT_DESIGN
        self.matrix = load_matrix(scope.matrix_path)
        check_watch(self.matrix.spec.bench is not None, options.watch)
        if options.resume:
            self.run = open_run(options.runs_dir, options.resume, create=False)
            self.record = read_record(self.run)
            self._check_same()
        else:
            self.run = open_run(options.runs_dir, options.run_id or new_run_id(f"triage-{self.matrix.name}"),
                                create=True)
        self.phases = phases_dir(self.run)
        self.repo = repo_for(self.matrix, self.phases)
        self.history: History = history_for(self.matrix.spec.install, self.repo, good=scope.good, bad=scope.bad)
        good_sha, bad_sha = self.history.resolve(scope.good), self.history.resolve(scope.bad)
        if not options.resume:
            self.record = TriageRecord(
                run_id=self.run.run_id, matrix_path=str(scope.matrix_path), good=scope.good, bad=scope.bad,
                good_sha=good_sha, bad_sha=bad_sha, design=design_name(self.design), budget_h=options.budget_h,
                created=now_utc().isoformat())
            self.save()
        elif (self.record.good_sha, self.record.bad_sha) != (good_sha, bad_sha):
            raise StoreError(f"triage {self.run.run_id}: {scope.good}..{scope.bad} now resolves to other commits "
                             "than it ran; start a new triage instead")
        self.good_ref = ref_name(self.repo, scope.good, good_sha)
        self.bad_ref = ref_name(self.repo, scope.bad, bad_sha)

    def _check_same(self) -> None:
        r, s = self.record, self.scope
        if Path(r.matrix_path).resolve() != Path(s.matrix_path).resolve() or (r.good, r.bad) != (s.good, s.bad):
            raise StoreError(f"triage {self.run.run_id} ran {r.matrix_path} from {r.good} to {r.bad}; resume it "
                             "with the same matrix, --good and --bad, or start a new triage")
        if self.options.design is not None and design_name(self.options.design) != r.design:
            raise StoreError(f"triage {self.run.run_id} ran the design {r.design}; resume it without --design")
        self.design = _design_of(r.design)

    def save(self) -> None:
        self.record.updated = now_utc().isoformat()
        self.run.write_json(RECORD, to_json(self.record))

    # ---- budget ---------------------------------------------------------------------------------

    def ledger(self, *, held_s: float = 0.0) -> Ledger:
        """The triage's budget: what its phases spent (their cells' GPU-seconds), and `held_s`
        promised to phases under way."""
        return Ledger.of_hours(self.record.budget_h, spent_s=self.record.gpu_s, held_s=held_s)

    def affordable(self, phase: Phase) -> bool:
        """Whether the budget covers the phase's modelled cost; if not, the phase is recorded as skipped."""
        ledger = self.ledger()
        if ledger.fits(phase.modelled_gpu_s):
            return True
        left = ledger.left()
        assert left is not None and phase.modelled_gpu_s is not None  # without either, it fits
        phase.status = "skipped"
        phase.note = (f"the budget left {max(left, 0.0) / 3600:.3g} GPU-h; this phase is modelled at "
                      f"{phase.modelled_gpu_s / 3600:.3g} GPU-h")
        self.say(f"{phase.name}: skipped ({phase.note})")
        self.save()
        return False

    # ---- the sweeps -----------------------------------------------------------------------------

    def sweep(self, name: str, cut: Slice, design_spec: DesignSpec, *, zoom: bool = True,
              evidence: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> RunDir | None:
        """The sweep phase `name` over `cut` of the matrix: run (or resumed, or read back when done).
        `zoom`: after a covering design that leaves servers out, zoom phases settle each mode's
        conjunction (`sweeper.plan.zoom`), each within what the budget leaves; `evidence`: samples and
        cells from outside the run (the bisect's there) that the zoom's explanations read too."""
        phase = self.record.add_phase(Phase(name, "sweep", name))
        if phase.status == "done":
            return open_run(self.phases, phase.run_id, create=False)
        if phase.status == "skipped":
            return None
        plan = make_plan(self.scope.matrix_path, self.phases, design_spec=design_spec, cut=cut)
        phase.modelled_gpu_s = plan.estimate().gpu_seconds
        if not self.affordable(phase):
            return None
        self.save()
        started = self._exists(phase.run_id)
        self.say(f"{name}: {plan.n_cells} cells on {len(plan.groups)} servers ({design_name(design_spec)})")
        outcome = run_matrix(self.scope.matrix_path, runs_dir=self.phases, run_id=None if started else phase.run_id,
                             resume=phase.run_id if started else None, executor=self.executor,
                             cache_dir=self.options.cache_dir, design_spec=design_spec, cut=cut,
                             # No adaptive stopping: it saves requests, not server starts, and thins
                             # what explain and the bisect read. On the demo it cost the thinking-budget
                             # mode its runner term at bad (the MTP V1 cells stopped clean after a few
                             # budget samples: "spec_method=mtp" alone was named), with as many starts.
                             adaptive=False,
                             zoom_options=ZoomOptions(enabled=zoom, afford=self._afford(plan, phase),
                                                      evidence=evidence))
        phase.status, phase.gpu_s, phase.starts = "done", gpu_seconds_of(outcome.run), starts_of(outcome.run)
        self.save()
        return outcome.run

    def _afford(self, plan: Plan, phase: Phase) -> Afford | None:
        """The zoom's budget hook for the sweep `phase`: the longest prefix of a zoom phase's servers
        the budget still covers once the phases done are paid as spent and this one as the cost model
        prices it (its design's servers, the zoom phases before, installs once per commit)."""
        if self.record.budget_h is None:
            return None

        def afford(groups: tuple[ServerGroup, ...], held: tuple[ServerGroup, ...]) -> tuple[ServerGroup, ...]:
            under_way = sum(p.modelled_gpu_s or 0.0 for p in self.record.phases
                            if p is not phase and p.status not in ("done", "skipped"))
            return self.ledger(held_s=under_way).afford(groups, plan.price_beside(held))
        return afford

    def _exists(self, run_id: str) -> bool:
        try:
            open_run(self.phases, run_id, create=False).read_manifest()
        except SweepError:
            return False
        return True

    # ---- the bisect -----------------------------------------------------------------------------

    def _bisect_budget_h(self) -> float | None:
        """What the budget leaves for the bisect, which it spends round by round (the phase is
        started only when its modelled cost fits; a harder search stops where the budget ends)."""
        left = self.ledger().left()
        return None if left is None else max(left, 0.0) / 3600.0

    def bisect(self, cells: list[Cell], plan: Plan) -> dict[str, Any] | None:
        phase = self.record.add_phase(Phase("bisect", "bisect", "bisect"))
        if phase.status == "skipped":
            return None
        bisect_run = open_run(self.phases, "bisect", create=False) if self._exists("bisect") else None
        if phase.status == "done" and bisect_run is not None:
            summary = bisect_run.read_json("bisect.json")
            if isinstance(summary, dict) and summary.get("final"):
                return summary
        commits = self.history.range(self.record.good_sha, self.record.bad_sha)
        # Modelled as a binary search per cell, plus the endpoints' starts it takes from the sweeps.
        per_start = plan.profile.start_s + plan.requests_per_cell() * plan.profile.request_s
        phase.modelled_gpu_s = modelled_bisect_s(len(cells), len(commits), per_start, plan.matrix.spec.gpus_per_cell)
        if not self.affordable(phase):
            return None
        self.save()
        scope = BisectScope(good=self.record.good_sha, bad=self.record.bad_sha)
        options = BisectOptions(confidence=self.options.confidence, max_samples=self.options.max_samples,
                                parallel=self.options.parallel, cache_dir=self.options.cache_dir,
                                runs_dir=self.phases, run_id=None if bisect_run else "bisect",
                                resume="bisect" if bisect_run else None, budget_h=self._bisect_budget_h(),
                                bump_width=self.options.bump_width, quiet_scan=self.options.quiet_scan,
                                expected_changes=self.options.expected_changes)
        outcome = bisect_cells(Subject(plan.matrix, cells, plan.suite), scope, options, executor=self.executor,
                               on_event=lambda line: self.say(f"bisect: {line}"))
        phase.status, phase.starts = "done", starts_of(outcome.run)
        phase.gpu_s = float(outcome.summary.get("gpu_seconds") or 0.0)
        phase.reused_samples = int(outcome.summary.get("reused_samples") or 0)
        self.save()
        return outcome.summary


    def metric_bisect(self, index: int, cell: Cell, metric: str, load_point: str, plan: Plan) -> dict[str, Any] | None:
        """The metric bisect of the `index`-th metric mode on `cell` (phase `metric-bisect-<index>`): run,
        resumed, or read back when done. The sweeps' stored starts under `phases/` are its evidence."""
        name = f"metric-bisect-{index}"
        phase = self.record.add_phase(Phase(name, "metric-bisect", name))
        if phase.status == "skipped":
            return None
        existing = self._exists(name)
        if phase.status == "done" and existing:
            summary = open_run(self.phases, name, create=False).read_json("bisect.json")
            if isinstance(summary, dict) and summary.get("final"):
                return summary
        commits = self.history.range(self.record.good_sha, self.record.bad_sha)
        per_start = plan.profile.start_s + plan.requests_per_cell() * plan.profile.request_s
        phase.modelled_gpu_s = modelled_bisect_s(1, len(commits), per_start, plan.matrix.spec.gpus_per_cell)
        if not self.affordable(phase):
            return None
        self.save()
        where = tuple(f"{k}={v if isinstance(v, str) else canonical(v)}" for k, v in cell.values.items()
                      if k != "commit")
        scope = BisectScope(good=self.record.good_sha, bad=self.record.bad_sha, matrix_path=self.scope.matrix_path,
                            where=where)
        options = MetricBisectOptions(metric=metric, load_point=load_point, min_effect=self.options.min_effect,
                                      confidence=self.options.confidence, parallel=self.options.parallel,
                                      budget_h=self._bisect_budget_h(), expected_changes=self.options.expected_changes,
                                      cache_dir=self.options.cache_dir, runs_dir=self.phases,
                                      run_id=None if existing else name, resume=name if existing else None)
        outcome = run_metric_bisect(scope, options, executor=self.executor,
                                    on_event=lambda line: self.say(f"{name}: {line}"))
        summary = outcome.summary
        reused = len(summary.get("reused_starts") or [])
        phase.status, phase.starts = "done", int(summary.get("server_starts") or 0)
        phase.gpu_s = float(summary.get("gpu_seconds") or 0.0)
        phase.note = f"{metric} at {load_point}" + (f"; {reused} stored start(s) of the sweeps reused" if reused else "")
        self.save()
        return summary


def metric_question(bad_run: RunDir, mode: str, cell_id: str) -> tuple[str, str] | None:
    """The metric of the `expect:` mode and the load point to bisect it at: where most starts of its
    cell broke the bound at bad (the first such in the run's order, as its report picks it)."""
    found = expectation_evidence(bad_run)
    if found.empty:
        return None
    mine = found[found["bound"].astype(str) == mode]
    if mine.empty:
        return None
    broke = mine[(mine["cell_id"].astype(str) == cell_id) & ~mine["passed"].astype(bool)]
    point = str(broke["load_point"].value_counts(sort=True).index[0]) if not broke.empty \
        else str(mine["load_point"].iloc[0])
    return str(mine["metric"].iloc[0]), point


def modelled_bisect_s(cells: int, commits: int, per_start_s: float, gpus: float) -> float:
    """A bisect's modelled GPU time: per cell, a binary search over the range and a few starts more
    to settle a rate that only some requests show."""
    starts = cells * (math.ceil(math.log2(max(commits, 2))) + 2)
    return starts * per_start_s * gpus


def _design_of(name: str) -> DesignSpec:
    if name == "full":
        return DesignSpec(kind="full")
    return DesignSpec(kind="covering", strength=int(name.split(":")[1]) if ":" in name else 3)


def read_record(run: RunDir) -> TriageRecord:
    data = run.read_json(RECORD)
    if data is None:
        raise StoreError(f"run {run.run_id} is not a triage run (no readable {RECORD})")
    return from_json(data, f"{run.uri}/{RECORD}")


# ---- choosing what to bisect ------------------------------------------------------------------

def holds(m: ModeExplanation, axes: Mapping[str, str]) -> bool:
    """Whether a cell (its axis values as text) holds the mode's conjunction, read as requested."""
    for t in m.terms:
        axis = t.axis.removesuffix(" (effective)")
        if axis in axes and axes[axis] != t.value and (not t.requested or axes[axis] not in t.requested):
            return False
    return True


def cheapest_cells(modes: Sequence[ModeExplanation], cells: pd.DataFrame, gpus: float) -> dict[str, str]:
    """Per mode, the cell (its cell_id) to bisect it on: one where the mode failed at bad and its
    conjunction holds. Each server bisected costs a search of its own, so the servers are chosen as
    a greedy cover of the modes: the server where most modes not yet covered fail first, then the
    cheapest start (GPUs times its start time), then its id (never timing noise before a shared
    start). On the server chosen, a mode takes the cell where most modes fail, one chosen already
    first (the bisect then serves both from one search)."""
    rows = {str(r["cell_id"]): r for r in cells.to_dict("records")}
    failing_in: dict[str, int] = {}
    for m in modes:
        for cid, _ in m.failing_cells:
            failing_in[cid] = failing_in.get(cid, 0) + 1
    options: dict[str, list[str]] = {}
    for m in modes:
        candidates = [cid for cid, count in m.failing_cells
                      if cid in rows and count.failed and holds(m, _axes_text(rows[cid]))]
        if not candidates:
            candidates = [cid for cid, _ in m.failing_cells if cid in rows]
        if candidates:
            options[m.mode] = candidates

    def server(cid: str) -> str:
        key = rows[cid].get("server_key")
        return str(key) if isinstance(key, str) and key else cid

    def start_cost(cids: Sequence[str]) -> float:
        starts = [float(v) for v in (rows[c].get("startup_s") for c in cids) if v is not None and not pd.isna(v)]
        return gpus * min(starts) if starts else math.inf

    chosen: dict[str, str] = {}
    left = [m for m in options]
    while left:
        covers: dict[str, list[str]] = {}
        for mode in left:
            for s in dict.fromkeys(server(c) for c in options[mode]):
                covers.setdefault(s, []).append(mode)
        on = {s: [c for c in rows if server(c) == s] for s in covers}
        best = min(covers, key=lambda s: (-len(covers[s]), start_cost(on[s]), s))
        for mode in covers[best]:
            here = [c for c in options[mode] if server(c) == best]
            chosen[mode] = min(here, key=lambda c: (-failing_in.get(c, 0), 0 if c in chosen.values() else 1, c))
        left = [m for m in left if m not in covers[best]]
    return {m.mode: chosen[m.mode] for m in modes if m.mode in chosen}


def _axes_text(row: Mapping[str, Any]) -> dict[str, str]:
    raw = row.get("axes")
    pairs = raw.items() if isinstance(raw, dict) else (raw if raw is not None else [])
    import json

    return {str(k): str(value_text(json.loads(v))) for k, v in pairs}


# ---- the whole flow ---------------------------------------------------------------------------

def run_triage(scope: TriageScope, options: TriageOptions | None = None, *, executor: ExecutorFactory | None = None,
               on_event: Callable[[str], None] = lambda _: None) -> TriageOutcome:
    """Triage `scope` (see the module docstring); `executor` runs every phase's servers."""
    options = options or TriageOptions()
    t = Triage(scope, options, executor, on_event)
    try:
        return _flow(t)
    except Interrupted as exc:
        # Whichever phase was under way, the triage run is what continues.
        raise Interrupted(t.run.uri, t.run.run_id) from exc
    except KeyboardInterrupt:
        raise Interrupted(t.run.uri, t.run.run_id) from None


def check_watch(has_bench: bool, watch: Sequence[str]) -> None:
    """`--watch`'s metrics: known names, and a matrix that measures them (one line each, before anything runs)."""
    for name in watch:
        metric_of(name, "--watch")
    if watch and not has_bench:
        raise ConfigError("watches metrics, which a matrix measures under a bench: section; this one has none",
                          key="--watch")


def watch_changes(t: Triage, bad_run: RunDir) -> RunDir | None:
    """The good sweep over every cell the bad sweep ran, and each watched metric's change from good to bad
    judged per cell and load point (`sweeper.judge.metric_changes`), stored with the bad run (`WATCHED`)
    where every reader of its failures finds it."""
    keys = frozenset(str(k) for k in analysis.load_cells(bad_run)["settings_key"])
    good_run = t.sweep("good", Slice(commit=t.good_ref, settings=keys), t.design, zoom=False)
    if good_run is None:
        return None
    found = change_evidence(read_metrics(bad_run), read_metrics(good_run), t.options.watch,
                            min_effect=t.options.min_effect, good_ref=t.good_ref)
    rows = [{**r, "axes": [[str(k), str(v)] for k, v in (r["axes"] if r["axes"] is not None else [])]}
            for r in found.to_dict("records")]
    bad_run.write_json(WATCHED, {"good": t.good_ref, "min_effect": t.options.min_effect,
                                 "metrics": list(t.options.watch), "rows": rows})
    broke = found[~found["passed"].astype(bool)]
    t.say(f"watch: {len(broke)} of {len(found)} start x load point comparisons worse by "
          f"{100 * t.options.min_effect:g} % or more at {t.bad_ref} than at {t.good_ref}"
          + (": " + "; ".join(sorted(set(broke["bound"].astype(str)))) if len(broke) else ""))
    return good_run


def _flow(t: Triage) -> TriageOutcome:
    bad_run = t.sweep("bad", Slice(commit=t.bad_ref), t.design)
    if bad_run is None:
        return _finish(t, [], None, None)
    watched_good = watch_changes(t, bad_run) if t.options.watch else None
    # A cell with a start outside an `expect:` bound fails like one with failed requests.
    bad_cells = cells_with_expectations(bad_run, analysis.load_cells(bad_run))
    failing = {str(r["settings_key"]) for r in bad_cells.to_dict("records") if is_failing(r)}
    if not failing:
        t.say(f"bad: nothing fails at {t.bad_ref}; nothing to triage")
        return _finish(t, [], None, None)
    plan = make_plan(t.scope.matrix_path, t.phases, design_spec=t.design, cut=Slice(commit=t.bad_ref))
    gpus = plan.matrix.spec.gpus_per_cell
    # The good side runs the failing cells of the servers the bisect will search (chosen on bad's
    # own modes): the bisect starts each of them at good twice (its endpoint rule) and takes this
    # start as one. Another failing cell's start at good would only add a count to a mode's "not on
    # good" line, at a start's price. No zoom there: a zoom would chase what fails at good already.
    alone = triage_report.explained([bad_run], [t.good_ref, t.bad_ref])[0]
    servers = {str(r["server_key"]) for r in bad_cells.to_dict("records")
               if str(r["cell_id"]) in cheapest_cells([m for m in alone.modes if t.bad_ref in m.commits],
                                                      bad_cells, gpus).values()}
    good_side = {str(r["settings_key"]) for r in bad_cells.to_dict("records")
                 if str(r["settings_key"]) in failing and str(r["server_key"]) in servers} or failing
    good_run = watched_good or t.sweep("good", Slice(commit=t.good_ref, settings=frozenset(good_side)), t.design,
                                       zoom=False)
    runs = [bad_run, *([good_run] if good_run is not None else [])]
    at_ends = triage_report.explained(runs, [t.good_ref, t.bad_ref])
    explanation = at_ends[0]
    at_bad = [m for m in explanation.modes if t.bad_ref in m.commits]
    t.say(f"explain: {len(at_bad)} failure mode(s) at {t.bad_ref}: " + "; ".join(
        f"{m.mode} ({m.conjunction})" for m in at_bad))
    chosen = cheapest_cells(at_bad, bad_cells, gpus)
    keys = {str(r["cell_id"]): str(r["settings_key"]) for r in bad_cells.to_dict("records")}
    by_key = {c.settings_key: c for c in plan.matrix.cells}
    # A mode of an `expect:` bound has metric rows, not failing requests: the metric bisect takes it.
    wanted = {keys[c] for mode, c in chosen.items() if not is_expect_mode(mode)}
    cells = sorted((c for c in by_key.values() if c.settings_key in wanted), key=lambda c: c.cell_id)
    for mode, cid in chosen.items():
        t.say(f"bisect: {mode} on cell {cid}" + (" (metric bisect)" if is_expect_mode(mode) else ""))
    summary = t.bisect(cells, plan) if cells else None
    metric_summaries: dict[str, dict[str, Any]] = {}
    for i, (mode, cid) in enumerate(((m, c) for m, c in chosen.items() if is_expect_mode(m)), 1):
        question = metric_question(bad_run, mode, cid)
        if question is None:
            t.say(f"metric-bisect-{i}: {mode}: the bad sweep's metrics no longer hold its starts; not bisected")
            continue
        found = t.metric_bisect(i, by_key[keys[cid]], *question, plan)
        if found is not None:
            metric_summaries[mode] = found
    # Modes the bisect saw come and go inside the range: explained on the matrix at the commit that
    # brought them. The servers the bisect already started there are not started again: their
    # samples join the sweep's in its zoom's explanations and the report's (which reads their logs
    # where they are).
    extra: dict[str, triage_report.AtCommit] = {}
    bisect_run = open_run(t.phases, "bisect", create=False) if summary is not None else None
    for mode, change in triage_report.fixed_in_range(summary, {m.mode for m in at_bad}).items():
        sha = str(change["commit"]["sha"])
        ref = ref_name(t.repo, sha, sha)
        reused = probed_at(bisect_run, sha, ref) if bisect_run is not None else None
        cut = Slice(commit=ref)
        if reused is not None:
            at_plan = make_plan(t.scope.matrix_path, t.phases, design_spec=t.design, cut=cut)
            started = {server_part(axes_map(a)) for a in reused[1]["axes"]}
            keep = frozenset(c.settings_key for c in at_plan.matrix.cells if server_part(c.values) not in started)
            if keep and len(keep) < len(at_plan.matrix.cells):
                cut = Slice(commit=ref, settings=keep)
            else:
                reused = None  # every server started already, or none: the sweep runs them all
        # The bisect showed the mode there on its cell: a design of strength 1 over the other servers
        # (every value of every axis once) and the zoom's phases, which start the servers that tell
        # the mode's candidate conjunctions apart, explain it for fewer starts than the product.
        design_spec = t.design.model_copy(update={"kind": "covering", "strength": 1}) if reused is not None \
            else t.design
        run = t.sweep(f"at-{sha[:10]}", cut, design_spec, evidence=reused)
        if run is not None:
            extra[mode] = triage_report.AtCommit(run, *(reused or (None, None)))
    return _finish(t, runs, summary, extra, chosen, at_ends, metric_summaries)


def server_part(values: Mapping[str, Any]) -> frozenset[tuple[str, str | None]]:
    """A cell's server settings: its axis values but the commit and the request fields."""
    return frozenset((k, value_text(v)) for k, v in values.items() if k != "commit" and not k.startswith("request."))


def probed_at(bisect_run: RunDir, sha: str, ref: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The bisect's samples and cells at `sha`, their commit named `ref` as the sweep there names it."""
    samples, cells = analysis.load_samples(bisect_run), analysis.load_cells(bisect_run)
    if samples.empty or cells.empty:
        return None
    samples = samples[samples["commit_sha"].astype(str) == sha].copy()
    cells = cells[cells["commit_sha"].astype(str) == sha].copy()
    if samples.empty or cells.empty:
        return None
    samples["commit"], cells["commit"] = ref, ref
    return samples.reset_index(drop=True), cells.reset_index(drop=True)


def _finish(t: Triage, runs: list[RunDir], summary: dict[str, Any] | None,  # noqa: PLR0917
            extra: Mapping[str, triage_report.AtCommit] | None,
            chosen: Mapping[str, str] | None = None,
            at_ends: triage_report.Explained | None = None,
            metric: Mapping[str, Mapping[str, Any]] | None = None) -> TriageOutcome:
    paths = triage_report.write_reports(t.run, t.record, runs, at_ends, summary, extra or {}, chosen or {},
                                        good=t.good_ref, bad=t.bad_ref, runs_dir=t.phases, metric=metric or {})
    t.record.final = True
    t.save()
    t.say(f"triage: {len(t.record.modes)} report(s) in {t.run.uri}/reports")
    return TriageOutcome(t.run, t.record, paths)


# ---- the dry run ------------------------------------------------------------------------------

def dry_run(scope: TriageScope, options: TriageOptions | None = None) -> list[PhasePlan]:
    """The phases a triage would run, with their modelled GPU time; nothing starts, nothing is written."""
    options = options or TriageOptions()
    design_spec = options.design or DEFAULT_DESIGN
    matrix = load_matrix(scope.matrix_path)
    check_watch(matrix.spec.bench is not None, options.watch)
    try:
        repo = repo_for(matrix, options.runs_dir)
        history = history_for(matrix.spec.install, repo, good=scope.good, bad=scope.bad)
        good_sha, bad_sha = history.resolve(scope.good), history.resolve(scope.bad)
        n_commits = len(history.range(good_sha, bad_sha))
    except SweepError as exc:
        raise ConfigError(f"cannot resolve {scope.good}..{scope.bad}: {exc}", file=str(scope.matrix_path)) from None
    bad = make_plan(scope.matrix_path, options.runs_dir, design_spec=design_spec,
                    cut=Slice(commit=ref_name(repo, scope.bad, bad_sha)))
    est = bad.estimate()
    per_start = bad.profile.start_s + bad.requests_per_cell() * bad.profile.request_s
    gpus = bad.matrix.spec.gpus_per_cell
    keys = len({g.server_key for g in bad.groups})
    return [
        PhasePlan("bad", f"{bad.n_cells} cells on {len(bad.groups)} servers at {scope.bad} "
                         f"({bad.design.describe()})", est.starts, est.gpu_seconds),
        PhasePlan("good", f"every cell of bad, at {scope.good} (--watch {','.join(options.watch)})"
                  if options.watch else f"the cells failing at {scope.bad}, at {scope.good}", est.starts,
                  est.gpu_seconds, "" if options.watch else "at most"),
        PhasePlan("bisect", f"{n_commits - 1} commits; one cell per failure mode (at most {keys})",
                  None, modelled_bisect_s(1, n_commits, per_start, gpus), "per mode, about"),
        PhasePlan("at-<commit>", "per mode brought and fixed inside the range: the matrix at its first bad commit",
                  est.starts, est.gpu_seconds, "per such mode"),
    ]


def dry_run_lines(phases: Sequence[PhasePlan], budget_h: float | None) -> list[str]:
    out = []
    for p in phases:
        cost = "not modelled" if p.gpu_s is None else f"{p.gpu_s / 3600:.3g} GPU-h"
        starts = "" if p.starts is None else f", {p.starts} server starts"
        out.append(f"{p.name}: {p.what} — {(p.bound + ' ') if p.bound else ''}{cost}{starts}")
    if budget_h is not None:
        out.append(f"budget: {budget_h:g} GPU-h; a phase the model prices past what is left is skipped")
    return out
