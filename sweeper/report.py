"""Failure-rate tables and heatmaps from stored results (reads results only)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.table import Table

from sweeper.errors import SweepError
from sweeper.stats import wilson

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


def cells_table(cells: pd.DataFrame, *, title: str = "") -> Table:
    """One row per cell: the axes that vary, status, failures with a Wilson 95% interval."""
    axes = varying_axes(cells)
    table = Table(title=title or None, show_lines=False)
    for name in axes:
        table.add_column(name.removeprefix("env.").removeprefix("request."), overflow="fold")
    table.add_column("status")
    table.add_column("failed/n", justify="right")
    table.add_column("failure rate [95% CI]", justify="right")
    table.add_column("failing checks", overflow="fold")
    table.add_column("requested ≠ effective", overflow="fold")
    order = [c for c in axes if c in cells.columns]
    rows = cells.sort_values(order, key=lambda s: s.astype(str)) if order else cells
    for _, row in rows.iterrows():
        status = row["status"]
        style = {"ok": "", "install_failed": "magenta", "server_failed": "magenta", "timeout": "yellow",
                 "crashed": "red"}.get(status, "")
        n, k = int(row["n_samples"] or 0), int(row["n_failed"] or 0)
        rate = fmt_rate(k, n)
        if k and status == "ok":
            rate = f"[red]{rate}[/red]"
        top = sorted(row["failed_checks"] or [], key=lambda kv: -kv[1])
        checks = ", ".join(f"{name}×{count}" for name, count in top[:3]) + (" …" if len(top) > 3 else "")
        differs = ", ".join(row["effective_differs"] if row["effective_differs"] is not None else [])
        table.add_row(*[_fmt(row.get(a)) for a in axes], f"[{style}]{status}[/{style}]" if style else status,
                      f"{k}/{n}", rate, checks, f"[yellow]{differs}[/yellow]" if differs else "")
    return table


def failure_pivot(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str]) -> pd.DataFrame:
    """Failure rate per (rows × cols) combination of axis values."""
    for name in [*rows, *cols]:
        if name not in samples.columns:
            raise SweepError(f"no axis {name!r} in these results; axes: {', '.join(varying_axes(samples)) or 'none'}")
    df = samples.assign(failed=~samples["passed"].astype(bool))
    keyed = df.assign(**{n: df[n].astype(str) for n in [*rows, *cols]})
    return keyed.pivot_table(index=list(rows), columns=list(cols) or None, values="failed", aggfunc="mean")


def heatmap(samples: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], path: Path, *, title: str = "") -> Path:
    """Write a failure-rate heatmap (PNG or SVG by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pivot = failure_pivot(samples, rows, cols)
    counts = samples.assign(**{n: samples[n].astype(str) for n in [*rows, *cols]}).pivot_table(
        index=list(rows), columns=list(cols) or None, values="passed", aggfunc="size")
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * max(1, pivot.shape[1]), 1.2 + 0.45 * pivot.shape[0]))
    im = ax.imshow(pivot.to_numpy(dtype=float), cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(pivot.shape[1]), [_label(c) for c in pivot.columns], rotation=30, ha="right")
    ax.set_yticks(range(pivot.shape[0]), [_label(i) for i in pivot.index])
    for i in range(pivot.shape[0]):
        for j in range(pivot.shape[1]):
            v = pivot.iat[i, j]
            if pd.notna(v):
                n = counts.iat[i, j]
                ax.text(j, i, f"{100 * v:.0f}%\nn={n}", ha="center", va="center", fontsize=8,
                        color="white" if v > 0.5 else "black")
    ax.set_xlabel(" / ".join(cols))
    ax.set_ylabel(" / ".join(rows))
    ax.set_title(title or "failure rate")
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _label(value: Any) -> str:
    return " / ".join(map(str, value)) if isinstance(value, tuple) else str(value)
