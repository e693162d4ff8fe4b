"""`sweep report RUN --metrics`: the serving metrics of a run, as people look at them (reads results only).

* `table_lines`: one table per load point, a row per configuration (its settings, the commit
  included), each figure its mean over valid starts ± the half-width of its 95 % t interval, fitting
  100 columns; `as_json` the same as data (`--json`).
* `pareto`: throughput against TPOT (or TTFT) per configuration and load point, the configurations
  no other beats on both (the frontier) marked and joined, as `vllm bench sweep plot_pareto` draws it.
* `heatmap`: one metric's mean over two sets of axes (`--heatmap FILE --metric NAME`).
* `html_section`: the tables and the Pareto picture for the HTML report.
* `explain_text`: `--explain --metric NAME`, the smallest setting conjunction that moves a metric.

matplotlib with the Agg backend: files are written, no window is opened.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from sweeper.judge import metric_starts as ms
from sweeper.judge.metric_names import METRICS
from sweeper.reports.tables import short_header

if TYPE_CHECKING:
    from sweeper.store.run_folder import RunDir

WIDTH = 100
# The columns of the table: (metric, header). Spec-decode acceptance only where measured.
SHOWN = (("request_throughput", "req/s"), ("output_throughput", "out tok/s"), ("mean_ttft_ms", "TTFT ms"),
         ("mean_tpot_ms", "TPOT ms"), ("mean_itl_ms", "ITL ms"), ("spec_decode_acceptance_length", "acc len"))
FIGURE_W = 11


@dataclass(frozen=True)
class Row:
    """One configuration at one load point: its valid starts, invalid ones, and each figure."""

    settings: ms.Settings  # commit included
    load_point: str
    starts: int
    invalid: int
    reasons: tuple[str, ...]
    figures: Mapping[str, tuple[float, float, float] | None]  # metric -> (mean, low, high)

    @property
    def label(self) -> str:
        return ms.label(self.settings)


def load(run: RunDir) -> pd.DataFrame:
    """The run's metrics table (empty when it measured none)."""
    from sweeper.store.metrics_table import read_metrics

    return read_metrics(run)


def rows(metrics: pd.DataFrame, names: Sequence[str] = tuple(METRICS)) -> list[Row]:
    out = []
    for (settings, point), members in ms.group(ms.records(metrics), with_commit=True).items():
        figures = {}
        for name in names:
            fig = ms.figure(members, name, METRICS[name].se)
            figures[name] = fig.mean_interval()
        invalid = [r for r in members if not ms.is_valid(r)]
        reasons = tuple(dict.fromkeys(str(r.get("invalid_reason") or "invalid") for r in invalid))
        out.append(Row(settings, point, len({ms.start_id(r) for r in members}) - len(invalid), len(invalid),
                       reasons, figures))
    return out


def _cell(value: tuple[float, float, float] | None) -> str:
    if value is None:
        return "—"
    mean, low, _ = value
    half = mean - low
    digits = 0 if abs(mean) >= 100 else (1 if abs(mean) >= 10 else 2)
    if not math.isfinite(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f}±{half:.{digits}f}"


def _term(axis: str, value: str) -> str:
    """One setting as few characters as still say it: a row label has about 20 beside six figures."""
    if axis in ("commit", "spec_method", "attention_backend"):
        return value
    if axis == "async_scheduling":
        return {"true": "async", "false": "sync"}.get(value.lower(), f"async={value}")
    if axis == "num_speculative_tokens":
        return f"k{value}"
    if axis.startswith("env."):
        # The variable's first word after VLLM_/USE_ (VLLM_USE_V2_MODEL_RUNNER: V2): the full name is in
        # the JSON and the other reports; here it has to fit beside the figures.
        words = [w for w in axis[4:].split("_") if w not in ("VLLM", "USE")] or [axis[4:]]
        return f"{words[0]}={value}"
    return f"{short_header(axis)}={value}"


def table_lines(metrics: pd.DataFrame, *, width: int = WIDTH) -> list[str]:
    """One table per load point (see the module docstring); every line at most `width` columns."""
    found = rows(metrics, [m for m, _ in SHOWN])
    if not found:
        return ["no metrics in this run (a matrix with a bench: section measures them)"]
    shown = [(m, h) for m, h in SHOWN if any(r.figures.get(m) for r in found)]
    label_w = max(12, width - 6 - (FIGURE_W + 1) * len(shown))
    # Settings every row shares are said once; the rest name each row, axes shortened as the cells table does.
    values: dict[str, set[str]] = {}
    for r in found:
        for a, v in r.settings:
            values.setdefault(a, set()).add(v)
    fixed = {a for a, vs in values.items() if len(vs) == 1 and all(a in dict(r.settings) for r in found)}
    labels = {id(r): " ".join(_term(a, v) for a, v in r.settings if a not in fixed) or "(all)" for r in found}
    out = ["mean ± 95 % interval over server starts (n: valid starts)"]
    if fixed:
        out.append("every row: " + " ".join(f"{short_header(a)}={next(iter(values[a]))}" for a in values if a in fixed))
    for point in dict.fromkeys(r.load_point for r in found):
        out += ["", f"load point {point or '(one)'}"[:width]]
        out.append(f"{'configuration':<{label_w}} {'n':>4} " + " ".join(f"{h:>{FIGURE_W}}" for _, h in shown))
        for r in sorted((r for r in found if r.load_point == point), key=lambda r: labels[id(r)]):
            text = labels[id(r)]
            label = text if len(text) <= label_w else text[:label_w - 1] + "…"
            n = f"{r.starts}" + (f"!{r.invalid}" if r.invalid else "")
            out.append(f"{label:<{label_w}} {n:>4} " + " ".join(f"{_cell(r.figures.get(m)):>{FIGURE_W}}"
                                                                 for m, _ in shown))
    if any(r.invalid for r in found):
        out += ["", "n!k: k starts invalid, their figures left out:"]
        out += [f"  {r.label} @ {r.load_point}: {'; '.join(r.reasons)}"[:width] for r in found if r.invalid]
    return [line[:width] for line in out]


def as_json(metrics: pd.DataFrame) -> dict[str, Any]:
    """`sweep report RUN --metrics --json`: per configuration and load point, each metric's mean and
    95 % interval over valid starts (null where not measured)."""
    def num(x: float) -> float | None:
        return x if math.isfinite(x) else None
    return {"schema": "sweep-metrics-report/1", "interval": "95 % t interval over valid server starts",
            "rows": [{"settings": dict(r.settings), "load_point": r.load_point, "starts": r.starts,
                      "invalid": r.invalid, "invalid_reasons": list(r.reasons),
                      "metrics": {m: None if v is None else {"mean": num(v[0]), "low": num(v[1]), "high": num(v[2])}
                                  for m, v in r.figures.items()}} for r in rows(metrics)]}


def frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other beats on both: lower latency (x) and higher throughput (y)."""
    out = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            out.append(i)
    return sorted(out, key=lambda i: points[i][0])


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_figure(metrics: pd.DataFrame, *, latency: str = "mean_tpot_ms", throughput: str = "output_throughput",
                  title: str = "") -> Any:
    """The Pareto picture as a matplotlib figure (see `pareto`)."""
    plt = _pyplot()
    found = [r for r in rows(metrics, [latency, throughput]) if r.figures.get(latency) and r.figures.get(throughput)]
    fig, ax = plt.subplots(figsize=(9, 6))
    pts = [(r.figures[latency][0], r.figures[throughput][0]) for r in found]  # type: ignore[index]
    best = set(frontier(pts))
    for i, (r, (x, y)) in enumerate(zip(found, pts, strict=True)):
        ax.scatter([x], [y], s=60 if i in best else 25, marker="*" if i in best else "o",
                   color="tab:red" if i in best else "tab:blue", zorder=3)
        if i in best:
            ax.annotate(f"{r.label} @ {r.load_point}", (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    line = sorted((pts[i] for i in best), key=lambda p: p[0])
    if line:
        ax.plot([p[0] for p in line], [p[1] for p in line], color="tab:red", linewidth=1, label="Pareto frontier")
        ax.legend(loc="lower right")
    ax.set_xlabel(f"{latency} ({METRICS[latency].unit}, lower is better)")
    ax.set_ylabel(f"{throughput} ({METRICS[throughput].unit}, higher is better)")
    ax.set_title(title or f"{throughput} against {latency}, one point per configuration and load point")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def pareto(metrics: pd.DataFrame, path: Path, *, latency: str = "mean_tpot_ms",
           throughput: str = "output_throughput", title: str = "") -> Path:
    """Throughput against a latency per configuration and load point, the frontier marked, to `path`."""
    fig = pareto_figure(metrics, latency=latency, throughput=throughput, title=title)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def pivot(metrics: pd.DataFrame, rows_axes: Sequence[str], cols_axes: Sequence[str], metric: str,
          load_point: str | None = None) -> pd.DataFrame:
    """`metric`'s mean over valid starts per (row axes, column axes), at one load point (default: the first)."""
    records = [r for r in ms.records(metrics) if ms.is_valid(r)]
    points = list(dict.fromkeys(str(r.get("load_point") or "") for r in records))
    point = load_point if load_point is not None else (points[0] if points else "")
    data = []
    for r in records:
        value = ms.number(r.get(metric))
        if value is None or str(r.get("load_point") or "") != point:
            continue
        axes = dict(ms.settings(r, with_commit=True))
        data.append({"row": " / ".join(axes.get(a, "·") for a in rows_axes),
                     "col": " / ".join(axes.get(a, "·") for a in cols_axes), "value": value})
    if not data:
        return pd.DataFrame()
    return pd.DataFrame(data).pivot_table(index="row", columns="col", values="value", aggfunc="mean")


def heatmap(metrics: pd.DataFrame, rows_axes: Sequence[str], cols_axes: Sequence[str], metric: str, path: Path,
            *, load_point: str | None = None, title: str = "") -> Path:
    """One metric's mean over two sets of axes, annotated, to `path`."""
    if metric not in METRICS:
        from sweeper.errors import ConfigError

        raise ConfigError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}", key="--metric")
    table = pivot(metrics, rows_axes, cols_axes, metric, load_point)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 1.4 * max(1, table.shape[1]) + 2), max(3, 0.5 * max(1, table.shape[0]) + 2)))
    if not table.empty:
        cmap = "viridis" if METRICS[metric].higher_is_better else "viridis_r"
        image = ax.imshow(table.to_numpy(dtype=float), cmap=cmap, aspect="auto")
        fig.colorbar(image, ax=ax, label=f"{metric} ({METRICS[metric].unit})")
        ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns], rotation=30, ha="right")
        ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
        for (i, j), value in pd.DataFrame(table.to_numpy()).stack().items():
            ax.text(j, i, f"{value:.4g}", ha="center", va="center", color="white", fontsize=8)
    ax.set_xlabel(", ".join(cols_axes))
    ax.set_ylabel(", ".join(rows_axes))
    ax.set_title(title or f"{metric}, mean over starts")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def html_section(metrics: pd.DataFrame) -> str:
    """The metrics section of the HTML report: the tables and the Pareto picture (inline PNG)."""
    if metrics.empty:
        return ""
    body = html.escape("\n".join(table_lines(metrics)))
    buffer = io.BytesIO()
    fig = pareto_figure(metrics)
    fig.savefig(buffer, format="png", dpi=90)
    _pyplot().close(fig)
    image = base64.b64encode(buffer.getvalue()).decode("ascii")
    return ('<section id="metrics"><h2>Serving metrics</h2><pre>' + body + "</pre>"
            f'<img alt="Pareto: output throughput against mean TPOT" src="data:image/png;base64,{image}"></section>')


def explain_text(metrics: pd.DataFrame, metric: str, cells: pd.DataFrame | None = None,
                 *, json_out: bool = False) -> str:
    """`sweep report RUN --explain --metric NAME`: per load point, the smallest setting conjunction
    that moves the metric, with its effect and 95 % interval (`sweeper.judge.metric_explain`)."""
    import json

    from sweeper.judge.metric_explain import explain_metric

    if metric not in METRICS:
        from sweeper.errors import ConfigError

        raise ConfigError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}", key="--metric")
    if metrics.empty:
        return "no metrics in this run (a matrix with a bench: section measures them)\n"
    points = list(dict.fromkeys(str(r.get("load_point") or "") for r in ms.records(metrics)))
    found = [explain_metric(metrics, metric, load_point=p, cells=cells) for p in points]
    if not json_out:
        return "\n".join(e.line() for e in found) + "\n"

    def num(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None
    return json.dumps({"schema": "sweep-metric-explain/1", "metric": metric, "load_points": [
        {"load_point": e.load_point, "conjunction": [{"axis": a, "value": v} for a, v in e.terms],
         "text": e.conjunction, "effect": num(e.effect), "low": num(e.low), "high": num(e.high),
         "p_adjusted": num(e.p_adjusted), "tried": e.tried, "starts_inside": e.starts_inside,
         "starts_outside": e.starts_outside,
         "aliases": [[{"axis": a, "value": v} for a, v in alias] for alias in e.aliases]} for e in found]},
        indent=2) + "\n"


def report_cli(runs_dir: str, run_id: str | None, *, against: str | None, pareto_path: Path | None,  # noqa: PLR0913
               heatmap_path: Path | None, metric: str | None, rows_axes: str | None, cols_axes: str | None,
               json_out: bool, write: Any, explain: bool = False) -> None:
    """What `sweep report` does with `--metrics`, `--pareto` or `--metric` (with `--explain`: what
    moves the metric): `write` takes each text."""
    import json

    from sweeper.errors import SweepError
    from sweeper.judge.metric_compare import as_json as compare_json
    from sweeper.judge.metric_compare import compare_metrics, render
    from sweeper.store import frames
    from sweeper.store.run_folder import open_run

    run = open_run(runs_dir, run_id, create=False) if run_id else frames.latest_run(runs_dir)
    metrics = load(run)
    if explain:
        if metric is None:
            raise SweepError("--explain with --metrics needs --metric NAME: the metric to explain")
        write(explain_text(metrics, metric, frames.load_cells(run), json_out=json_out))
        return
    if against:
        other = open_run(runs_dir, against, create=False)
        cmp = compare_metrics(metrics, load(other), run_a=run.run_id, run_b=other.run_id,
                              names=[metric] if metric else None)
        write(json.dumps(compare_json(cmp), indent=2) + "\n" if json_out else "\n".join(render(cmp)) + "\n")
        return
    if pareto_path is not None:
        write(f"pareto: {pareto(metrics, pareto_path, title=run.run_id)}\n")
    if heatmap_path is not None:
        name = metric or "mean_tpot_ms"
        r = [a for a in (rows_axes or "commit").split(",") if a]
        c = [a for a in (cols_axes or "spec_method").split(",") if a]
        write(f"heatmap: {heatmap(metrics, r, c, name, heatmap_path, title=f'{run.run_id}: {name}')}\n")
    if pareto_path is None and heatmap_path is None:
        write(json.dumps(as_json(metrics), indent=2) + "\n" if json_out else "\n".join(table_lines(metrics)) + "\n")
