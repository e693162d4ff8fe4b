"""`sweep report RUN --html FILE`: one self-contained HTML page for a run (reads results only).

Everything is inline (CSS, SVG, a few lines of JS) and nothing is fetched: the file can be mailed,
attached to an issue or opened offline. It holds the run summary and environment fingerprints, the
explanation of every failure mode (`sweeper.judge.explain`), a heatmap per mode (commits in history order,
one column per combination of the other axes), the serving metrics where the run measured them
(`sweeper.reports.metrics.html_section`), a drill-down per cell (requested vs effective
configuration, spec-decode figures, failing responses with their server log lines) and, for a bisect
run, every change with the evidence along the range and the probe timeline. A server start outside an
`expect:` bound is a failure of its bound's mode in every one of these sections. Secret settings are
scrubbed as in the bug report (`sweeper.reports.bug.Redactor`).
"""

from __future__ import annotations

import html
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sweeper.judge.expectations import is_evidence, is_expect_mode
from sweeper.judge.explain import (
    Classified,
    Explanation,
    Verdict,
    classify,
    display_axis,
    value_text,
)
from sweeper.judge.stats import wilson
from sweeper.reports import expectations as expect_report
from sweeper.reports import metrics as metrics_report
from sweeper.reports.bug import REDACTED, Redactor, log_lines
from sweeper.reports.explain_text import describe
from sweeper.spec.status import Status
from sweeper.store import files
from sweeper.store import frames as analysis
from sweeper.store.manifest import SWEEPER_VERSION as __version__
from sweeper.store.manifest import BisectManifest, Manifest, SweepManifest
from sweeper.store.run_folder import RunDir

CELL_W, CELL_H, CHAR_W, LINE_H = 96, 34, 7.2, 15
MAX_EXAMPLES = 3


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _axes(row: Mapping[str, Any]) -> dict[str, Any]:
    raw = row.get("axes")
    pairs = raw.items() if isinstance(raw, dict) else (raw if raw is not None else [])
    return {str(k): json.loads(v) for k, v in pairs}


def color(rate: float | None) -> str:
    """White through orange to dark red (matplotlib's "Reds", in a few stops)."""
    if rate is None:
        return "#e5e5e5"
    stops = [(0.0, (255, 245, 240)), (0.25, (252, 146, 114)), (0.5, (239, 59, 44)), (1.0, (103, 0, 13))]
    for (x0, c0), (x1, c1) in itertools.pairwise(stops):
        if rate <= x1:
            t = (rate - x0) / (x1 - x0)
            return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(c0, c1, strict=True))
    return "#67000d"


@dataclass
class _Run:
    run: RunDir
    manifest: Manifest | None  # None: damaged (the page shows what the results hold)
    samples: pd.DataFrame
    cells: pd.DataFrame
    order: list[str]
    classified: Classified
    explanation: Explanation
    axes: list[str]  # the axes that vary between cells, the commit aside
    orders: dict[str, list[str]] = field(default_factory=dict)  # each axis's values in the matrix's order
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)  # the metrics table (empty without a bench)

    def commit_label(self, commit: str) -> str:
        return commit[:10] if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit) else commit


def load(run: RunDir) -> _Run:
    from sweeper.reports import tables as report

    manifest = run.manifest_or_none()
    metrics = metrics_report.load(run)
    # A start outside an `expect:` bound is a failure like a request's: its evidence joins the samples
    # every section classifies, and each cell's counts (`sweeper.judge.expectations`).
    found = expect_report.expectation_evidence(run, metrics)
    samples = expect_report.with_expectations(run, analysis.load_samples(run), found).reset_index(drop=True)
    cells = expect_report.cells_with_expectations(run, analysis.load_cells(run), found)
    suite = report.run_suite(run)
    orders = report.run_orders(run, cells)
    order = orders["commit"]
    explanation = report.explain_run(run, samples, cells)
    classified = classify(samples, suite) if not samples.empty else Classified([], {})
    axes = [a for a in report.varying_axes(cells) if a != "commit"] if not cells.empty else []
    return _Run(run, manifest, samples, cells, order, classified, explanation, axes, orders, metrics)


# ---- sections -------------------------------------------------------------------------------------

def _summary(r: _Run) -> str:
    m = r.manifest
    matrix = m.matrix if m else {}
    statuses = r.cells["status"].value_counts().to_dict() if not r.cells.empty else {}
    judged = is_evidence(r.samples)
    requests = r.samples[~judged]
    failed = int((~requests["passed"].astype(bool)).sum()) if not requests.empty else 0
    broke = int((~r.samples.loc[judged, "passed"].astype(bool)).sum()) if judged.any() else 0
    suite = m.suite if isinstance(m, SweepManifest) else None
    rows = [("run", r.run.run_id), ("kind", m.kind if m else None), ("created", m.created if m else None),
            ("matrix", f"{matrix.get('name') or ''} ({m.matrix_path if m else None})"),
            ("description", matrix.get("description")), ("model", matrix.get("model")),
            ("suite", suite or matrix.get("suite")),
            ("cells", f"{len(r.cells):,} — " + ", ".join(f"{v} {k}" for k, v in sorted(statuses.items()))),
            ("samples", f"{len(requests):,}, {failed:,} failing"),
            ("expect: bounds", f"{int(judged.sum()):,} server starts × load points judged, {broke:,} outside"
             if judged.any() else None),
            ("sweeper", m.sweeper if m else None)]
    if isinstance(m, BisectManifest):
        rows.insert(2, ("range", (f"{m.good} ({str(m.good_sha)[:10]}) .. {m.bad} "
                                 f"({str(m.bad_sha)[:10]}), {len(m.commits or ()) - 1} commits")))
    commits = m.commits if isinstance(m, SweepManifest) else None
    if commits is not None:
        rows.append(("commits", ", ".join(f"{c} = {str(commits.get(c) or '?')[:12]}" for c in r.order if c in commits)))
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows if v not in (None, ""))
    return f'<section id="summary"><h2>Run</h2><table class="kv">{body}</table></section>'


_FINGER = ("vllm_version", "torch_version", "cuda_version", "gpu_name", "gpu_driver", "cpu_model", "hostname")


def _fingerprint(r: _Run) -> str:
    if r.cells.empty:
        return ""
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    rank = {c: i for i, c in enumerate(r.order)}
    for row in r.cells.to_dict("records"):
        key = tuple(_text(row.get(k)) or "unknown" for k in _FINGER)
        commit = r.commit_label(str(row.get("commit")))
        if commit not in groups[key]:
            groups[key].append(commit)
    head = "".join(f"<th>{esc(k.replace('_', ' '))}</th>" for k in _FINGER) + "<th>commits</th>"
    rows = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in key)
                   + f"<td>{esc(', '.join(sorted(cs, key=lambda c: rank.get(c, len(rank)))))}</td></tr>"
                   for key, cs in groups.items())
    return (f'<section id="environment"><h2>Environment fingerprint</h2>'
            f'<table class="grid"><tr>{head}</tr>{rows}</table></section>')


def _explanation(r: _Run) -> str:
    e = r.explanation
    if not e.modes:
        return '<section id="explanation"><h2>Explanation</h2><p class="ok">No failures: nothing to explain.</p></section>'
    parts = []
    for i, m in enumerate(e.modes, 1):
        badge = {Verdict.EXPLAINED: "ok", Verdict.NOT_IDENTIFIABLE: "warn", Verdict.EVERYWHERE: "warn"}.get(m.verdict, "bad")
        lines = describe(m)[1:]
        parts.append(f'<div class="mode" id="mode-{i}"><h3><span class="n">mode {i}</span> {esc(m.mode)} '
                     f'<span class="badge {badge}">{esc(m.verdict.value)}</span></h3>'
                     f'<p class="conj">{esc(m.conjunction if m.terms or m.verdict is Verdict.EVERYWHERE else "no conjunction")}</p>'
                     + "".join(f'<p class="line">{esc(x.strip())}</p>' for x in lines) + "</div>")
    note = "" if e.labels_from_suite else '<p class="warn">The run\'s suite files are gone or changed: checks are told apart by name only.</p>'
    return (f'<section id="explanation"><h2>Explanation</h2><p class="muted">The smallest conjunction of at most '
            f'{e.max_terms} axis values behind each failure mode (the modes bisect uses), tested with Fisher\'s exact '
            f'test and Holm-corrected over the conjunctions tried (α = {e.alpha}).</p>{note}{"".join(parts)}</section>')


def _columns(r: _Run) -> list[tuple[str, ...]]:
    keys = []
    for row in r.cells.to_dict("records"):
        axes = _axes(row)
        key = tuple(value_text(axes.get(a)) or "·" for a in r.axes)
        if key not in keys:
            keys.append(key)
    # Each axis's values in the matrix's order (as the terminal table and the PNG have them).
    # (The table shows a boolean as True, a term as true: either finds its place.)
    ranks = [{w: i for i, v in enumerate(r.orders.get(a, ())) for w in (v, v.lower())} for a in r.axes]
    return sorted(keys, key=lambda k: tuple((rank.get(v, len(rank)), v) for rank, v in zip(ranks, k, strict=True)))


def _grid(r: _Run) -> tuple[list[str], list[tuple[str, ...]], dict[tuple[str, tuple[str, ...]], dict[str, Any]]]:
    rank = {c: i for i, c in enumerate(r.order)}
    commits = sorted(dict.fromkeys(r.cells["commit"].astype(str)), key=lambda c: (rank.get(c, len(rank)), c))
    where: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
    for row in r.cells.to_dict("records"):
        axes = _axes(row)
        key = tuple(value_text(axes.get(a)) or "·" for a in r.axes)
        where[(str(row["commit"]), key)] = row
    return commits, _columns(r), where


def heatmap_svg(r: _Run, title: str, counts: Mapping[str, tuple[int, int]], mode_id: str) -> str:
    """Rows: commits in history order; columns: the other axes; colour: this mode's failure rate."""
    commits, columns, where = _grid(r)
    col_lines = [[f"{display_axis(a)}={v}" for a, v in zip(r.axes, key, strict=True)] or ["(all)"] for key in columns]
    col_w = max(CELL_W, int(max((len(x) for ls in col_lines for x in ls), default=6) * CHAR_W) + 12)
    labels = [r.commit_label(c) for c in commits]
    left = int(max((len(x) for x in labels), default=6) * CHAR_W) + 20
    top = LINE_H * max(1, len(r.axes)) + 16
    width, height = left + col_w * len(columns) + 10, top + CELL_H * len(commits) + 8
    out = [(f'<svg class="heatmap" data-mode="{esc(mode_id)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">')]
    for j, lines in enumerate(col_lines):
        x = left + col_w * j + col_w / 2
        for i, line in enumerate(lines):
            out.append(f'<text class="col" x="{x:.0f}" y="{12 + LINE_H * i}" text-anchor="middle">{esc(line)}</text>')
    for i, (commit, label) in enumerate(zip(commits, labels, strict=True)):
        y = top + CELL_H * i
        out.append(f'<text class="row" x="{left - 8}" y="{y + CELL_H / 2 + 4:.0f}" text-anchor="end">'
                   f'<title>{esc(commit)}</title>{esc(label)}</text>')
        for j, key in enumerate(columns):
            row = where.get((commit, key))
            x = left + col_w * j
            if row is None:
                out.append(f'<rect x="{x}" y="{y}" width="{col_w - 2}" height="{CELL_H - 2}" class="none"/>')
                continue
            cid = str(row["cell_id"])
            k, n = counts.get(cid, (0, 0))
            status = str(row.get("status"))
            raw = row.get("effective_differs")
            differs = [str(d) for d in raw] if raw is not None else []
            rate = k / n if n else None
            fill = color(rate) if status == Status.OK or n else "#d9d2e9"
            ink = "#fff" if rate is not None and rate > 0.45 else "#222"
            text = (f"{k}/{n}" if n else status) + (" *" if differs else "")
            ran = f"; ran another {', '.join(differs)} than requested" if differs else ""
            tip = f"{commit} · {' · '.join(col_lines[j])}: {k}/{n} failing ({status}){ran}"
            out.append(f'<a href="#cell-{esc(cid)}"><rect x="{x}" y="{y}" width="{col_w - 2}" height="{CELL_H - 2}" '
                       f'fill="{fill}" data-cell="{esc(cid)}"><title>{esc(tip)}</title></rect>'
                       f'<text x="{x + col_w / 2 - 1:.0f}" y="{y + CELL_H / 2 + 4:.0f}" text-anchor="middle" '
                       f'fill="{ink}" class="val">{esc(text)}</text></a>')
    out.append("</svg>")
    return "".join(out)


def _mode_counts(r: _Run, mode: str | None) -> dict[str, tuple[int, int]]:
    """Per cell: (failures of `mode`, samples of the cases that can show it); every failure for None."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    cases = r.classified.cases.get(mode or "", set())
    for i, row in enumerate(r.samples[["cell_id", "case_id", "passed"]].itertuples(index=False)):
        if mode is not None and str(row.case_id) not in cases:
            continue
        c = out[str(row.cell_id)]
        c[1] += 1
        c[0] += int(not row.passed) if mode is None else int(r.classified.mode[i] == mode)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _heatmaps(r: _Run) -> str:
    if r.cells.empty:
        return ""
    parts = [('<section id="heatmaps"><h2>Heatmaps</h2><p class="muted">Rows: commits, oldest first; columns: '
             'the other axes as requested (* : the cell ran another configuration than requested). Each mode counts '
             'the samples of the cases that can show it. Click a cell for its drill-down.</p>')]
    for i, m in enumerate(r.explanation.modes, 1):
        parts.append(f'<figure><figcaption>mode {i}: {esc(m.mode)} — {esc(m.conjunction)}</figcaption>'
                     f'{heatmap_svg(r, m.mode, _mode_counts(r, m.mode), f"mode-{i}")}</figure>')
    parts.append(f'<figure><figcaption>every failure</figcaption>'
                 f'{heatmap_svg(r, "every failure", _mode_counts(r, None), "all")}</figure></section>')
    return "".join(parts)


# (shown as, the axis that asks for it, the effective column, its name in `effective_differs`)
_REQ_EFF = (("spec_method", "spec_method", "effective_spec_method", "spec_method"),
            ("num_speculative_tokens", "num_speculative_tokens", "effective_num_speculative_tokens",
             "num_speculative_tokens"),
            ("async_scheduling", "async_scheduling", "effective_async_scheduling", "async_scheduling"),
            ("attention_backend", "attention_backend", "effective_attention_backend", "attention_backend"),
            ("model runner", "env.VLLM_USE_V2_MODEL_RUNNER", "effective_model_runner", "model_runner"),
            ("structured outputs backend", None, "effective_structured_backend", "structured_outputs_backend"))
_SPEC = (("drafts", "spec_drafts"), ("draft tokens", "spec_draft_tokens"), ("accepted tokens", "spec_accepted_tokens"),
         ("acceptance rate", "spec_acceptance_rate"), ("mean acceptance length", "spec_mean_acceptance_length"),
         ("TTFT p50 (s)", "ttft_p50_s"), ("latency p50 (s)", "latency_p50_s"), ("startup (s)", "startup_s"))


def _fmt(value: Any) -> str:
    f = _num(value)
    if f is None:
        return _text(value) or "—"
    return f"{f:.3g}" if not float(f).is_integer() else str(int(f))


def _cell(r: _Run, row: Mapping[str, Any], samples: pd.DataFrame, modes: Sequence[str | None]) -> str:
    cid = str(row["cell_id"])
    axes = _axes(row)
    n, k = int(row.get("n_samples") or 0), int(row.get("n_failed") or 0)
    low, high = wilson(k, n) if n else (0.0, 0.0)
    raw = row.get("effective_differs")
    differs = [str(x) for x in raw] if raw is not None else []
    label = " · ".join(f"{display_axis(a)}={value_text(v)}" for a, v in axes.items())
    rate = f"{k}/{n} failing ({100 * k / n:.1f} %, 95 % CI {100 * low:.0f}–{100 * high:.0f} %)" if n else "no samples"
    flags = (' <span class="badge warn">requested ≠ effective: ' + esc(", ".join(differs)) + "</span>") if differs else ""
    status = str(row.get("status"))
    head = (f'<summary><span class="st {esc(status)}">{esc(status)}</span> {esc(label)} — {esc(rate)}{flags}</summary>')
    req_rows = []
    for name, axis, col, diff_name in _REQ_EFF:
        asked = value_text(axes.get(axis)) if axis else None
        ran = _fmt(row.get(col)) if _text(row.get(col)) else ""
        mark = ' class="differs"' if diff_name in differs else ""
        req_rows.append(f"<tr{mark}><th>{esc(name)}</th><td>{esc(asked or '(default)')}</td><td>{esc(ran or '?')}</td></tr>")
    config = ('<table class="grid"><tr><th></th><th>requested</th><th>effective</th></tr>' + "".join(req_rows) + "</table>")
    spec = '<table class="kv">' + "".join(f"<tr><th>{esc(a)}</th><td>{esc(_fmt(row.get(c)))}</td></tr>" for a, c in _SPEC) \
        + "</table>"
    body = [f'<div class="cols"><div><h4>Configuration</h4>{config}</div><div><h4>Spec decode (server group) and timing</h4>{spec}</div></div>']
    if status != Status.OK or _text(row.get("status_detail")):
        body.append(f'<h4>Status</h4><p>{esc(row.get("status_detail"))}</p>')
        if _text(row.get("log_tail")):
            body.append(f'<pre class="log">{esc(row.get("log_tail"))}</pre>')
    failing = samples[~samples["passed"].astype(bool)] if not samples.empty else samples
    if not failing.empty:
        picked, seen_modes = [], set()
        for idx, srow in failing.iterrows():
            mode = modes[idx]
            if mode not in seen_modes:
                seen_modes.add(mode)
                picked.append((idx, srow))
        for idx, srow in failing.iterrows():
            if len(picked) >= MAX_EXAMPLES:
                break
            if all(idx != p for p, _ in picked):
                picked.append((idx, srow))
        body.append(f"<h4>Failing responses ({len(failing)} of {len(samples)})</h4>")
        for idx, s in picked[:MAX_EXAMPLES]:
            body.append(_example(r, s.to_dict(), modes[idx]))
    classes = "cell" + (" failing" if k else "") + (" differs" if differs else "")
    return f'<details class="{classes}" id="cell-{esc(cid)}">{head}{"".join(body)}</details>'


def _example(r: _Run, s: Mapping[str, Any], mode: str | None) -> str:
    details = s.get("check_details")
    pairs = details.items() if isinstance(details, dict) else (details if details is not None else [])
    checks = "".join(f"<li><code>{esc(name)}</code>: {esc(d)}</li>" for name, d in pairs)
    if mode is not None and is_expect_mode(mode):
        # A server start measured outside a bound: no request, no response; the figure is the evidence.
        return (f'<div class="example"><p><b>{esc(s.get("case_id"))}</b> · server start {esc(s.get("repeat"))}</p>'
                f'<p>mode: <code>{esc(mode)}</code></p><ul>{checks}</ul>'
                '<p class="muted">The serving metrics section has every configuration\'s figures.</p></div>')
    lines = log_lines(r.run, str(s.get("group_id")), str(s.get("cell_id")), str(s.get("request_id")))
    tail = _text(s.get("content_tail"))
    err = _text(s.get("error"))
    return (f'<div class="example"><p><b>{esc(s.get("case_id"))}</b> repeat {esc(s.get("repeat"))} · request id '
            f'<code>{esc(s.get("request_id"))}</code> · HTTP {esc(s.get("http_status"))} · finish_reason '
            f'<code>{esc(s.get("finish_reason"))}</code> · {esc(_fmt(s.get("completion_tokens")))} completion / '
            f'{esc(_fmt(s.get("reasoning_tokens")))} reasoning tokens</p>'
            f'<p>mode: <code>{esc(mode)}</code></p><ul>{checks}</ul>'
            + (f"<p>error: {esc(err)}</p>" if err else "")
            + f'<p>content tail:</p><pre class="tail">{esc(repr(tail) if tail else "(no content)")}</pre>'
            + (f'<p>server log lines of this request:</p><pre class="log">{esc(chr(10).join(lines))}</pre>' if lines else "")
            + "</div>")


def _cells(r: _Run) -> str:
    if r.cells.empty:
        return ""
    from sweeper.reports import tables as report

    # The terminal table's order: failing cells first, then history order and the matrix's order.
    rows = report.in_order(r.cells, r.orders, ["commit", *r.axes] if "commit" in r.cells.columns else r.axes)
    by_cell = {str(c): g for c, g in r.samples.groupby("cell_id", sort=False)} if not r.samples.empty else {}
    parts = [('<section id="cells"><h2>Cells</h2><label class="muted"><input type="checkbox" id="only-failing"> '
             'only cells with failures or another effective configuration</label>')]
    for row in rows.to_dict("records"):
        parts.append(_cell(r, row, by_cell.get(str(row["cell_id"]), r.samples.iloc[0:0]), r.classified.mode))
    return "".join(parts) + "</section>"


# ---- bisect ---------------------------------------------------------------------------------------

def _bisect(r: _Run) -> str:
    if not r.run.file("bisect.json").exists():
        return ""
    summary = r.run.read_json("bisect.json")
    if not isinstance(summary, dict):
        return '<section id="bisect"><h2>Bisect</h2><p class="bad">bisect.json unreadable</p></section>'
    commits = list(r.manifest.commits or ()) if isinstance(r.manifest, BisectManifest) else []
    position = {c: i for i, c in enumerate(commits)}
    probes = analysis.load_table(r.run, "probes").to_pandas()
    parts = [(f'<section id="bisect"><h2>Bisect</h2><p class="muted">{len(commits) - 1} commits after good; '
             f'{esc(summary.get("server_starts"))} server starts in {esc(summary.get("rounds"))} rounds, '
             f'{esc(summary.get("reused_samples"))} stored samples reused. Per change: bars, the mode\'s failure '
             f'rate at each commit this bisect probed; yellow band, the candidates; red line, the change; blue line, '
             f'the posterior over the range where the bisect stored one.</p>')]
    for cell in summary.get("cells", []):
        mine = probes[probes["settings_key"] == cell.get("settings_key")] if not probes.empty else probes
        parts.append(f'<h3>{esc(cell.get("label"))}</h3><p>bad endpoint: {esc(cell.get("bad_endpoint"))}; '
                     f'{esc(cell.get("probes"))} probes, {esc(cell.get("samples"))} samples</p>')
        for ch in cell.get("changes", []):
            parts.append(_change(ch, mine, commits, position))
        parts.append('<h4>Probe timeline</h4><p class="muted">Left to right: the range, good to bad; top to bottom: '
                     'probes in the order they ran, by round; colour: failure rate of the probe.</p>'
                     + _timeline(mine, commits))
    return "".join(parts) + "</section>"


def _observed(probes: pd.DataFrame, mode: str | None) -> dict[int, tuple[int, int]]:
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for row in probes.to_dict("records"):
        pos = int(row["position"])
        out[pos][1] += int(row.get("n_samples") or 0)
        failures = dict(row.get("mode_failures") or [])
        out[pos][0] += int(failures.get(mode, 0)) if mode is not None else int(row.get("n_failed") or 0)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _change(ch: Mapping[str, Any], probes: pd.DataFrame, commits: Sequence[str], position: Mapping[str, int]) -> str:
    n = max(1, len(commits))
    step = max(8, min(40, 720 // n))
    width, height, base = 40 + step * n, 120, 96
    seen = _observed(probes, ch.get("mode"))
    out = [f'<svg class="range" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    candidates = [position[c["sha"]] for c in ch.get("candidates", []) if c.get("sha") in position]
    if candidates:
        lo, hi = min(candidates), max(candidates)
        out.append(f'<rect x="{20 + step * lo}" y="8" width="{step * (hi - lo + 1)}" height="{base - 8}" class="cand">'
                   f'<title>candidates ({len(candidates)})</title></rect>')
    posterior = ch.get("posterior")
    if isinstance(posterior, list) and posterior:
        # A per-commit posterior, where the bisect stores one.
        pts = " ".join(f"{20 + step * i + step / 2:.0f},{base - 80 * float(p):.1f}" for i, p in enumerate(posterior))
        out.append(f'<polyline points="{pts}" class="post"/>')
    for pos, (k, m) in sorted(seen.items()):
        rate = k / m if m else 0
        h = max(2, 80 * rate)
        out.append(f'<rect x="{20 + step * pos + 1}" y="{base - h:.1f}" width="{step - 2}" height="{h:.1f}" '
                   f'fill="{color(max(rate, 0.08))}"><title>{esc(commits[pos][:10])}: {k}/{m} failing</title></rect>')
    at = position.get(str((ch.get("commit") or {}).get("sha")))
    if at is not None:
        out.append(f'<line x1="{20 + step * at}" x2="{20 + step * at}" y1="4" y2="{base + 4}" class="mark"/>')
    out.append(f'<line x1="20" x2="{20 + step * n}" y1="{base}" y2="{base}" class="axis"/>'
               f'<text x="20" y="{base + 16}" class="small">good {esc(commits[0][:10] if commits else "")}</text>'
               f'<text x="{20 + step * n}" y="{base + 16}" text-anchor="end" class="small">bad '
               f'{esc(commits[-1][:10] if commits else "")}</text></svg>')
    c = ch.get("commit") or {}
    before, after = ch.get("before") or {}, ch.get("after") or {}
    sure = float(ch.get("confidence") or 0)
    where = f"{c.get('short')} {c.get('subject')}" if ch.get("located") else \
        f"somewhere in {ch.get('n_candidates')} commits"
    return (f'<div class="change"><p><span class="badge {"bad" if ch.get("direction") == "regression" else "ok"}">'
            f'{esc(ch.get("direction"))}</span> <b>{esc(where)}</b> — <code>{esc(ch.get("mode"))}</code>: '
            f'{esc(before.get("failures"))}/{esc(before.get("samples"))} → {esc(after.get("failures"))}/'
            f'{esc(after.get("samples"))} failing; confidence {"> 99.99" if sure > 0.9999 else f"{100 * sure:.2f}"} %</p>'
            + "".join(out) + "</div>")


def _timeline(probes: pd.DataFrame, commits: Sequence[str]) -> str:
    if probes.empty:
        return "<p>no probes</p>"
    rows = probes.sort_values(["probe", "position"]).to_dict("records")
    n = max(1, len(commits))
    step = max(8, min(40, 720 // n))
    width, height = 60 + step * n, 20 + 16 * (max(int(r["probe"]) for r in rows) + 1)
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    last_round = None
    for row in rows:
        y = 12 + 16 * int(row["probe"])
        if row["round"] != last_round:
            out.append(f'<line x1="40" x2="{width}" y1="{y - 8}" y2="{y - 8}" class="round"/>'
                       f'<text x="2" y="{y + 4}" class="small">r{esc(row["round"])}</text>')
            last_round = row["round"]
        m = int(row.get("n_samples") or 0)
        k = int(row.get("n_failed") or 0)
        x = 40 + step * int(row["position"]) + step / 2
        tip = (f"probe {row['probe']} round {row['round']}: {str(row['commit_sha'])[:10]} (position {row['position']}) "
               f"{row['status']}, {k}/{m} failing" + (" (reused)" if row.get("reused") else ""))
        out.append(f'<circle cx="{x:.0f}" cy="{y}" r="6" fill="{color(k / m if m else None)}" class="probe">'
                   f"<title>{esc(tip)}</title></circle>")
    out.append("</svg>")
    return "".join(out)


# ---- the page -------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#22223b;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header nav a{color:#c9c9ff;margin-right:14px}main{padding:8px 24px 40px;max-width:1500px}
h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:28px}h3{margin:16px 0 4px}h4{margin:10px 0 4px}
table{border-collapse:collapse;margin:4px 0}th,td{padding:3px 8px;text-align:left;vertical-align:top}
table.grid th,table.grid td{border:1px solid #ddd}table.kv th{color:#555;font-weight:600;padding-right:14px}
tr.differs td{background:#fff3cd;font-weight:600}.muted{color:#666}.warn{color:#8a5a00}.bad{color:#a40000}
.mode{background:#fff;border:1px solid #e3e3e3;border-left:5px solid #c00;border-radius:4px;padding:8px 14px;margin:10px 0}
.mode .conj{font-size:17px;font-weight:600;margin:4px 0}.mode .line{margin:2px 0;font-family:ui-monospace,monospace;font-size:12.5px}
.mode .n{color:#888;font-weight:400;font-size:13px}
.badge{display:inline-block;border-radius:9px;padding:0 8px;font-size:12px;font-weight:600}
.badge.ok{background:#d4edda;color:#155724}.badge.warn{background:#fff3cd;color:#8a5a00}.badge.bad{background:#f8d7da;color:#721c24}
figure{margin:12px 0;background:#fff;border:1px solid #e3e3e3;border-radius:4px;padding:8px;overflow-x:auto}
figcaption{font-weight:600;margin-bottom:6px}svg text{font:12px ui-monospace,monospace}svg text.val{font-size:11.5px}
svg rect.none{fill:#f3f3f3}svg a rect:hover{stroke:#000;stroke-width:2}
svg .cand{fill:#ffe9a8;opacity:.7}svg .mark{stroke:#a40000;stroke-width:2}svg .axis{stroke:#888}
svg .post{fill:none;stroke:#3b5bdb;stroke-width:2}svg .round{stroke:#eee}svg .small{font-size:10.5px;fill:#555}
details.cell{background:#fff;border:1px solid #e3e3e3;border-radius:4px;margin:4px 0;padding:4px 10px}
details.cell.failing{border-left:4px solid #c00}details.cell summary{cursor:pointer}
.st{font-weight:700}.st.ok{color:#155724}.st.crashed,.st.timeout,.st.server_failed,.st.install_failed{color:#a40000}
.cols{display:flex;gap:28px;flex-wrap:wrap}.example{border-top:1px dashed #ddd;padding-top:6px;margin-top:6px}
pre{background:#f6f6f6;border:1px solid #e6e6e6;padding:6px 8px;white-space:pre-wrap;word-break:break-all;font-size:12px;max-height:320px;overflow:auto}
.change{margin:8px 0}body.only-failing details.cell:not(.failing):not(.differs){display:none}
"""

_JS = """
function openHash(){var id=decodeURIComponent(location.hash.slice(1));var el=id&&document.getElementById(id);
if(el&&el.tagName==='DETAILS'){el.open=true;el.scrollIntoView({block:'start'});}}
window.addEventListener('hashchange',openHash);document.addEventListener('DOMContentLoaded',function(){openHash();
var box=document.getElementById('only-failing');if(box){box.addEventListener('change',function(){
document.body.classList.toggle('only-failing',box.checked);});}});
"""


def render(run: RunDir) -> str:
    """The whole page as one string."""
    r = load(run)
    redact = Redactor(r.manifest.matrix if r.manifest else None)
    sections = [_summary(r), _fingerprint(r), _explanation(r), _heatmaps(r), metrics_report.html_section(r.metrics),
                _bisect(r), _cells(r)]
    nav = "".join(f'<a href="#{s}">{s}</a>' for s in ("summary", "environment", "explanation", "heatmaps", "metrics",
                                                       "bisect", "cells")
                  if any(f'id="{s}"' in x for x in sections))
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
            f'script-src \'unsafe-inline\'; img-src data:">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>sweep report {esc(run.run_id)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>sweep report · {esc(run.run_id)}</h1><nav>{nav}</nav></header><main>"
            + "".join(sections)
            + f'<p class="muted">Written by sweeper {esc(__version__)}; self-contained: it needs no network.</p>'
            f"</main><script>{_JS}</script></body></html>\n")
    # Scrubbed last, over everything the page shows (escaped, so it reads as text, not a tag).
    return redact.text(page, html.escape(REDACTED))


def write(run: RunDir, path: Path) -> Path:
    path = Path(path)
    files.write_text(path, render(run))
    return path
