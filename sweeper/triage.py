"""`sweep triage`: from a matrix and a commit range to one bug report per failure mode.

The phases, each a run of its own under `<triage run>/phases/` (so `sweep report` reads any of
them), recorded in `triage.json` (`sweeper.triage_record`) as they finish:

1. `bad`: the matrix at the bad commit, on a covering design (`sweeper.design`);
2. `good`: the good commit on the cells that failed at bad (a covering design over those);
3. explain: every failure mode of both, so a mode's scope says "fails at bad, not at good";
4. `bisect`: one `sweeper.bisect.driver` search over the cheapest cell holding each mode's
   conjunction (fewest GPUs, quickest start, a cell already chosen for another mode first): it
   takes the samples of the phases before as stored evidence and shares starts between its cells;
5. `at-<sha>`: for a mode the bisect found brought and fixed inside the range (so absent at bad),
   the matrix at the commit that brought it, to explain it;
6. the reports (`sweeper.triage_report`): one Markdown per mode, one HTML page over all.

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

from sweeper import analysis, gitrepo, triage_report
from sweeper.bisect.driver import BisectOptions, BisectScope, Subject, bisect_cells
from sweeper.errors import ConfigError, GitError, Interrupted, StoreError, SweepError
from sweeper.executor import ExecutorFactory
from sweeper.explain import ModeExplanation
from sweeper.history import History, history_for
from sweeper.matrix import Cell, DesignSpec, load_matrix
from sweeper.matrix_slice import Slice
from sweeper.report import is_failing
from sweeper.repos import repo_for
from sweeper.store import RunDir, new_run_id, now_utc, open_run
from sweeper.sweep import Plan, ZoomOptions, make_plan, run_matrix
from sweeper.triage_record import RECORD, Phase, TriageRecord, from_json, to_json

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

    def left_s(self) -> float | None:
        budget = self.record.budget_h
        return None if budget is None else budget * 3600.0 - self.record.gpu_s

    def affordable(self, phase: Phase) -> bool:
        """Whether the budget covers the phase's modelled cost; if not, the phase is recorded as skipped."""
        left = self.left_s()
        if left is None or phase.modelled_gpu_s is None or phase.modelled_gpu_s <= left:
            return True
        phase.status = "skipped"
        phase.note = (f"the budget left {max(left, 0.0) / 3600:.3g} GPU-h; this phase is modelled at "
                      f"{phase.modelled_gpu_s / 3600:.3g} GPU-h")
        self.say(f"{phase.name}: skipped ({phase.note})")
        self.save()
        return False

    # ---- the sweeps -----------------------------------------------------------------------------

    def sweep(self, name: str, cut: Slice, design_spec: DesignSpec) -> RunDir | None:
        """The sweep phase `name` over `cut` of the matrix: run (or resumed, or read back when done)."""
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
                             # The triage's own phases (good side, bisect, at-commit sweeps) tell its
                             # modes apart; its start figures (BENCHMARKS.md, T1) are without the zoom.
                             zoom_options=ZoomOptions(enabled=False))
        phase.status, phase.gpu_s, phase.starts = "done", gpu_seconds_of(outcome.run), starts_of(outcome.run)
        self.save()
        return outcome.run

    def _exists(self, run_id: str) -> bool:
        try:
            open_run(self.phases, run_id, create=False).read_manifest()
        except SweepError:
            return False
        return True

    # ---- the bisect -----------------------------------------------------------------------------

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
                                resume="bisect" if bisect_run else None)
        outcome = bisect_cells(Subject(plan.matrix, cells, plan.suite), scope, options, executor=self.executor,
                               on_event=lambda line: self.say(f"bisect: {line}"))
        phase.status, phase.starts = "done", starts_of(outcome.run)
        phase.gpu_s = float(outcome.summary.get("gpu_seconds") or 0.0)
        phase.reused_samples = int(outcome.summary.get("reused_samples") or 0)
        self.save()
        return outcome.summary


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
    conjunction holds, with the fewest GPUs and the quickest start; a cell chosen for another mode
    first (the bisect then serves both from one start), then one where more modes fail."""
    rows = {str(r["cell_id"]): r for r in cells.to_dict("records")}
    failing_in: dict[str, int] = {}
    for m in modes:
        for cid, _ in m.failing_cells:
            failing_in[cid] = failing_in.get(cid, 0) + 1
    chosen: dict[str, str] = {}
    for m in modes:
        candidates = [cid for cid, count in m.failing_cells
                      if cid in rows and count.failed and holds(m, _axes_text(rows[cid]))]
        if not candidates:
            candidates = [cid for cid, _ in m.failing_cells if cid in rows]
        if not candidates:
            continue

        def cost(cid: str) -> tuple[float, float, int, int, str]:
            start = rows[cid].get("startup_s")
            start_s = float(start) if start is not None and not pd.isna(start) else math.inf
            return (gpus, start_s, 0 if cid in chosen.values() else 1, -failing_in.get(cid, 0), cid)

        chosen[m.mode] = min(candidates, key=cost)
    return chosen


def _axes_text(row: Mapping[str, Any]) -> dict[str, str]:
    from sweeper.levels import value_text

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


def _flow(t: Triage) -> TriageOutcome:
    bad_run = t.sweep("bad", Slice(commit=t.bad_ref), t.design)
    if bad_run is None:
        return _finish(t, [], None, None)
    bad_cells = analysis.load_cells(bad_run)
    failing = {str(r["settings_key"]) for r in bad_cells.to_dict("records") if is_failing(r)}
    if not failing:
        t.say(f"bad: nothing fails at {t.bad_ref}; nothing to triage")
        return _finish(t, [], None, None)
    good_run = t.sweep("good", Slice(commit=t.good_ref, settings=frozenset(failing)), t.design)
    runs = [bad_run, *([good_run] if good_run is not None else [])]
    at_ends = triage_report.explained(runs, [t.good_ref, t.bad_ref])
    explanation = at_ends[0]
    at_bad = [m for m in explanation.modes if t.bad_ref in m.commits]
    t.say(f"explain: {len(at_bad)} failure mode(s) at {t.bad_ref}: " + "; ".join(
        f"{m.mode} ({m.conjunction})" for m in at_bad))
    plan = make_plan(t.scope.matrix_path, t.phases, design_spec=t.design, cut=Slice(commit=t.bad_ref))
    chosen = cheapest_cells(at_bad, bad_cells, plan.matrix.spec.gpus_per_cell)
    keys = {str(r["cell_id"]): str(r["settings_key"]) for r in bad_cells.to_dict("records")}
    wanted = {keys[c] for c in chosen.values()}
    cells = sorted((c for c in {c.settings_key: c for c in plan.matrix.cells}.values() if c.settings_key in wanted),
                   key=lambda c: c.cell_id)
    for mode, cid in chosen.items():
        t.say(f"bisect: {mode} on cell {cid}")
    summary = t.bisect(cells, plan) if cells else None
    # Modes the bisect saw come and go inside the range: explained on the matrix at the commit that brought them.
    extra: dict[str, RunDir] = {}
    for mode, change in triage_report.fixed_in_range(summary, {m.mode for m in at_bad}).items():
        sha = str(change["commit"]["sha"])
        run = t.sweep(f"at-{sha[:10]}", Slice(commit=ref_name(t.repo, sha, sha)), t.design)
        if run is not None:
            extra[mode] = run
    return _finish(t, runs, summary, extra, chosen, at_ends)


def _finish(t: Triage, runs: list[RunDir], summary: dict[str, Any] | None, extra: dict[str, RunDir] | None,
            chosen: Mapping[str, str] | None = None,
            at_ends: triage_report.Explained | None = None) -> TriageOutcome:
    paths = triage_report.write_reports(t.run, t.record, runs, at_ends, summary, extra or {}, chosen or {},
                                        good=t.good_ref, bad=t.bad_ref, runs_dir=t.phases)
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
        PhasePlan("good", f"the cells failing at {scope.bad}, at {scope.good}", est.starts, est.gpu_seconds,
                  "at most"),
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
