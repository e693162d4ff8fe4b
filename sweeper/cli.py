"""The `sweep` command line: parses options and calls the library, nothing else.

`SweepError`s become one line on stderr and exit 1; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sweeper.errors import Interrupted, SweepError, one_line

if TYPE_CHECKING:
    from sweeper.drivers.bisect import BisectScope
    from sweeper.drivers.metric_bisect import MetricBisectOptions
    from sweeper.execute.executor import ExecutorFactory
    from sweeper.plan.sweep_plan import Plan

app = typer.Typer(
    name="sweep", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="Find which vLLM serving configurations break, and which vLLM commit broke them.\n\n"
         "Example: sweep matrix matrices/demo.yaml",
)
suite_app = typer.Typer(no_args_is_help=True, help="Inspect replay suites.\n\nExample: sweep suite show suites/thinking-budget.yaml")
cache_app = typer.Typer(no_args_is_help=True, help="Per-commit vLLM environments cached on this node.\n\n"
                                                    "Example: sweep cache list")
model_app = typer.Typer(no_args_is_help=True, help="Build models for local tests.\n\nExample: sweep model tiny /tmp/tiny")
runs_app = typer.Typer(no_args_is_help=True, help="List stored runs, check them for damage, rebuild a lost "
                                                   "manifest.\n\nExample: sweep runs list")
app.add_typer(suite_app, name="suite")
app.add_typer(runs_app, name="runs")
app.add_typer(cache_app, name="cache")
app.add_typer(model_app, name="model")

# Piped output (CI logs, files) gets a wide table instead of rich's 80-column default, unless COLUMNS
# says how wide (rich reads it, on a terminal too).
out = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 200)
err = Console(stderr=True, soft_wrap=True)

# A string, not a Path: a filesystem URI (s3://bucket/prefix) must keep its double slash.
RunsDir = Annotated[str, typer.Option("--runs-dir", envvar="SWEEP_RUNS_DIR",
                                      help="Folder holding the runs, or a pyarrow filesystem URI "
                                           "(s3://bucket/prefix, gs://…, file://…); default: $SWEEP_RUNS_DIR, else runs.")]


ExecutorOpt = Annotated[str, typer.Option("--executor", help="Where servers run: ray (a cluster, or a local one) "
                                                              "or local (threads of this process, no Ray).")]


def resume_command(command: str, *args: str, runs_dir: str | Path, run_id: str) -> str:
    """The command line that continues an interrupted run."""
    where = [] if str(runs_dir) == "runs" else ["--runs-dir", str(runs_dir)]
    return shlex.join(["sweep", command, *args, *where, "--resume", run_id])


def warn(message: str) -> None:
    """A warning: one plain line on stderr."""
    sys.stderr.write(f"warning: {one_line(message)}\n")


def note(message: str) -> None:
    sys.stderr.write(f"note: {one_line(message)}\n")


@app.command("matrix")
def matrix_cmd(
    file: Annotated[Path, typer.Argument(help="Matrix YAML file.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the servers to start and the cells on each; run nothing.")] = False,
    runs_dir: RunsDir = "runs",
    run_id: Annotated[str | None, typer.Option(help="Name of the new run (default: time + matrix name).")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this run: only groups without results run.")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: RAY_ADDRESS, else a local cluster).")] = None,
    gpus: Annotated[float | None, typer.Option(help="Logical GPU slots of the local cluster for simulator runs (default 4).")] = None,
    executor: ExecutorOpt = "ray",
    cache_dir: Annotated[Path | None, typer.Option(help="Per-commit environment cache (default: $SWEEP_CACHE or ~/.cache/sweep/envs).")] = None,
    design: Annotated[str | None, typer.Option("--design", help="Which cells to run: full (the product) or covering[:T], "
                                                               "every T-way combination of server settings (T default 3); "
                                                               "default: the matrix's design key, else full.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse env names and request fields vLLM may ignore that "
                                                         "are only warned about (names missing from a pinned list).")] = False,
    no_zoom: Annotated[bool, typer.Option("--no-zoom", help="With a covering design: stop after it, without the zoom "
                                                            "phases that tell each failure mode's candidate "
                                                            "conjunctions apart.")] = False,
    adaptive: Annotated[bool, typer.Option("--adaptive", help="Replay each cell's suite in rounds and stop it once its "
                                                              "verdict is settled (the matrix's adaptive key, else "
                                                              "clean below 10 %, failing above 1 %, at 95 %).")] = False,
    budget: Annotated[float | None, typer.Option("--budget", metavar="GPU_HOURS",
                                                 help="Run only the servers that fit into this many GPU-hours by "
                                                      "the cost model; the rest is reported untested.")] = None,
    check_wheels: Annotated[bool, typer.Option("--check-wheels", help="Ask the wheel index whether each commit's "
                                                                      "wheel exists for the matrix's install.variant "
                                                                      "(install kind wheels) before anything runs; "
                                                                      "exit 1 if one is missing.")] = False,
    where: Annotated[list[str] | None, typer.Option("--where", metavar="AXIS=VALUE",
                                                    help="With --resume RUN: run the cells every AXIS=VALUE picks "
                                                         "again (repeatable), their stored results replaced, the "
                                                         "rest of the run kept.")] = None,
) -> None:
    """Expand a matrix, run every cell against a real server, store one Parquet row per request.

    Example: sweep matrix matrices/demo.yaml --dry-run
    """
    from sweeper.install.matrix_loader import check_files

    check_files(file)  # a bad matrix or suite: one line before the drivers (pandas, scipy, the runner) load
    from sweeper.drivers import sweep
    from sweeper.errors import ConfigError
    from sweeper.execute.choice import choose
    from sweeper.reports import preview, spend, tables
    from sweeper.spec.matrix import DESIGN_EXPECTED, design_from_text
    from sweeper.store.frames import load_cells
    from sweeper.store.manifest import PhaseRecord

    design_spec = design_from_text(design) if design is not None else None
    if design is not None and design_spec is None:
        raise ConfigError(f"{DESIGN_EXPECTED}, got {design!r}", key="--design")
    from sweeper.drivers import rerun

    rerun.check_options(where, resume, others=bool(design or adaptive or budget is not None))
    if where and dry_run:
        assert resume is not None
        rerun_preview(file, runs_dir, resume, where)
        return
    wants_adaptive = True if adaptive else None  # without the flag: the matrix's adaptive key
    # A dry run leaves a remote repository's refs unresolved, unless the wheels are to be asked for.
    plan = sweep.make_plan(file, runs_dir, resolve=check_wheels, design_spec=design_spec, adaptive=wants_adaptive,
                           budget_hours=budget) if dry_run or not resume or check_wheels else None
    if plan is not None:
        check_misconfiguration(plan, cache_dir=cache_dir, strict=strict)
    if check_wheels:
        assert plan is not None
        print_wheel_checks(plan)
    if dry_run:
        assert plan is not None
        out.print(f"[bold]{plan.matrix.name}[/bold]: {len(plan.cells)} cells on {len(plan.groups)} servers, "
                  f"{plan.requests_per_cell()} requests per cell (suite {plan.suite.name})")
        for i, (server, cells) in enumerate(preview.plan_text(plan), 1):
            out.print(f"server {i}: {server}", markup=False, highlight=False, soft_wrap=True)
            for cell in cells:
                out.print(f"    {cell}", markup=False, highlight=False)
        if plan.zooms:  # before the design's figures, which end the output
            out.print("then zoom: " + ("off (--no-zoom)" if no_zoom else
                                       "on; phases of servers that tell each failure mode's candidates apart, "
                                       "as many as the results need"
                                       + (" and the budget leaves" if plan.budget is not None else "")),
                      markup=False, highlight=False)
        for line in preview.design_text(plan):
            out.print(line, markup=False, highlight=False)
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=False)
    task = progress.add_task("servers", total=None)

    def on_plan(plan: Plan, todo: int) -> None:
        progress.update(task, total=todo, description=f"{plan.matrix.name}: servers")
        progress.start()

    def on_group(job: object, result: object) -> None:
        progress.advance(task)

    def on_phase(phase: PhaseRecord) -> None:
        total = progress.tasks[0].total or 0
        progress.update(task, total=total + len(phase.groups), description=f"zoom phase {phase.phase}: servers")

    try:
        if where:
            assert resume is not None
            outcome = rerun.rerun(file, runs_dir=runs_dir, run_id=resume, where=where,
                                  executor=choose(executor, address=address, gpus=gpus), cache_dir=cache_dir,
                                  on_group=on_group, on_plan=on_plan)
        else:
            outcome = sweep.run_matrix(file, runs_dir=runs_dir, run_id=run_id, resume=resume,
                                       executor=choose(executor, address=address, gpus=gpus), cache_dir=cache_dir,
                                       on_group=on_group, on_plan=on_plan, design_spec=design_spec,
                                       adaptive=wants_adaptive, budget_hours=budget,
                                       zoom_options=sweep.ZoomOptions(enabled=not no_zoom, on_phase=on_phase))
    except Interrupted as exc:
        again = [arg for w in where or () for arg in ("--where", w)]
        raise exc.with_resume(resume_command("matrix", str(file), *again, runs_dir=runs_dir,
                                             run_id=exc.run_id)) from None
    finally:
        if progress.live.is_started:  # stopping a bar never started prints a blank line
            progress.stop()
    for line in outcome.notes:
        note(line)
    cells = load_cells(outcome.run)
    out.print(tables.cells_table(cells, title=f"run {outcome.run.run_id}", orders=tables.run_orders(outcome.run, cells),
                                 width=out.width))
    for line in spend.run_notes(outcome.run):
        out.print(line, markup=False, highlight=False)
    if where:
        n = len(outcome.ran)
        out.print(f"re-ran the cells of --where {' '.join(where)} on {n} server{'' if n == 1 else 's'}; "
                  f"the rest of run {outcome.run.run_id} is as it was", markup=False, highlight=False)
    if outcome.skipped:
        out.print(f"{len(outcome.skipped)} server groups already had results and were not run again.")
    if len(outcome.phases) > 1 or outcome.zoom_summary:
        out.print("phases: " + "; ".join(f"{p.phase} {p.kind} ({len(p.groups)} servers)" for p in outcome.phases),
                  markup=False, highlight=False)
    if outcome.zoom_summary:
        out.print(f"zoom {outcome.zoom_summary}", markup=False, highlight=False)
    out.print(f"results: {outcome.run.uri}")


def rerun_preview(file: Path, runs_dir: str, run_id: str, where: list[str]) -> None:
    """The servers and cells `--where` would run again in `run_id`; nothing is run."""
    from sweeper.drivers import rerun

    _, _, todo = rerun.plan_rerun(file, runs_dir, run_id, where)
    cells = sum(len(t.group.cells) for t in todo)
    out.print(f"re-run in {run_id}: {cells} cells on {len(todo)} servers (--where {' '.join(where)})",
              markup=False, highlight=False)
    for t in todo:
        how = "replacing its stored results" if t.stored_id else "no results yet: the whole group"
        out.print(f"server {t.name} ({how}):", markup=False, highlight=False)
        for cell in t.group.cells:
            out.print(f"    {cell.cell_id}", markup=False, highlight=False)


def print_wheel_checks(plan: Plan) -> None:
    """One line per commit of the plan: its wheel found or missing on the index; then, if one is
    missing, the error (exit 1) before anything is installed or started."""
    from sweeper.install import availability

    refs = plan.commit_order or plan.matrix.commits()
    checks = availability.check_commits(plan.matrix.spec.install, plan.shas, refs)
    for check in checks:
        out.print(check.line(), markup=False, highlight=False, soft_wrap=True)
    availability.require_all(checks)


def check_misconfiguration(plan: Plan, *, cache_dir: Path | None, strict: bool) -> None:
    """Env names and request fields vLLM would ignore: warnings on stderr, then every error on a line
    of its own and exit 1 (`sweeper.drivers.preflight` says which is which)."""
    from sweeper.drivers import preflight as misconfig

    matrix = plan.matrix
    found = misconfig.check(matrix, plan.shas, cache_dir=cache_dir, strict=strict)
    for f in found:
        line = one_line(f"{matrix.path}: {f.key}: {f.message}")
        sys.stderr.write(f"{'error' if f.error else 'warning'}: {line}\n")
    if any(f.error for f in found):
        raise typer.Exit(1)


@app.command("report")
def report_cmd(
    run_id: Annotated[str | None, typer.Argument(help="Run to report (default: the latest).")] = None,
    runs_dir: RunsDir = "runs",
    rows: Annotated[str | None, typer.Option(help="Heatmap rows: comma-separated axes.")] = None,
    cols: Annotated[str | None, typer.Option(help="Heatmap columns: comma-separated axes.")] = None,
    heatmap: Annotated[Path | None, typer.Option(help="Write a failure-rate heatmap (PNG/SVG) here.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Name the smallest setting conjunction behind each failure mode, with its evidence.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write one self-contained HTML report here (no network needed to view it).")] = None,
    issue: Annotated[bool, typer.Option("--issue", help="Print Markdown for vLLM's bug template (one failure mode; see --mode).")] = False,
    mode: Annotated[str | None, typer.Option("--mode", help="With --issue: the failure mode (its number in --explain, or part of its name).")] = None,
    against: Annotated[str | None, typer.Option("--against", help="Compare with this run: failure-rate change per cell with its interval.")] = None,
    all_cells: Annotated[bool, typer.Option("--all", help="Show every cell in the table (default: the 200 that fail most, when there are more).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text: the run's cells (a bisect run: its verdict, as `sweep bisect --json` printed it), or with --explain the explanation (schemas: runs/README.md).")] = False,
    metrics: Annotated[bool, typer.Option("--metrics", help="Serving metrics instead of failures: a table per load point (mean ± 95% interval over starts); with --against, each metric's change per matched cell with a verdict DIFFERENT/SAME/UNKNOWN.")] = False,
    pareto: Annotated[Path | None, typer.Option("--pareto", help="Write throughput against TPOT per configuration, the Pareto frontier marked (PNG/SVG), here.")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="With --heatmap: the serving metric to map (default mean_tpot_ms); with --against --metrics: only this metric; with --explain: the smallest setting conjunction that moves it, per load point.")] = None,
) -> None:
    """Failure rates per cell with 95% intervals (a bisect run: its verdict); or, instead, a heatmap,
    the explanation, an HTML report, a vLLM bug report, a comparison with another run, or JSON.

    Example: sweep report --explain --html runs/demo.html
    """
    from sweeper.reports.run_kind import Channels, ReportOptions, report_run

    options = ReportOptions(rows=rows, cols=cols, heatmap=heatmap, explain=explain, html=html, issue=issue, mode=mode,
                            against=against, all_cells=all_cells, as_json=as_json, metrics=metrics, pareto=pareto,
                            metric=metric)
    report_run(runs_dir, run_id, options, Channels(out=out, raw=sys.stdout.write, warn=warn, note=note))


def _version(value: bool) -> None:
    if value:
        from sweeper import __version__

        sys.stdout.write(f"sweep {__version__}\n")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the sweeper's version and exit.")] = False) -> None:
    """Find which vLLM serving configurations break, and which vLLM commit broke them."""


@runs_app.command("list")
def runs_list(
    runs_dir: RunsDir = "runs",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array of the runs (schema: runs/README.md).")] = False,
) -> None:
    """List the stored runs, oldest first: kind, created, matrix, cells, failing cells, status.

    Example: sweep runs list --json
    """
    import json

    from rich.table import Table

    from sweeper.drivers import runs

    found = runs.listing(runs_dir)
    if as_json:
        sys.stdout.write(json.dumps([r.as_json() for r in found], indent=2) + "\n")
        return
    if not found:
        out.print(f"no runs under {runs_dir}", markup=False, highlight=False)
        return
    table = Table(show_lines=False)
    for name in ("run", "kind", "created (UTC)", "matrix"):
        table.add_column(name, overflow="fold")
    table.add_column("cells", justify="right")
    table.add_column("failing", justify="right")
    table.add_column("status")
    for r in found:
        created = r.created[:19].replace("T", " ") if r.created else "·"
        table.add_row(r.run_id, r.kind or "·", created, r.matrix or "·", str(r.cells), str(r.failing), r.status)
    out.print(table)


@runs_app.command("check")
def runs_check(
    run_id: Annotated[str | None, typer.Argument(help="Run to check (default: every run).")] = None,
    runs_dir: RunsDir = "runs",
) -> None:
    """List damaged runs: lost or corrupt manifests, unreadable or short Parquet files. Exit 1 if any.

    Example: sweep runs check
    """
    from sweeper.drivers import runs

    damaged = False
    for health in runs.check(runs_dir, run_id):
        damaged = damaged or bool(health.scan.damage)
        for line in health.lines():
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    if damaged:
        raise typer.Exit(1)


@runs_app.command("repair")
def runs_repair(
    run_id: Annotated[str, typer.Argument(help="Run to repair.")],
    matrix: Annotated[Path | None, typer.Option("--matrix", help="The matrix file the run was made from "
                                                   "(default: the one its results record).")] = None,
    runs_dir: RunsDir = "runs",
) -> None:
    """Rebuild a lost or corrupt manifest.json from the matrix file and what the results recorded.

    Damaged groups are run again by `sweep matrix MATRIX --resume RUN`.

    Example: sweep runs repair 20260101-120000-demo
    """
    from sweeper.drivers import runs

    for line in runs.repair(runs_dir, run_id, matrix):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


@suite_app.command("show")
def suite_show(file: Annotated[Path, typer.Argument(help="Suite YAML file.")]) -> None:
    """Load a suite (checking it) and list its cases.

    Example: sweep suite show suites/structured-output.yaml
    """
    from sweeper.spec.suite import load_suite

    suite = load_suite(file)
    out.print(f"{suite.name}: {len(suite.cases)} cases, {sum(c.repeat for c in suite.cases)} requests, digest {suite.digest[:12]}")
    for case in suite.cases:
        out.print(f"  {case.case_id} ×{case.repeat}: {', '.join(c.name for c in case.checks)}")


@suite_app.command("checks")
def suite_checks() -> None:
    """List the checks a suite can use, with their parameters.

    Example: sweep suite checks
    """
    from sweeper.spec.checks import CHECKS

    for name, definition in CHECKS.items():
        out.print(f"[bold]{name}[/bold]: {getattr(definition, 'doc', '')}")


@cache_app.command("list")
def cache_list(cache_dir: Annotated[Path | None, typer.Option(help="Cache folder.")] = None) -> None:
    """List cached environments, least recently used first.

    Example: sweep cache list
    """
    from sweeper.install import cache as environments
    from sweeper.reports import tables as report

    envs = environments.list_environments(cache_dir)
    if not envs:
        out.print(f"no cached environments in {cache_dir or environments.default_cache_dir()}")
        return
    out.print(report.environments_table(envs))


@cache_app.command("clear")
def cache_clear(
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder.")] = None,
    commit: Annotated[str | None, typer.Option(help="Only environments of this commit.")] = None,
    older_than_days: Annotated[float | None, typer.Option(help="Only environments unused for this many days.")] = None,
) -> None:
    """Remove cached environments (never one in use).

    Example: sweep cache clear --older-than-days 14
    """
    from sweeper.install import cache as environments

    removed = environments.clear(cache_dir, older_than=older_than_days * 86400 if older_than_days else None,
                                 commit=commit)
    out.print(f"removed {len(removed)} environments")


@model_app.command("tiny")
def model_tiny(directory: Annotated[Path, typer.Argument(help="Folder to write the model to.")]) -> None:
    """Write a tiny Qwen3 model with random weights and a locally trained tokenizer (no downloads).

    Example: sweep model tiny /tmp/tiny-qwen3
    """
    from sweeper.execute import tinymodel

    path = tinymodel.build_tiny_model(directory)
    out.print(f"tiny model: {path}")


@app.command("bisect")
def bisect_cmd(
    good: Annotated[str, typer.Option("--good", help="A commit that passes (v0.27 means the v0.27.0 tag).")],
    bad: Annotated[str, typer.Option("--bad", help="A later commit that fails (main, a tag, a sha).")],
    matrix: Annotated[Path | None, typer.Option("--matrix", help="Matrix file whose settings the probes use (default: the latest sweep run's, bisecting each cell that changed).")] = None,
    run: Annotated[str | None, typer.Option("--run", help="The sweep run to take the matrix and failing cells from (default: the latest).")] = None,
    where: Annotated[list[str] | None, typer.Option("--where", help="AXIS=VALUE picking one cell of the matrix (repeatable).")] = None,
    repo: Annotated[str | None, typer.Option(help="The vLLM repository (path or URL); default: the matrix's install.repo.")] = None,
    parallel: Annotated[int | None, typer.Option(help="Probes per round (default: the free GPU slots of the cluster).")] = None,
    confidence: Annotated[float, typer.Option(help="A change is settled when its posterior probability reaches this.")] = 0.99,
    max_samples: Annotated[int | None, typer.Option(help="Stop (reporting what is undecided) after this many requests per cell.")] = None,
    widen: Annotated[bool, typer.Option("--widen", help="If the good endpoint fails, move it back (doubling the distance) until it passes.")] = False,
    budget: Annotated[float | None, typer.Option("--budget", metavar="GPU_HOURS",
                                                 help="GPU-hours for the whole run, as the cost model prices each "
                                                      "server start: no probe starts past it, and what is open is "
                                                      "reported undecided with what deciding would cost.")] = None,
    bumps: Annotated[int | None, typer.Option("--bumps", metavar="COMMITS",
                                              help="Also look for a regression fixed again inside the range, at "
                                                   "least COMMITS commits wide: a probe in every run of COMMITS "
                                                   "commits (about N / COMMITS server starts per cell over N "
                                                   "commits), whatever the ends show. Without it, a cell is "
                                                   "scanned every 3 commits only before its bisect would say "
                                                   "nothing changed; 0: never.")] = None,
    expect_changes: Annotated[float, typer.Option("--expect-changes", metavar="N",
                                                  help="Changes per range the search expects before it sees any "
                                                       "(default 1). Above 1 for a range likely to hold several "
                                                       "(a long release range, a mode that changes back and "
                                                       "forth): a second or third change of a mode is found more "
                                                       "often, at more GPU time per bisect.")] = 1.0,
    runs_dir: RunsDir = "runs",
    run_id: Annotated[str | None, typer.Option(help="Name of the new bisect run.")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this bisect run.")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: a local cluster).")] = None,
    gpus: Annotated[float | None, typer.Option(help="Logical GPU slots of the local cluster for simulator runs.")] = None,
    executor: ExecutorOpt = "ray",
    cache_dir: Annotated[Path | None, typer.Option(help="Per-commit environment cache.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON (bisect.json; schema: runs/README.md) "
                                                          "instead of text; progress stays on stderr.")] = False,
    metric: Annotated[str | None, typer.Option("--metric", help="Bisect a serving metric of the matrix's bench: (e.g. "
                                                                "mean_tpot_ms) instead of failures: every change larger "
                                                                "than --min-effect, with its size (docs/bisect.md).")] = None,
    load_point: Annotated[str | None, typer.Option("--load-point", help="With --metric: the bench's load point "
                                                                        "(e.g. concurrency=8); required when it has several.")] = None,
    min_effect: Annotated[str | None, typer.Option("--min-effect", help="With --metric: a smaller change is no "
                                                                        "change (a percentage, default 3%).")] = None,
) -> None:
    """Find every change in the range: each failure mode's regressions and fixes, even when only some requests fail.

    After `sweep matrix FILE`, `sweep bisect --good v0.27 --bad main` bisects every cell of that run that fails
    differently at bad than at good, sharing installs and server starts between cells.

    Example: sweep bisect --good v0.27 --bad main --matrix matrices/demo.yaml --where spec_method=mtp --where env.VLLM_USE_V2_MODEL_RUNNER=1
    """
    from sweeper.drivers import bisect as driver
    from sweeper.drivers import metric_bisect as metric_driver
    from sweeper.errors import ConfigError
    from sweeper.execute.choice import choose
    from sweeper.reports import bisect as report

    scope = driver.BisectScope(good=good, bad=bad, matrix_path=matrix, from_run=run, where=tuple(where or ()),
                               repo=repo)
    if budget is not None and not (0 < budget < float("inf")):
        raise ConfigError(f"expected a number of GPU-hours above 0, got {budget:g}", key="--budget")
    metric_options = metric_driver.options_from_flags(
        metric=metric, load_point=load_point, min_effect=min_effect, resume=resume, runs_dir=runs_dir,
        failure_only=[f for f, given in (("--max-samples", max_samples is not None), ("--widen", widen),
                                         ("--bumps", bumps is not None)) if given],
        confidence=confidence, parallel=parallel, budget_h=budget, expected_changes=expect_changes,
        cache_dir=cache_dir, run_id=run_id)
    if metric_options is not None:
        _metric_bisect(scope, metric_options, choose(executor, address=address, gpus=gpus), as_json=as_json)
        return
    options = driver.BisectOptions(confidence=confidence, max_samples=max_samples, parallel=parallel, widen=widen,
                                   cache_dir=cache_dir, runs_dir=runs_dir, run_id=run_id, resume=resume,
                                   budget_h=budget, **driver.search_choices(bumps, expect_changes))
    try:
        outcome = driver.run_bisect(scope, options, executor=choose(executor, address=address, gpus=gpus),
                                    on_event=lambda line: err.print(line, markup=False, highlight=False))
    except Interrupted as exc:
        raise exc.with_resume(resume_command("bisect", "--good", good, "--bad", bad, runs_dir=runs_dir,
                                             run_id=exc.run_id)) from None
    if as_json:
        sys.stdout.write(json.dumps(outcome.summary, indent=2, allow_nan=False) + "\n")
        return
    out.print(report.render(outcome.summary), markup=False, highlight=False)
    out.print(f"results: {outcome.run.uri}")


def _metric_bisect(scope: BisectScope, options: MetricBisectOptions, executor: ExecutorFactory, *,
                   as_json: bool) -> None:
    """`sweep bisect --metric`: run it, print its verdict."""
    from sweeper.drivers.metric_bisect import run_metric_bisect
    from sweeper.reports import metric_bisect as report

    try:
        outcome = run_metric_bisect(scope, options, executor=executor,
                                    on_event=lambda line: err.print(line, markup=False, highlight=False))
    except Interrupted as exc:
        question = [a for flag, v in (("--metric", options.metric), ("--load-point", options.load_point)) if v
                    for a in (flag, v)]
        raise exc.with_resume(resume_command("bisect", "--good", scope.good, "--bad", scope.bad, *question,
                                             runs_dir=options.runs_dir, run_id=exc.run_id)) from None
    if as_json:
        sys.stdout.write(json.dumps(outcome.summary, indent=2, allow_nan=False) + "\n")
        return
    out.print(report.render(outcome.summary), markup=False, highlight=False)
    out.print(f"results: {outcome.run.uri}")


@app.command("triage")
def triage_cmd(
    file: Annotated[Path, typer.Argument(help="Matrix YAML file.")],
    good: Annotated[str, typer.Option("--good", help="A commit that passes (v0.27 means the v0.27.0 tag).")],
    bad: Annotated[str, typer.Option("--bad", help="A later commit that fails (main, a tag, a sha).")],
    runs_dir: RunsDir = "runs",
    run_id: Annotated[str | None, typer.Option(help="Name of the new triage run.")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this triage run: finished phases are read back, "
                                                      "no stored probe runs again.")] = None,
    budget: Annotated[float | None, typer.Option("--budget", help="GPU-hours: a phase the cost model prices past "
                                                                  "what is left is skipped (the summary says so).")] = None,
    design: Annotated[str | None, typer.Option("--design", help="The sweeps' design: full or covering[:T] "
                                                               "(default covering:3).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the phases with their modelled GPU time; run nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the triage record (triage.json) instead of the summary.")] = False,
    confidence: Annotated[float, typer.Option(help="The bisect's target confidence.")] = 0.99,
    max_samples: Annotated[int | None, typer.Option(help="The bisect stops after this many requests per cell.")] = None,
    parallel: Annotated[int | None, typer.Option(help="Bisect probes per round (default: the free GPU slots).")] = None,
    bumps: Annotated[int | None, typer.Option("--bumps", metavar="COMMITS",
                                              help="The bisects also look for a regression fixed again inside the "
                                                   "range, at least COMMITS commits wide (as `sweep bisect --bumps`; "
                                                   "its price: docs/bisect.md).")] = None,
    expect_changes: Annotated[float, typer.Option("--expect-changes", metavar="N",
                                                  help="Changes per range each bisect expects before it sees any "
                                                       "(default 1; as `sweep bisect --expect-changes`).")] = 1.0,
    watch: Annotated[str | None, typer.Option("--watch", metavar="METRICS",
                                              help="Comma-separated metrics (mean_tpot_ms,spec_decode_acceptance_"
                                                   "length) whose change from good to bad is a failure mode, no "
                                                   "expect: bound needed; the good sweep then runs every cell.")] = None,
    min_effect: Annotated[str | None, typer.Option("--min-effect", help="The smallest change of a metric that is a "
                                                   "mode and that its bisect claims (default 3%).")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: RAY_ADDRESS, else a local cluster).")] = None,
    gpus: Annotated[float | None, typer.Option(help="Logical GPU slots of the local cluster for simulator runs (default 4).")] = None,
    executor: ExecutorOpt = "ray",
    cache_dir: Annotated[Path | None, typer.Option(help="Per-commit environment cache.")] = None,
) -> None:
    """From a matrix and a commit range to one bug report per failure mode: sweep bad (covering
    design), sweep good on what failed, explain each mode, bisect each once on its cheapest cell,
    write the reports.

    Example: sweep triage matrices/demo.yaml --good v0.27 --bad main
    """
    import dataclasses

    from sweeper.drivers import triage
    from sweeper.drivers.bisect import search_choices
    from sweeper.drivers.metric_bisect import parse_min_effect
    from sweeper.errors import ConfigError
    from sweeper.execute.choice import choose
    from sweeper.reports import triage as triage_report
    from sweeper.spec.matrix import DESIGN_EXPECTED, design_from_text
    from sweeper.store.triage_record import to_json as record_json

    design_spec = design_from_text(design) if design is not None else None
    if design is not None and design_spec is None:
        raise ConfigError(f"{DESIGN_EXPECTED}, got {design!r}", key="--design")
    if budget is not None and budget < 0:
        raise ConfigError(f"expected a number of GPU-hours >= 0, got {budget}", key="--budget")
    scope = triage.TriageScope(matrix_path=file, good=good, bad=bad)
    metrics = triage.TriageOptions.watch if watch is None else tuple(m.strip() for m in watch.split(",") if m.strip())
    effect = triage.TriageOptions.min_effect if min_effect is None else parse_min_effect(min_effect)
    options = triage.TriageOptions(runs_dir=runs_dir, run_id=run_id, resume=resume, design=design_spec,
                                   budget_h=budget, cache_dir=cache_dir, confidence=confidence,
                                   max_samples=max_samples, parallel=parallel, watch=metrics, min_effect=effect,
                                   **search_choices(bumps, expect_changes))
    if dry_run:
        phases = triage.dry_run(scope, options)
        if as_json:
            sys.stdout.write(json.dumps([dataclasses.asdict(p) for p in phases], indent=2) + "\n")
            return
        for line in triage.dry_run_lines(phases, budget):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    try:
        outcome = triage.run_triage(scope, options, executor=choose(executor, address=address, gpus=gpus),
                                    on_event=lambda line: err.print(line, markup=False, highlight=False))
    except Interrupted as exc:
        raise exc.with_resume(resume_command("triage", str(file), "--good", good, "--bad", bad, runs_dir=runs_dir,
                                             run_id=exc.run_id)) from None
    if as_json:
        sys.stdout.write(json.dumps(record_json(outcome.record), indent=2) + "\n")
        return
    for line in triage_report.summary_lines(outcome.record):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print(f"results: {outcome.run.uri}", markup=False, highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
             add_help_option=False)
def sim(ctx: typer.Context) -> None:
    """The vLLM simulator (tests and demos): `python -m vllmsim` with these arguments (serve, make-repo).

    Example: sweep sim make-repo /tmp/vllm-sim
    """
    from sweeper.install.sim import COMMAND

    # The simulator takes this process's place: its own CLI, exit code and signals (a TERM sent to
    # `sweep sim serve` reaches the server). The product never imports it.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(COMMAND[0], [*COMMAND, *ctx.args])


def main() -> None:
    try:
        # Without standalone mode click returns the code of a `typer.Exit` instead of exiting.
        code = app(standalone_mode=False)
        if code == 130:  # typer's answer to a Ctrl-C outside a run (which raises Interrupted)
            err.print("interrupted", markup=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except Interrupted as exc:
        sys.stderr.write(f"{one_line(str(exc))}\n")
        sys.exit(130)
    except SweepError as exc:
        # Plain write: one line, never wrapped, whatever the terminal width (or the input's newlines).
        sys.stderr.write(f"error: {one_line(str(exc))}\n")
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:
        # Usage errors (typer's own click) arrive here with standalone_mode=False: show them as click would.
        code = getattr(exc, "exit_code", None)
        if hasattr(exc, "show") and isinstance(code, int):
            exc.show()
            sys.exit(code)
        raise
