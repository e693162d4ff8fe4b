"""Failure-rate tables and heatmaps from stored results (reads results only)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from rich.table import Table

from sweeper.envinfo import EnvInfo
from sweeper.errors import SweepError
from sweeper.matrix import resolve_path
from sweeper.records import BisectManifest, SweepManifest
from sweeper.stats import wilson
from sweeper.status import Status
from sweeper.store import RunDir

if TYPE_CHECKING:
    from sweeper.explain import Explanation
    from sweeper.suite import Suite

CORE_COLUMNS = ("commit", "spec_method", "num_speculative_tokens", "async_scheduling", "attention_backend")


def varying_axes(cells: pd.DataFrame) -> list[str]:
    """Axis columns whose value differs between cells (constant ones add nothing to a table)."""
    names = list(dict.fromkeys([*CORE_COLUMNS, *(k for m in cells.get("axes", []) for k, _ in (m or []))]))
    out = []
    for name in names:
        if name in cells.columns and cells[name].astype(str).nunique(dropna=False) > 1:
            out.append(name)
    return out


def fmt_rate(k: int, n: int) -> str:
    if n == 0:
        return "—"
    low, high = wilson(k, n)
    return f"{100 * k / n:5.1f}% [{100 * low:.0f}–{100 * high:.0f}]"


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "·"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # an int axis made float by a missing value in another row
    return str(value)


_STATUS_STYLE = {Status.OK: "", Status.INSTALL_FAILED: "magenta", Status.SERVER_FAILED: "magenta",
                 Status.TIMEOUT: "yellow", Status.CRASHED: "red"}


# A terminal table of more cells than this shows the worst ones (`--all`: every one). Thousands of rows
# are not read in a terminal, and rich takes seconds to lay them out; the heatmap, `--html` and
# `sweeper.analysis` show every cell.
TABLE_ROWS = 200

# The cell columns `cells_table` shows (a report that prints only the table reads only these).
TABLE_COLUMNS = ("run_id", "cell_id", *CORE_COLUMNS, "axes", "status", "n_samples", "n_failed", "failed_checks",
                 "effective_differs")


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


def cells_table(cells: pd.DataFrame, *, title: str = "", commit_order: Sequence[str] = (),
                limit: int | None = TABLE_ROWS) -> Table:
    """One row per cell: the axes that vary, status, failures with a Wilson 95% interval; commits in
    history order (`commit_order`, oldest first; others after them). Above `limit` cells (None: no
    limit), only the worst `limit` (`worst_cells`), and a caption says so."""
    axes = varying_axes(cells)
    shown = worst_cells(cells, limit) if limit is not None else cells
    caption = None
    if len(shown) < len(cells):
        caption = (f"the {len(shown):,} of {len(cells):,} cells that fail most (not ok first, then by the low end of "
                   "the interval); `sweep report --all` shows every cell")
    table = Table(title=title or None, caption=caption, show_lines=False)
    for name in axes:
        table.add_column(name.removeprefix("env.").removeprefix("request."), overflow="fold")
    table.add_column("status")
    table.add_column("failed/n", justify="right")
    table.add_column("failure rate [95% CI]", justify="right")
    table.add_column("failing checks", overflow="fold")
    table.add_column("requested ≠ effective", overflow="fold")
    order = [c for c in axes if c in shown.columns]
    rows = shown.sort_values(order, key=lambda s: _sort_key(s, commit_order)) if order else shown
    for row in rows.to_dict("records"):
        status = row["status"]
        style = _STATUS_STYLE.get(status, "")
        n, k = int(row["n_samples"] or 0), int(row["n_failed"] or 0)
        rate = fmt_rate(k, n)
        if k and status == Status.OK:
            rate = f"[red]{rate}[/red]"
        top = sorted(row["failed_checks"] or [], key=lambda kv: -kv[1])
        checks = ", ".join(f"{name}×{count}" for name, count in top)
        differs = ", ".join(row["effective_differs"] if row["effective_differs"] is not None else [])
        table.add_row(*[_fmt(row.get(a)) for a in axes], f"[{style}]{status}[/{style}]" if style else status,
                      f"{k}/{n}", rate, checks, f"[yellow]{differs}[/yellow]" if differs else "")
    return table


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


def _sort_key(values: pd.Series, commit_order: Sequence[str]) -> pd.Series:
    if values.name != "commit" or not commit_order:
        return values.astype(str)
    rank = {c: i for i, c in enumerate(commit_order)}
    return values.astype(str).map(lambda c: f"{rank.get(c, len(rank)):08d} {c}")


def _in_history_order(pivot: pd.DataFrame, commit_order: Sequence[str]) -> pd.DataFrame:
    """A pivot with its commits (rows or columns) in history order rather than by name."""
    rank = {c: i for i, c in enumerate(commit_order)}

    def ordered(index: pd.Index) -> pd.Index:
        names = list(index.names)
        if "commit" not in names:
            return index
        level = names.index("commit")

        def key(i: int) -> tuple[int, str]:
            value = index[i]
            commit = value[level] if isinstance(value, tuple) else value
            return rank.get(commit, len(rank)), str(value)
        return index[sorted(range(len(index)), key=key)]

    if not rank:
        return pivot
    return pivot.reindex(index=ordered(pivot.index), columns=ordered(pivot.columns))


def failure_pivot(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], *,
                  commit_order: Sequence[str] = ()) -> pd.DataFrame:
    """Failure rate per (rows × cols) combination of axis values (commits in `commit_order`).
    `samples`: sample rows, or counts per combination (`analysis.failure_counts`: `n`, `n_failed`)."""
    return _pivots(samples, rows, cols, commit_order)[0]


def _pivots(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str],
            commit_order: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
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
    pivot = _in_history_order(failed / n.where(n > 0), commit_order)
    return pivot, n.reindex(index=pivot.index, columns=pivot.columns)


def heatmap(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], path: Path, *, title: str = "",
            commit_order: Sequence[str] = ()) -> Path:
    """Write a failure-rate heatmap (PNG or SVG by suffix); commits in history order, labels whole.
    `samples`: sample rows, or counts per combination from `analysis.failure_counts` (any size of run)."""
    # A figure on the Agg canvas, without pyplot: no global backend switched, no figure manager, and
    # less to import.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pivot, counts = _pivots(samples, rows, cols, commit_order)
    # Room for the longest labels: a sha or a long flag value is shown whole, never cut.
    row_chars = max((len(_label(i)) for i in pivot.index), default=4)
    col_chars = max((len(_label(c)) for c in pivot.columns), default=4)
    fig = Figure(figsize=(1.6 + 0.07 * row_chars + max(1.3, 0.09 * col_chars) * max(1, pivot.shape[1]),
                          1.2 + 0.45 * pivot.shape[0] + 0.06 * col_chars))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    rates = pivot.to_numpy(dtype=float)
    im = ax.imshow(rates, cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(pivot.shape[1]), [_label(c) for c in pivot.columns], rotation=30, ha="right")
    ax.set_yticks(range(pivot.shape[0]), [_label(i) for i in pivot.index])
    cells = [(i, j, f"{100 * rates[i, j]:.0f}%\nn={counts.iat[i, j]}", rates[i, j] > 0.5)
             for i in range(pivot.shape[0]) for j in range(pivot.shape[1]) if not np.isnan(rates[i, j])]
    if cells:
        ax.add_collection(_annotations(fig, ax, cells), autolim=False)
    ax.set_xlabel(" / ".join(cols))
    ax.set_ylabel(" / ".join(rows))
    ax.set_title(title or "failure rate")
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)  # the figure is sized and laid out for its labels: no second, cropping draw
    return path


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
    from sweeper.suite import load_suites

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
    order its plan learnt from the repository (`sweeper.sweep.history_order`), else as the matrix
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
    """`sweeper.explain.explain` on a stored run, with its suite and history order."""
    from sweeper import analysis
    from sweeper.explain import explain

    samples = analysis.load_samples(run) if samples is None else samples
    cells = analysis.load_cells(run) if cells is None else cells
    order = commit_order(run, samples["commit"].astype(str) if "commit" in samples.columns else ())
    return explain(samples, cells, suite=run_suite(run), commit_order=order, **options)
