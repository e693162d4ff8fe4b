"""A triage's reports: one Markdown bug report per failure mode, one HTML page over all of them,
and the summary `sweep report TRIAGE_RUN` prints. Reads the phases' runs; starts nothing.

Each mode's Markdown is `sweeper.reports.bug`'s (vLLM's bug template, the environment, the `vllm
serve` line and the `curl` of a failing request, the log lines, the conjunction with its rates and
aliased alternatives), with the triage's own sections where a plain report lists culprits: since
when (the endpoints), the change that brought it (PR, confidence), a later fix, and what still
fails at bad in the cell bisected.

A mode of an `expect:` bound (a metric outside it at bad) is a perf bug report: the environment, the
`vllm serve` line, the metric at good and bad with intervals, the `vllm bench serve` command of the load
point (all `sweeper.reports.bug`'s), and the metric bisect's verdict: the commit with its PR, before →
after with the effect's 95 % interval and its confidence, or why none was located.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sweeper.judge.expectations import is_expect_mode, with_unit
from sweeper.judge.explain import Explanation, ModeExplanation, explain
from sweeper.reports.bug import issue_markdown
from sweeper.reports.expectations import with_expectations
from sweeper.reports.metric_bisect import cell_lines
from sweeper.reports.tables import run_suite
from sweeper.store import files
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir, open_run
from sweeper.store.triage_record import Mode, TriageRecord

# ---- what the bisect found --------------------------------------------------------------------

def _found(ch: Mapping[str, Any]) -> bool:
    return str(ch.get("found")) in ("True", "true", "1")


def fixed_in_range(summary: Mapping[str, Any] | None, at_bad: set[str]) -> dict[str, dict[str, Any]]:
    """Modes not failing at bad that the bisect found brought and fixed inside the range: mode ->
    the regression (its CHANGE), the first one found per mode."""
    out: dict[str, dict[str, Any]] = {}
    for cell in (summary or {}).get("cells", []):
        for ch in cell.get("changes", []):
            if ch.get("direction") == "regression" and _found(ch) and ch.get("fixed_by") \
                    and ch.get("mode") not in at_bad and ch.get("mode") not in out:
                out[str(ch["mode"])] = dict(ch)
    return out


def _cell_of(summary: Mapping[str, Any] | None, settings_key: str | None) -> dict[str, Any] | None:
    return next((c for c in (summary or {}).get("cells", []) if c.get("settings_key") == settings_key), None)


def brought_by(summary: Mapping[str, Any] | None, mode: str, settings_key: str | None) -> dict[str, Any] | None:
    """The regression that brought `mode`: in the cell bisected for it first, else in any cell."""
    cells = (summary or {}).get("cells", [])
    ordered = sorted(cells, key=lambda c: c.get("settings_key") != settings_key)
    for cell in ordered:
        for row in cell.get("failing_at_bad", []):
            if row.get("mode") == mode and row.get("started"):
                return {**row["started"], "cell_label": cell.get("label")}
    for cell in ordered:
        regressions = [ch for ch in cell.get("changes", []) if ch.get("mode") == mode
                       and ch.get("direction") == "regression" and _found(ch)]
        if regressions:
            return {**regressions[-1], "cell_label": cell.get("label")}
    return None


def fix_of(summary: Mapping[str, Any] | None, regression: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The change that undid `regression` later in the range, if the bisect found one."""
    sha = (regression or {}).get("fixed_by")
    if not sha or regression is None:
        return None
    for cell in (summary or {}).get("cells", []):
        for ch in cell.get("changes", []):
            if ch.get("direction") == "fix" and ch.get("mode") == regression.get("mode") \
                    and (ch.get("commit") or {}).get("sha") == sha:
                return {**ch, "cell_label": cell.get("label")}
    return None


def commit_text(change: Mapping[str, Any]) -> str:
    c = change.get("commit") or {}
    pr = f" (#{c['pr']})" if c.get("pr") and f"#{c['pr']}" not in str(c.get("subject")) else ""
    return f"`{c.get('short')}` {c.get('subject')}{pr}"


def _confidence(change: Mapping[str, Any]) -> str:
    sure = float(change.get("confidence") or 0.0)
    return "> 99.99 %" if sure > 0.9999 else f"{100 * sure:.2f} %"


def _rate(r: Mapping[str, Any] | None) -> str:
    if not r:
        return "?"
    return f"{r.get('failures')}/{r.get('samples')} ({100 * float(r.get('rate') or 0):.1f} %)"


def match_mode(explanation: Explanation, name: str) -> ModeExplanation | None:
    """The explained mode named `name`, else the one sharing the most checks with it."""
    exact = [m for m in explanation.modes if m.mode == name]
    if exact:
        return exact[0]
    want = set(name.split(" + "))
    scored = [(len(want & set(m.mode.split(" + "))), -i, m) for i, m in enumerate(explanation.modes)]
    best = max(scored, default=None, key=lambda s: (s[0], s[1]))
    return best[2] if best is not None and best[0] else None


# ---- the sections a triage adds ---------------------------------------------------------------

def triage_sections(m: ModeExplanation, regression: Mapping[str, Any] | None, fix: Mapping[str, Any] | None,
                    cell: Mapping[str, Any] | None, *, good: str, bad: str, fails_at_bad: bool) -> list[str]:
    out = ["", "**Since when:**"]
    seen = ", ".join(f"`{c}`" for c in m.commits)
    clean = ", ".join(f"`{c}` ({cnt})" for c, cnt in m.clean_commits if cnt.n)
    out.append(f"- seen on {seen}" + (f"; not on {clean}" if clean else "") + f" (the triage swept `{good}` and `{bad}`).")
    if regression:
        out.append(f"- **Brought by** {commit_text(regression)}: {_rate(regression.get('before'))} → "
                   f"{_rate(regression.get('after'))} failing, confidence {_confidence(regression)} "
                   f"(bisected on {regression.get('cell_label')}).")
    else:
        out.append("- Brought by: not located (the bisect found no regression of this mode in the range).")
    if fix:
        out.append(f"- **Fixed by** {commit_text(fix)}: {_rate(fix.get('before'))} → {_rate(fix.get('after'))} "
                   f"failing, confidence {_confidence(fix)}.")
    elif fails_at_bad:
        out.append(f"- Not fixed: it still fails at `{bad}`.")
    if cell:
        rows = cell.get("failing_at_bad") or []
        out += ["", f"**What still fails at `{bad}`** in the cell bisected ({cell.get('label')}):"]
        out += [f"- `{r.get('mode')}`: {_rate(r.get('rate'))}" for r in rows] or ["- nothing: it passes."]
    return out


def metric_regression(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The regression a metric bisect found settled in its (first) cell: the largest one, with the
    question and the cell's label; None when it found none."""
    if not summary:
        return None
    cells = summary.get("cells") or []
    if not cells:
        return None
    found = [ch for ch in cells[0].get("changes", []) if ch.get("kind") == "regression" and ch.get("found")]
    if not found:
        return None
    best = max(found, key=lambda ch: abs(float(ch.get("effect") or 0.0)))
    return {**best, "cell_label": cells[0].get("label"), "question": dict(summary.get("question") or {})}


def _pct(x: Any) -> str:
    return "?" if x is None else f"{100 * float(x):+.1f} %"


def _level(x: Any, unit: str) -> str:
    return "?" if x is None else (f"{float(x):.4g} {unit}".strip() if unit != "%" else f"{float(x):.4g} %")


def metric_sections(m: ModeExplanation, summary: Mapping[str, Any] | None, *, good: str, bad: str) -> list[str]:
    """A metric mode's triage sections: since when, and what the metric bisect found."""
    out = ["", "**Since when:**"]
    seen = ", ".join(f"`{c}`" for c in m.commits)
    out.append(f"- outside the bound on {seen} (the triage swept `{good}` and `{bad}`).")
    if summary is None:
        out.append("- Brought by: not located (the metric bisect did not run: see `sweep report` on the triage).")
        return out
    q = summary.get("question") or {}
    unit = str(q.get("unit") or "")
    cell = (summary.get("cells") or [{}])[0]
    how = (f"metric bisect of `{q.get('metric')}` at `{q.get('load_point')}` on {cell.get('label')}, minimum effect "
           f"{100 * float(q.get('min_effect') or 0):g} %, {summary.get('server_starts', 0)} server starts, "
           f"{len(summary.get('reused_starts') or [])} stored starts of the sweeps reused; run "
           f"`{summary.get('run_id')}`")
    ch = metric_regression(summary)
    if ch is None:
        out.append(f"- Brought by: not located ({how}). It found:")
        out += [f"  - {line}" for line in cell_lines(cell, q)] or ["  - nothing settled."]
        return out
    out.append(f"- **Brought by** {commit_text(ch)}: `{q.get('metric')}` {_level(ch.get('before'), unit)} → "
               f"{_level(ch.get('after'), unit)} ({_pct(ch.get('effect'))}, 95 % interval {_pct(ch.get('effect_low'))} "
               f"to {_pct(ch.get('effect_high'))}), confidence {_confidence(ch)} ({how}).")
    last = str(ch.get("last_before") or "")
    out += ["", "| | commit | `" + str(q.get("metric")) + "` | server starts |", "|---|---|---|---|",
            f"| before | `{last[:10]}` (last good) | {_level(ch.get('before'), unit)} | {ch.get('starts_before')} |",
            (f"| after | `{(ch.get('commit') or {}).get('short')}` (first bad) | {_level(ch.get('after'), unit)} | "
             f"{ch.get('starts_after')} |"),
            f"| change | | {_pct(ch.get('effect'))} [{_pct(ch.get('effect_low'))}, {_pct(ch.get('effect_high'))}] | |"]
    return out


# ---- writing ----------------------------------------------------------------------------------

def explained(runs: Sequence[RunDir], order: Sequence[str], more: tuple[pd.DataFrame, pd.DataFrame] | None = None
              ) -> tuple[Explanation, pd.DataFrame, pd.DataFrame]:
    """The failure modes of these runs' samples taken together (and `more`: samples and cells stored
    elsewhere, as a bisect's at the commit swept), with those samples and cells. Each run's `expect:`
    judgements join its samples: a start outside a bound is a mode like any other."""
    samples = pd.concat([*(with_expectations(r, analysis.load_samples(r)) for r in runs),
                         *([more[0]] if more else [])], ignore_index=True)
    cells = pd.concat([*(analysis.load_cells(r) for r in runs), *([more[1]] if more else [])], ignore_index=True)
    return with_unit(explain(samples, cells, suite=run_suite(runs[0]), commit_order=order)), samples, cells


@dataclass(frozen=True)
class AtCommit:
    """The sweep at the commit that brought a mode fixed inside the range, and the bisect's samples
    and cells there that stand for the servers it did not start again."""

    run: RunDir
    samples: pd.DataFrame | None = None
    cells: pd.DataFrame | None = None

    def more(self) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        return None if self.samples is None or self.cells is None else (self.samples, self.cells)


Explained = tuple[Explanation, pd.DataFrame, pd.DataFrame]


def write_reports(run: RunDir, record: TriageRecord, runs: Sequence[RunDir], at_ends: Explained | None,  # noqa: PLR0913, PLR0917
                  summary: Mapping[str, Any] | None, extra: Mapping[str, AtCommit], chosen: Mapping[str, str], *,
                  good: str, bad: str, runs_dir: str, metric: Mapping[str, Mapping[str, Any]] | None = None
                  ) -> list[Path]:
    """Every mode's Markdown under `reports/`, and `reports/triage.html`; the modes go into `record`.
    `at_ends`: the explanation of `runs` (the sweeps at bad and good) with their samples and cells;
    `metric`: per `expect:` mode, its metric bisect's summary (bisect.json)."""
    record.modes = []
    written: list[Path] = []
    pages: list[tuple[Mode, str]] = []
    if runs and at_ends is not None:
        explanation, samples, cells = at_ends
        keys = {str(c): str(k) for c, k in zip(cells["cell_id"], cells["settings_key"], strict=True)}
        for m in (m for m in explanation.modes if bad in m.commits):
            key = keys.get(chosen.get(m.mode, ""))
            if is_expect_mode(m.mode):
                pages.append(_metric_one(run, runs[0], m, (metric or {}).get(m.mode), (samples, cells, explanation),
                                         good=good, bad=bad, runs_dir=runs_dir))
                continue
            regression = brought_by(summary, m.mode, key)
            pages.append(_one(run, record, runs[0], m, regression, fix_of(summary, regression),
                              _cell_of(summary, key), (samples, cells, explanation), good=good, bad=bad,
                              runs_dir=runs_dir, fails_at_bad=True))
    for mode, at in extra.items():
        at_run = at.run
        explanation, samples, cells = explained([at_run], [], at.more())
        found = match_mode(explanation, mode)
        if found is None:
            continue
        regression = brought_by(summary, mode, None)
        cell = next((c for c in (summary or {}).get("cells", [])
                     if any(ch.get("mode") == mode for ch in c.get("changes", []))), None)
        pages.append(_one(run, record, at_run, found, regression, fix_of(summary, regression), cell,
                          (samples, cells, explanation), good=good, bad=bad, runs_dir=runs_dir, fails_at_bad=False))
    for i, (entry, text) in enumerate(pages, 1):
        rel = f"reports/mode-{i}.md"
        entry.report = rel
        path = _write(run, rel, text)
        if path is not None:
            written.append(path)
        record.modes.append(entry)
    record.html = "reports/triage.html"
    page = render_html(record, [t for _, t in pages])
    path = _write(run, record.html, page)
    if path is not None:
        written.append(path)
    return written


def _write(run: RunDir, rel: str, text: str) -> Path | None:
    if run.local:
        path = run.root / rel
        files.write_text(path, text)
        return path
    run.file(*rel.split("/")).write_atomic(text.encode("utf-8"))
    return None


def _one(run: RunDir, record: TriageRecord, source: RunDir, m: ModeExplanation,  # noqa: PLR0913, PLR0917
         regression: Mapping[str, Any] | None, fix: Mapping[str, Any] | None, cell: Mapping[str, Any] | None,
         data: tuple[pd.DataFrame, pd.DataFrame, Explanation], *, good: str, bad: str, runs_dir: str,
         fails_at_bad: bool) -> tuple[Mode, str]:
    samples, cells, explanation = data
    sections = triage_sections(m, regression, fix, cell, good=good, bad=bad, fails_at_bad=fails_at_bad)
    footer = (f"<sub>Generated by `sweep triage` (run `{run.run_id}`, phase `{source.run_id}`, "
              f"{explanation.n_samples:,} samples); `sweep report {run.run_id}` shows the triage.</sub>")
    text = issue_markdown(source, mode=m.mode, runs_dir=runs_dir, samples=samples, cells=cells,
                          explanation=explanation, sections=sections, footer=footer)

    def commit(ch: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return None if ch is None else {**(ch.get("commit") or {}), "confidence": ch.get("confidence")}

    return Mode(mode=m.mode, conjunction=m.conjunction if m.terms else None, explained_in=source.run_id,
                cell=dict(cell.get("cell") or {}) if cell else None, brought_by=commit(regression),
                fixed_by=commit(fix), fails_at_bad=fails_at_bad), text


def _metric_one(run: RunDir, source: RunDir, m: ModeExplanation, summary: Mapping[str, Any] | None,
                data: tuple[pd.DataFrame, pd.DataFrame, Explanation], *, good: str, bad: str,
                runs_dir: str) -> tuple[Mode, str]:
    """A metric mode's perf bug report and its record entry."""
    samples, cells, explanation = data
    footer = (f"<sub>Generated by `sweep triage` (run `{run.run_id}`, phase `{source.run_id}`"
              + (f", metric bisect `{summary.get('run_id')}`" if summary else "")
              + f"); `sweep report {run.run_id}` shows the triage.</sub>")
    text = issue_markdown(source, mode=m.mode, runs_dir=runs_dir, samples=samples, cells=cells,
                          explanation=explanation, sections=metric_sections(m, summary, good=good, bad=bad),
                          footer=footer)
    ch = metric_regression(summary)
    q = (summary or {}).get("question") or {}
    brought = None if ch is None else {
        **(ch.get("commit") or {}), "confidence": ch.get("confidence"), "metric": q.get("metric"),
        "unit": q.get("unit"), "load_point": q.get("load_point"), "before": ch.get("before"), "after": ch.get("after"),
        "effect": ch.get("effect"), "effect_low": ch.get("effect_low"), "effect_high": ch.get("effect_high"),
        "bisect_run": (summary or {}).get("run_id")}
    cell = ((summary or {}).get("cells") or [{}])[0]
    return Mode(mode=m.mode, conjunction=m.conjunction if m.terms else None, explained_in=source.run_id,
                cell=dict(cell.get("cell") or {}) or None, brought_by=brought, fails_at_bad=True), text


# ---- reading back -----------------------------------------------------------------------------

def _hours(seconds: float | None) -> str:
    return "·" if seconds is None else f"{seconds / 3600:.3f}"


def summary_lines(record: TriageRecord) -> list[str]:
    """What `sweep report TRIAGE_RUN` prints: the range, each phase's cost and reuse, each mode."""
    out = [f"triage {record.run_id}: {record.matrix_path}, {record.good} ({record.good_sha[:10]}) .. "
           f"{record.bad} ({record.bad_sha[:10]}), design {record.design}"
           + (f", budget {record.budget_h:g} GPU-h" if record.budget_h is not None else "")
           + ("" if record.final else " — unfinished: `sweep triage … --resume " + record.run_id + "` continues it")]
    out.append(f"{'phase':<16} {'status':<8} {'starts':>6} {'GPU-h':>8} {'modelled':>9} {'reused':>7}  note")
    for p in record.phases:
        out.append(f"{p.name:<16} {p.status:<8} {p.starts:>6} {_hours(p.gpu_s):>8} {_hours(p.modelled_gpu_s):>9} "
                   f"{p.reused_samples:>7}  {p.note}")
    out.append(f"{'total':<16} {'':<8} {record.starts:>6} {_hours(record.gpu_s):>8}")
    reused = sum(p.reused_samples for p in record.phases)
    if reused:
        out.append(f"reused: {reused:,} stored samples of the sweeps served the bisect at good and bad instead "
                   "of new server starts")
    undone = [p for p in record.phases if p.status == "skipped"]
    if undone:
        out.append("left undone by the budget: " + "; ".join(f"{p.name} ({p.note})" for p in undone))
    if not record.modes:
        out.append("no failure mode to report" if record.final else "no report written yet")
    for i, m in enumerate(record.modes, 1):
        out.append(f"mode {i}: {m.mode}")
        out.append(f"  conjunction: {m.conjunction or 'none found'} (explained on phase {m.explained_in})")
        b, f = m.brought_by, m.fixed_by
        out.append("  brought by: " + (_commit_line(b) if b else "not located"))
        if f:
            out.append("  fixed by: " + _commit_line(f))
        out.append(f"  at {record.bad}: " + ("still fails" if m.fails_at_bad else "passes"))
        out.append(f"  report: {m.report}")
    if record.html:
        out.append(f"html: {record.html}")
    return out


def _commit_line(c: Mapping[str, Any]) -> str:
    size = ""
    if c.get("metric"):
        unit = str(c.get("unit") or "")
        size = (f": {c['metric']} {_level(c.get('before'), unit)} → {_level(c.get('after'), unit)} "
                f"({_pct(c.get('effect'))} [{_pct(c.get('effect_low'))}, {_pct(c.get('effect_high'))}])")
    return f"{commit_text({'commit': c})}{size}, confidence {_confidence(c)}"


def render_html(record: TriageRecord, texts: Sequence[str]) -> str:
    """One self-contained page: the triage summary, then every mode's report."""
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>triage {esc(record.run_id)}</title>",
             ("<style>body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem}"
             "pre{background:#f6f8fa;padding:1rem;overflow-x:auto;white-space:pre-wrap}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem}</style>"),
             "</head><body>", f"<h1>Triage {esc(record.run_id)}</h1>",
             f"<p>{esc(record.matrix_path)}: {esc(record.good)} .. {esc(record.bad)}, design {esc(record.design)}</p>",
             ("<h2>Phases</h2><table><tr><th>phase</th><th>status</th><th>server starts</th><th>GPU-h</th>"
             "<th>modelled GPU-h</th><th>reused samples</th><th>note</th></tr>")]
    for p in record.phases:
        parts.append(f"<tr><td>{esc(p.name)}</td><td>{esc(p.status)}</td><td>{p.starts}</td>"
                     f"<td>{_hours(p.gpu_s)}</td><td>{_hours(p.modelled_gpu_s)}</td><td>{p.reused_samples}</td>"
                     f"<td>{esc(p.note)}</td></tr>")
    parts.append("</table><h2>Failure modes</h2><table><tr><th>#</th><th>mode</th><th>conjunction</th>"
                 "<th>brought by</th><th>fixed by</th><th>at bad</th></tr>")
    for i, m in enumerate(record.modes, 1):
        b = _commit_line(m.brought_by) if m.brought_by else "not located"
        f = _commit_line(m.fixed_by) if m.fixed_by else ""
        parts.append(f"<tr><td><a href='#mode-{i}'>{i}</a></td><td>{esc(m.mode)}</td>"
                     f"<td>{esc(m.conjunction or '')}</td><td>{esc(b)}</td><td>{esc(f)}</td>"
                     f"<td>{'fails' if m.fails_at_bad else 'passes'}</td></tr>")
    parts.append("</table>")
    for i, text in enumerate(texts, 1):
        parts.append(f"<h2 id='mode-{i}'>Mode {i}</h2><pre>{esc(text)}</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def load(runs_dir: str | Path, run_id: str) -> TriageRecord | None:
    """The triage record of run `run_id`, or None when it is not a triage run."""
    from sweeper.store.triage_record import RECORD, from_json

    run = open_run(runs_dir, run_id, create=False)
    data = run.read_json(RECORD)
    return None if data is None else from_json(data, f"{run.uri}/{RECORD}")
