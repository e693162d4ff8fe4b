"""Failure-rate tables and heatmaps from stored results (reads results only)."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sweeper.errors import SweepError, one_line
from sweeper.judge.stats import wilson
from sweeper.spec.matrix import resolve_path
from sweeper.spec.status import Status
from sweeper.store.env_record import EnvInfo
from sweeper.store.manifest import BisectManifest, SweepManifest
from sweeper.store.run_folder import RunDir

if TYPE_CHECKING:
    from sweeper.judge.explain import Explanation
    from sweeper.spec.suite import Suite

CORE_COLUMNS = ("commit", "spec_method", "num_speculative_tokens", "async_scheduling", "attention_backend")


def varying_axes(cells: pd.DataFrame) -> list[str]:
    """Axis columns whose value differs between cells (constant ones add nothing to a table)."""
    return [name for name in _axis_names(cells) if cells[name].astype(str).nunique(dropna=False) > 1]


def fixed_axes(cells: pd.DataFrame) -> list[tuple[str, str]]:
    """(axis, value) of the axes that hold one value in every cell that has it (an axis that does
    not apply to some cells, such as `num_speculative_tokens` without a spec method, included): said
    once above a table instead of taking a column."""
    out = []
    for name in _axis_names(cells):
        values = cells[name].dropna()
        if len(values) and values.astype(str).nunique() == 1:
            out.append((name, _fmt(values.iloc[0])))
    return out


def _axis_names(cells: pd.DataFrame) -> list[str]:
    names = dict.fromkeys([*CORE_COLUMNS, *(k for m in cells.get("axes", []) for k, _ in (m or []))])
    return [n for n in names if n in cells.columns]


def fmt_rate(k: int, n: int) -> str:
    if n == 0:
        return "—"
    low, high = wilson(k, n)
    return f"{100 * k / n:5.1f}% [{100 * low:.0f}–{100 * high:.0f}]"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "·"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # an int axis made float by a missing value in another row
    return str(value)


_STATUS_STYLE = {Status.OK: "", Status.INSTALL_FAILED: "magenta", Status.SERVER_FAILED: "magenta",
                 Status.TIMEOUT: "yellow", Status.CRASHED: "red"}


# A terminal table of more cells than this shows the worst ones (`--all`: every one). Thousands of rows
# are not read in a terminal, and rich takes seconds to lay them out; the heatmap, `--html` and
# `sweeper.store.frames` show every cell.
TABLE_ROWS = 200

# The cell columns `cells_table` shows (a report that prints only the table reads only these).
TABLE_COLUMNS = ("run_id", "cell_id", *CORE_COLUMNS, "axes", "status", "status_detail", "n_samples", "n_failed",
                 "failed_checks", "effective_differs")

# Headers a terminal has room for: the core axes by a short name, generic ones without their prefix.
_SHORT = {"spec_method": "spec", "num_speculative_tokens": "k", "async_scheduling": "async",
          "attention_backend": "attn"}


def short_header(axis: str) -> str:
    """An axis as a table header: `spec_method` -> `spec`, `env.VLLM_USE_V2_MODEL_RUNNER` ->
    `V2_MODEL_RUNNER`, `request.temperature` -> `temperature`, `serve.--max-num-seqs` ->
    `max-num-seqs`."""
    if axis in _SHORT:
        return _SHORT[axis]
    for prefix in ("env.VLLM_USE_", "env.VLLM_", "env.", "request.", "serve.--", "serve."):
        if axis.startswith(prefix):
            return axis[len(prefix):]
    return axis


def worst_cells(cells: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The `limit` cells that fail most: cells that did not run `ok` first, then by the low end of
    the failure rate's 95% interval (so that 1 failure in 1 does not outrank 300 in 1,000), then by
    failures."""
    if len(cells) <= limit:
        return cells
    n = cells["n_samples"].fillna(0).astype(int).tolist()
    k = cells["n_failed"].fillna(0).astype(int).tolist()
    rank = pd.DataFrame({"not_ok": cells["status"].ne(Status.OK).to_numpy(),
                         "low": [wilson(min(f, m), m)[0] if m else 0.0 for f, m in zip(k, n, strict=True)],
                         "k": k}, index=cells.index)
    keep = rank.sort_values(["not_ok", "low", "k"], ascending=False, kind="stable").index[:limit]
    return cells.loc[cells.index.isin(keep)]


def is_failing(row: Mapping[str, Any]) -> bool:
    """A cell that did not run `ok`, or had a failed sample."""
    return row.get("status") != Status.OK or bool(row.get("n_failed") or 0)


def _natural(text: str) -> tuple[int, float, str]:
    """A value not in the matrix's order: numbers by size, before words by name."""
    try:
        return 0, float(text), text
    except ValueError:
        return 1, 0.0, text


def in_order(cells: pd.DataFrame, orders: Mapping[str, Sequence[str]] | None = None,
             axes: Sequence[str] | None = None) -> pd.DataFrame:
    """The cells failing first, then by each axis (`axes`, default the varying ones, in column order:
    the commit first) with its values in `orders[axis]` (commits in history order, other axes in the
    matrix's order; a value not listed comes after, numbers by size): the one order of every command,
    the PNG heatmap and the HTML."""
    if cells.empty:
        return cells
    orders = orders or {}
    axes = list(varying_axes(cells) if axes is None else axes)
    ranks = {a: {v: i for i, v in enumerate(orders.get(a, ()))} for a in axes}

    def key(row: Mapping[str, Any]) -> tuple[Any, ...]:
        parts: list[Any] = [0 if is_failing(row) else 1]
        for a in axes:
            text = _fmt(row.get(a))
            rank = ranks[a]
            parts.append((rank[text], (0, 0.0, "")) if text in rank else (len(rank), _natural(text)))
        return tuple(parts)

    records = cells.to_dict("records")
    index = sorted(range(len(records)), key=lambda i: key(records[i]))
    return cells.iloc[index]


def run_orders(run: RunDir, cells: pd.DataFrame | None = None) -> dict[str, list[str]]:
    """Each axis's values in the order a run's matrix lists them (as tables show them), and its
    commits in history order (`commit_order`)."""
    present = cells["commit"].astype(str) if cells is not None and "commit" in cells.columns else ()
    out: dict[str, list[str]] = {}
    manifest = run.manifest_or_none()
    axes = manifest.matrix.get("axes") if manifest is not None else None
    if isinstance(axes, Mapping):
        for name, values in axes.items():
            if isinstance(values, list):
                out[str(name)] = list(dict.fromkeys(_fmt(v) for v in values))
    out["commit"] = commit_order(run, present)
    return out


def mode_label(row: Mapping[str, Any]) -> str:
    """One short failure-mode label for a table row: the check failed most often, and how many other
    checks failed besides (`--explain` names the modes in full)."""
    raw = row.get("failed_checks")
    pairs = list(raw.items()) if isinstance(raw, Mapping) else list(raw) if raw is not None else []
    if not pairs:
        return ""
    top = sorted(pairs, key=lambda kv: (-kv[1], kv[0]))
    return str(top[0][0]) + (f" +{len(top) - 1}" if len(top) > 1 else "")


def cells_table(cells: pd.DataFrame, *, title: str = "", commit_order: Sequence[str] = (),
                limit: int | None = TABLE_ROWS, orders: Mapping[str, Sequence[str]] | None = None,
                width: int | None = None) -> Table:
    """One row per cell: the axes that vary (short headers; the fixed ones said once above), status,
    failures with a Wilson 95% interval, a short failure-mode label, and a note (`status_detail` for a
    cell that is not `ok`, else what ran other than requested). Order: `in_order` (commits in
    `commit_order` or `orders["commit"]`). Above `limit` cells (None: no limit), only the worst
    `limit` (`worst_cells`), and a caption says so. `width`: the terminal's, which the mode and note
    columns are fitted into (None: as wide as they need)."""
    orders = {**(orders or {}), **({"commit": list(commit_order)} if commit_order else {})}
    fixed = fixed_axes(cells)
    axes = [a for a in varying_axes(cells) if a not in dict(fixed)]
    shown = worst_cells(cells, limit) if limit is not None else cells
    caption = None
    if len(shown) < len(cells):
        caption = (f"the {len(shown):,} of {len(cells):,} cells that fail most (not ok first, then by the low end of "
                   "the interval); `sweep report --all` shows every cell")
    heading = [t for t in (title, "fixed: " + ", ".join(f"{short_header(a)}={v}" for a, v in fixed) if fixed else "")
               if t]
    rows = in_order(shown, orders, axes).to_dict("records")
    notes = [_note(row) for row in rows]
    labels = [mode_label(row) for row in rows]
    # Columns as wide as their values (a long header folds); the free-text columns, mode and note,
    # get what `width` leaves, so that most rows stay one line. Set here rather than left to rich,
    # which shrinks every column alike and folds a commit like v0.28.0~3 over two lines. No outer
    # border and one space of padding between columns: more room for the text.
    widths = [min(24, max(max((len(_fmt(v)) for v in shown[a]), default=1), min(len(short_header(a)), 6)))
              for a in axes]
    widths.append(max([6, *(len(str(v)) for v in shown["status"])]))
    widths.append(max([8, *(len(f"{int(r['n_failed'] or 0)}/{int(r['n_samples'] or 0)}") for r in rows)]))
    widths.append(max([13, *(len(fmt_rate(int(r["n_failed"] or 0), int(r["n_samples"] or 0))) for r in rows)]))
    mode_w = max([4, *map(len, labels)])
    note_w: int | None = max((len(Text.from_markup(n).plain) for n in notes), default=0) or None
    if width is not None:
        columns = len(widths) + 1 + (note_w is not None)
        left = width - sum(widths) - 2 * columns  # a rule and a space beside each column
        if note_w is not None:
            mode_w = max(4, min(mode_w, left - min(note_w, 12)))
            note_w = max(8, left - mode_w)
        else:
            mode_w = max(4, min(mode_w, left))
    table = Table(title="\n".join(heading) or None, caption=caption, show_lines=False, box=box.MINIMAL_HEAVY_HEAD,
                  pad_edge=False, collapse_padding=True)
    for name, w in zip(axes, widths, strict=False):
        table.add_column(short_header(name), overflow="fold", width=w)
    table.add_column("status", overflow="fold", width=widths[len(axes)])
    table.add_column("failed/n", justify="right", no_wrap=True, width=widths[len(axes) + 1])
    table.add_column("rate [95% CI]", justify="right", no_wrap=True, width=widths[len(axes) + 2])
    table.add_column("mode", overflow="fold", width=mode_w)
    if note_w is not None:
        table.add_column("note", overflow="fold", width=note_w if width is not None else None)
    for row, note, label in zip(rows, notes, labels, strict=True):
        status = row["status"]
        style = _STATUS_STYLE.get(status, "")
        n, k = int(row["n_samples"] or 0), int(row["n_failed"] or 0)
        rate = fmt_rate(k, n)
        if k and status == Status.OK:
            rate = f"[red]{rate}[/red]"
        cols = [*[escape(_fmt(row.get(a))) for a in axes], f"[{style}]{status}[/{style}]" if style else status,
                f"{k}/{n}", rate, escape(label)]
        table.add_row(*cols, *([note] if note_w is not None else []))
    return table


def _note(row: Mapping[str, Any]) -> str:
    """Why a cell is not `ok` (its `status_detail`), else the settings that ran other than requested
    ("ran other model_runner": the effective configuration differs there; markup)."""
    if row.get("status") != Status.OK:
        return escape(one_line(str(row.get("status_detail") or row.get("status"))))
    names = list(row["effective_differs"]) if row.get("effective_differs") is not None else []
    # env.* / request.* entries are names vLLM said it ignored (an unknown env var, a field outside its schema).
    ignored = [n for n in names if n.startswith(("env.", "request."))]
    other = [n for n in names if n not in ignored]
    parts = ([f"ran other {', '.join(other)}"] if other else []) + ([f"ignored by vLLM: {', '.join(ignored)}"]
                                                                   if ignored else [])
    return f"[yellow]{escape('; '.join(parts))}[/yellow]" if parts else ""


def environments_table(envs: Iterable[EnvInfo], *, now: float | None = None) -> Table:
    """`sweep cache list`: one row per cached environment, least recently used first."""
    now = time.time() if now is None else now
    table = Table(show_lines=False)
    for name in ("key", "kind", "commit", "vLLM"):
        table.add_column(name, overflow="fold")
    table.add_column("size", justify="right")
    table.add_column("last used", justify="right")
    table.add_column("state")
    for e in sorted(envs, key=lambda e: e.last_used):
        commit = e.commit if not e.sha or e.sha.startswith(e.commit) else f"{e.commit} ({e.sha[:12]})"
        state = "in use" if e.in_use else ("ready" if e.complete else "incomplete")
        table.add_row(e.key, e.kind, commit, e.version or "·", _size(e.size_bytes), _ago(now - e.last_used), state)
    return table


def _size(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            break
        value /= 1000
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return "just now"


def _in_history_order(pivot: pd.DataFrame, commit_order: Sequence[str],
                      orders: Mapping[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """A pivot with its rows and columns in the one order (`in_order`'s, failing aside): commits in
    history order, other axes in the matrix's order (`orders`), values not listed after them."""
    orders = {**(orders or {}), **({"commit": list(commit_order)} if commit_order else {})}
    ranks = {a: {v: i for i, v in enumerate(vs)} for a, vs in orders.items()}

    def rank_of(axis: str, value: Any) -> tuple[Any, ...]:
        rank = ranks.get(axis, {})
        text = str(value)
        if text not in rank:
            with contextlib.suppress(ValueError):
                text = _fmt(float(text))  # "0.0" from a float column is the matrix's 0
        return (rank[text], (0, 0.0, "")) if text in rank else (len(rank), _natural(str(value)))

    def ordered(index: pd.Index) -> pd.Index:
        names = [str(n) for n in index.names]

        def key(i: int) -> tuple[Any, ...]:
            value = index[i]
            parts = value if isinstance(value, tuple) else (value,)
            return tuple(rank_of(n, v) for n, v in zip(names, parts, strict=False))
        return index[sorted(range(len(index)), key=key)]

    if not ranks:
        return pivot
    return pivot.reindex(index=ordered(pivot.index), columns=ordered(pivot.columns))


def failure_pivot(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], *,
                  commit_order: Sequence[str] = (), orders: Mapping[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """Failure rate per (rows × cols) combination of axis values (commits in `commit_order`).
    `samples`: sample rows, or counts per combination (`analysis.failure_counts`: `n`, `n_failed`)."""
    return _pivots(samples, rows, cols, commit_order, orders)[0]


def _pivots(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], commit_order: Sequence[str],
            orders: Mapping[str, Sequence[str]] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(failure rate, samples) per (rows × cols) combination."""
    for name in [*rows, *cols]:
        if name not in samples.columns:
            raise SweepError(f"no axis {name!r} in these results; axes: {', '.join(varying_axes(samples)) or 'none'}")
    if "n_failed" in samples.columns and "passed" not in samples.columns:
        df = samples[[*dict.fromkeys([*rows, *cols]), "n", "n_failed"]]
    else:
        df = samples[[*dict.fromkeys([*rows, *cols])]].assign(n=samples["passed"].notna().astype(int),
                                                               n_failed=samples["passed"].eq(False).astype(int))
    keyed = df.assign(**{n: df[n].astype(str) for n in [*rows, *cols]})
    sums = keyed.pivot_table(index=list(rows), columns=list(cols) or None, values=["n", "n_failed"], aggfunc="sum")
    n, failed = sums["n"], sums["n_failed"]
    if isinstance(n, pd.Series):  # no column axes: one column, as pivot_table gives for one value
        n, failed = n.to_frame("failed"), failed.to_frame("failed")
    pivot = _in_history_order(failed / n.where(n > 0), commit_order, orders)
    return pivot, n.reindex(index=pivot.index, columns=pivot.columns)


def heatmap(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], path: Path, *, title: str = "",
            commit_order: Sequence[str] = (), orders: Mapping[str, Sequence[str]] | None = None) -> Path:
    """Write a failure-rate heatmap (PNG or SVG by suffix); commits in history order, labels whole.
    `samples`: sample rows, or counts per combination from `analysis.failure_counts` (any size of run)."""
    # A figure on the Agg canvas, without pyplot: no global backend switched, no figure manager, and
    # less to import.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    pivot, counts = _pivots(samples, rows, cols, commit_order, orders)
    # Room for the longest labels: a sha or a long flag value is shown whole, never cut.
    row_chars = max((len(_label(i)) for i in pivot.index), default=4)
    col_chars = max((len(_label(c)) for c in pivot.columns), default=4)
    fig = Figure(figsize=(1.6 + 0.07 * row_chars + max(1.3, 0.09 * col_chars) * max(1, pivot.shape[1]),
                          1.2 + 0.45 * pivot.shape[0] + 0.06 * col_chars))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    rates = pivot.to_numpy(dtype=float)
    top = colour_top(rates)
    im = ax.imshow(rates, cmap="Reds", vmin=0, vmax=top, aspect="auto")
    ax.set_xticks(range(pivot.shape[1]), [_label(c) for c in pivot.columns], rotation=30, ha="right")
    ax.set_yticks(range(pivot.shape[0]), [_label(i) for i in pivot.index])
    cells = [(i, j, f"{100 * rates[i, j]:.0f}%\nn={counts.iat[i, j]}", rates[i, j] > 0.5 * top)
             for i in range(pivot.shape[0]) for j in range(pivot.shape[1]) if not np.isnan(rates[i, j])]
    if cells:
        ax.add_collection(_annotations(fig, ax, cells), autolim=False)
    ax.set_xlabel(" / ".join(cols))
    ax.set_ylabel(" / ".join(rows))
    ax.set_title(title or "failure rate")
    bar = fig.colorbar(im, ax=ax, fraction=0.04)
    bar.set_label("failure rate")
    bar.ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0 if top >= 0.05 else 1))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)  # the figure is sized and laid out for its labels: no second, cropping draw
    return path


# The top of a heatmap's colour scale: the smallest of these at or above the highest rate shown, so
# that 18 % is a strong colour on a 0–20 % scale rather than a faint one on 0–100 %.
_TOPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def colour_top(rates: np.ndarray) -> float:
    """The top of the colour scale for these failure rates (NaN: no samples)."""
    finite = rates[~np.isnan(rates)] if rates.size else rates
    high = float(finite.max()) if finite.size else 0.0
    return next((t for t in _TOPS if high <= t), 1.0) if high > 0 else 1.0


def _annotations(fig: Any, ax: Any, cells: Sequence[tuple[int, int, str, bool]]) -> Any:
    """Each cell's label, centred on it, as one collection of glyph outlines: one draw for the whole
    grid. (One `ax.text` per cell costs milliseconds each to draw, seconds for a 50 x 10 grid.)
    `cells`: (row, column, text, on a dark cell)."""
    from matplotlib.collections import PathCollection
    from matplotlib.font_manager import FontProperties
    from matplotlib.path import Path as GlyphPath
    from matplotlib.textpath import TextPath
    from matplotlib.transforms import Affine2D

    font = FontProperties(size=8)
    shapes: dict[str, Any] = {}

    def shape(text: str) -> Any:
        """`text` in points, each line centred, the block centred on (0, 0); made once per distinct text."""
        if text not in shapes:
            lines = text.split("\n")
            step = 1.2 * font.get_size_in_points()
            parts = []
            for k, line in enumerate(lines):
                glyphs = TextPath((0, 0), line, prop=font)
                box = glyphs.get_extents()
                y = (len(lines) - 1) / 2 * step - k * step - font.get_size_in_points() * 0.35
                parts.append(glyphs.transformed(Affine2D().translate(-(box.x0 + box.x1) / 2, y)))
            shapes[text] = GlyphPath.make_compound_path(*parts)
        return shapes[text]

    collection = PathCollection([shape(text) for _, _, text, _ in cells], offsets=[(j, i) for i, j, _, _ in cells],
                                offset_transform=ax.transData, facecolors=["white" if dark else "black" for *_, dark in cells],
                                edgecolors="none", linewidths=0)
    # Glyphs are in points: scaled to pixels at whatever dpi the figure is saved with.
    collection.set_transform(Affine2D().scale(1 / 72) + fig.dpi_scale_trans)
    return collection


def _label(value: Any) -> str:
    return " / ".join(map(str, value)) if isinstance(value, tuple) else str(value)


# ---- a run's context: its suite, its commits in history order, its explanation -------------------

def run_suite(run: RunDir) -> Suite | None:
    """The run's suite rebuilt from its manifest; None when the files are gone or changed since (the
    digest differs), so failure modes then tell checks apart by name only."""
    from sweeper.spec.suite import load_suites

    manifest = run.manifest_or_none()
    if manifest is None:
        return None
    paths = list(manifest.suite_path or ()) if isinstance(manifest, SweepManifest) else []
    if not paths:  # a bisect's manifest names the matrix, whose suite paths are relative to it
        names = manifest.matrix.get("suite") or []
        names = [names] if isinstance(names, str) else list(names)
        paths = [str(resolve_path(manifest.matrix_path or "", str(n))) for n in names]
    try:
        suite = load_suites(tuple(Path(p) for p in paths))
    except (SweepError, OSError):
        return None
    return suite if suite.digest == manifest.suite_digest else None


def commit_order(run: RunDir, present: Iterable[str] = ()) -> list[str]:
    """The run's commits oldest first: a bisect's range as stored; a sweep's refs in the history
    order its plan learnt from the repository (`sweeper.drivers.sweep.history_order`), else as the matrix
    lists them. Commits in `present` that the manifest does not name come last."""
    manifest = run.manifest_or_none()
    if isinstance(manifest, BisectManifest):
        order = list(manifest.commits or ())
    elif manifest is not None:
        order = list(manifest.commit_order or manifest.axis_commits())
    else:
        order = []
    return order + [c for c in dict.fromkeys(present) if c not in order]


def explain_run(run: RunDir, samples: pd.DataFrame | None = None, cells: pd.DataFrame | None = None,
                **options: Any) -> Explanation:
    """`sweeper.judge.explain.explain` on a stored run, with its suite and history order. Samples it
    loads itself get the run's `expect:` judgements appended (`sweeper.reports.metrics.with_expectations`);
    a caller passing `samples` appends them itself, as it classifies the same rows."""
    from sweeper.judge.expectations import with_unit
    from sweeper.judge.explain import explain
    from sweeper.reports.expectations import with_expectations
    from sweeper.store import frames as analysis

    samples = with_expectations(run, analysis.load_samples(run)) if samples is None else samples
    cells = analysis.load_cells(run) if cells is None else cells
    order = commit_order(run, samples["commit"].astype(str) if "commit" in samples.columns else ())
    return with_unit(explain(samples, cells, suite=run_suite(run), commit_order=order, **options))


# ---- machine-readable output ---------------------------------------------------------------------

REPORT_SCHEMA = "sweep-report/1"


def report_json(run: RunDir, tbl: pa.Table, orders: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """`sweep report --json`: the run and its cells, one object per row of the cells Parquet with the
    same columns and values (maps as objects, `axes` as {axis: value} decoded from its JSON, times
    as ISO 8601 text, NaN as null), in the table's order (`in_order`). Schema: runs/README.md."""
    manifest = run.manifest_or_none()
    frame = _as_frame(tbl)
    order = [int(i) for i in in_order(frame, orders).index] if len(frame) else []
    rows = tbl.to_pylist()
    created = run.created()
    return {"schema": REPORT_SCHEMA, "run_id": run.run_id, "kind": manifest.kind if manifest else None,
            "created": created.isoformat(timespec="seconds") if created else None,
            "fixed": dict(fixed_axes(frame)) if len(frame) else {},
            "cells": [_plain_row(rows[i], tbl.schema) for i in order]}


def _as_frame(tbl: pa.Table) -> pd.DataFrame:
    from sweeper.store import frames as analysis

    return analysis.frame(tbl).reset_index(drop=True)


def _plain_row(row: Mapping[str, Any], schema: pa.Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in row.items():
        kind = schema.field(name).type
        if pa.types.is_map(kind) and value is not None:
            pairs = dict(value)
            value = {k: json.loads(v) for k, v in pairs.items()} if name == "axes" else pairs
        elif isinstance(value, float) and math.isnan(value):
            value = None
        elif hasattr(value, "isoformat"):
            value = value.isoformat()
        out[name] = value
    return out
