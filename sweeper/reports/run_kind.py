"""`sweep report`: what a stored run is (a sweep, a bisect or a triage) decides what is shown of it.

A triage run shows its summary (phases, their cost and reuse, the modes and their reports); a bisect
run its verdict as the bisect left it (nothing is started, nothing probed again); a sweep its table
of failure rates per cell, or instead what was asked: a heatmap, the explanation, an HTML report, a
vLLM bug report, a comparison with another run, or JSON. The command line parses its options into
`ReportOptions` and calls `report_run`; this module reads and prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from sweeper.errors import SweepError
from sweeper.reports import compare, spend, tables
from sweeper.reports import html as html_report
from sweeper.reports import triage as triage_report
from sweeper.reports.bisect import render as render_bisect
from sweeper.reports.bug import issue_markdown
from sweeper.reports.expectations import cells_with_expectations
from sweeper.reports.explain_json import to_json as explanation_json
from sweeper.reports.explain_text import render as render_explanation
from sweeper.reports.metric_bisect import is_metric_bisect
from sweeper.reports.metric_bisect import render as render_metric_bisect
from sweeper.reports.metrics import report_cli
from sweeper.store import frames as analysis
from sweeper.store.manifest import BisectManifest, Manifest
from sweeper.store.run_folder import RunDir, open_run
from sweeper.store.triage_record import TriageRecord
from sweeper.store.triage_record import to_json as record_json


@dataclass(frozen=True)
class ReportOptions:
    """What `sweep report` was asked for besides the run (each as its option says)."""

    rows: str | None = None  # heatmap rows: comma-separated axes
    cols: str | None = None  # heatmap columns
    heatmap: Path | None = None
    explain: bool = False
    html: Path | None = None
    issue: bool = False
    mode: str | None = None  # with `issue`: the failure mode
    against: str | None = None  # another run to compare with
    all_cells: bool = False
    as_json: bool = False
    metrics: bool = False  # serving metrics instead of failures (a table, or with `against` a comparison)
    pareto: Path | None = None  # throughput against TPOT per configuration, the frontier marked
    metric: str | None = None  # the metric of a heatmap, the only one compared, or with `explain` the one explained

    @property
    def about_metrics(self) -> bool:
        return self.metrics or self.pareto is not None or self.metric is not None


@dataclass(frozen=True)
class Channels:
    """Where a report goes: `out` for text and tables, `raw` for what is meant for a pipe (JSON,
    Markdown: written as it is), `warn` and `note` for one line each on stderr."""

    out: Console
    raw: Callable[[str], object]
    warn: Callable[[str], None]
    note: Callable[[str], None]


def report_run(runs_dir: str, run_id: str | None, options: ReportOptions, to: Channels) -> None:
    """Show run `run_id` under `runs_dir` (None: the latest) as its kind and `options` say."""
    o = options
    if o.about_metrics:
        report_cli(runs_dir, run_id, against=o.against, pareto_path=o.pareto, heatmap_path=o.heatmap, metric=o.metric,
                   rows_axes=o.rows, cols_axes=o.cols, json_out=o.as_json, write=to.raw, explain=o.explain)
        return
    if run_id is not None and not any((o.explain, o.html, o.issue, o.heatmap, o.against, o.all_cells)):
        record = triage_report.load(runs_dir, run_id)
        if record is not None:
            _triage(record, o, to)
            return
    run = open_run(runs_dir, run_id, create=False) if run_id else analysis.latest_run(runs_dir)
    manifest = run.manifest_or_none()  # results of another schema version: one line, stop
    _warn_damage(run, to)
    if o.issue:
        # Markdown only, so it can be piped into a file or the clipboard.
        to.raw(issue_markdown(run, mode=o.mode, runs_dir=runs_dir))
        return
    if o.mode is not None:
        raise SweepError("--mode goes with --issue")
    if o.as_json and o.explain:
        # JSON only, so it can be piped into jq or a file.
        to.raw(json.dumps(explanation_json(tables.explain_run(run)), indent=2) + "\n")
        return
    if isinstance(manifest, BisectManifest) and not (o.explain or o.heatmap or o.html or o.against):
        _bisect(run, manifest, o, to)
        return
    _sweep(run, manifest, runs_dir, o, to)


def _triage(record: TriageRecord, o: ReportOptions, to: Channels) -> None:
    """A triage run: its summary (phases, their cost and reuse, the modes and their reports)."""
    if o.as_json:
        to.raw(json.dumps(record_json(record), indent=2) + "\n")
        return
    for line in triage_report.summary_lines(record):
        to.out.print(line, markup=False, highlight=False, soft_wrap=True)


def _bisect(run: RunDir, manifest: BisectManifest, o: ReportOptions, to: Channels) -> None:
    """The verdict as the bisect left it: nothing is started, nothing probed again."""
    summary = run.read_json("bisect.json")
    if not isinstance(summary, dict):
        raise SweepError(f"bisect run {run.run_id} has no verdict yet (no readable bisect.json); "
                         f"`sweep bisect --good {manifest.good} --bad {manifest.bad} --resume {run.run_id}` "
                         "continues it")
    if o.as_json:
        # bisect.json as stored: the same object `sweep bisect --json` printed.
        to.raw(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    else:
        # bisect.json's schema says which bisect wrote it: a metric's verdict has its own words.
        render = render_metric_bisect if is_metric_bisect(summary) else render_bisect
        to.out.print(render(summary), markup=False, highlight=False)
    if not summary.get("final"):
        to.note(f"bisect run {run.run_id} is unfinished: this is its state after round {summary.get('rounds')}")


def _sweep(run: RunDir, manifest: Manifest | None, runs_dir: str, o: ReportOptions, to: Channels) -> None:
    """A sweep: its table, or instead each output asked for (each prints its own)."""
    out = to.out
    own = o.explain or o.heatmap or o.html or o.against or o.as_json
    # The table alone needs a few of the cells' columns; the explanation and a comparison need them all.
    cells_table = analysis.load_table(run, "cells", None if o.explain or o.against or o.as_json
                                      else tables.TABLE_COLUMNS)
    cells = analysis.frame(cells_table)
    orders = tables.run_orders(run, cells)
    order = orders["commit"]
    if o.as_json:
        to.raw(json.dumps(tables.report_json(run, cells_table, orders), indent=2, allow_nan=False,
                          default=str) + "\n")
    if o.against:
        other = open_run(runs_dir, o.against, create=False)
        _warn_damage(other, to)
        result = compare.compare(analysis.load_samples(run), cells, analysis.load_samples(other),
                                 analysis.load_cells(other), suite_a=tables.run_suite(run),
                                 suite_b=tables.run_suite(other), run_a=run.run_id, run_b=other.run_id,
                                 fixed_a=compare.fixed_settings(manifest),
                                 fixed_b=compare.fixed_settings(other.manifest_or_none()))
        for line in compare.render(result):
            out.print(line, markup=False, highlight=False)
        out.print(compare.table(result))
    if not own:
        # A cell with a server start outside an `expect:` bound fails there, its bound the mode.
        out.print(tables.cells_table(cells_with_expectations(run, cells), title=f"run {run.run_id}", orders=orders,
                                     limit=None if o.all_cells else tables.TABLE_ROWS, width=out.width))
        for line in spend.run_notes(run):
            out.print(line, markup=False, highlight=False)
    if o.explain:
        # Never wrapped: one line per fact, so a mode's line can be grepped from piped output.
        out.print(render_explanation(tables.explain_run(run, cells=cells)), markup=False, highlight=False,
                  soft_wrap=True)
    if o.heatmap:
        row_axes = [a for a in (o.rows or "commit").split(",") if a]
        col_axes = [a for a in (o.cols or "spec_method").split(",") if a]
        # Counts per cell of the heatmap, aggregated in DuckDB: memory does not grow with the samples.
        counts = analysis.failure_counts(run, [*row_axes, *col_axes], cells=cells_table)
        path = tables.heatmap(counts, row_axes, col_axes, o.heatmap,
                              title=run.run_id, commit_order=order, orders=orders)
        out.print(f"heatmap: {path}")
    if o.html:
        out.print(f"html: {html_report.write(run, o.html)}")


def _warn_damage(run: RunDir, to: Channels) -> None:
    """One warning line per damaged part of a run that a report reads around."""
    for damage in run.scan().damage:
        if damage.group_id:
            to.warn(f"{damage}; its results are left out (`sweep matrix MATRIX --resume {damage.run_id}` "
                    "runs it again)")
        else:
            to.warn(str(damage))
