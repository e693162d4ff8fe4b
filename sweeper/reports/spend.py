"""What a sweep spent and what it left: its GPU time by the cost model, the requests its adaptive
cells did not need, and the servers its budget left untested. A reader: the run's manifest and its
cells rows in, lines of text out."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from sweeper.reports.budget import budget_lines
from sweeper.store import frames as analysis
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import RunDir

COLUMNS = ["group_id", "cell_id", "commit", "commit_sha", "axes", "n_samples", "samples_planned", "stop_reason",
           "gpu_seconds", "startup_s", "duration_s", "install_s", "replay_s"]


def run_notes(run: RunDir, cells: pd.DataFrame | None = None) -> list[str]:
    """Lines for the end of a sweep's report: GPU time, the adaptive cells' stops, the budget."""
    manifest = run.manifest_or_none()
    if not isinstance(manifest, SweepManifest):
        return []
    if cells is None:
        cells = analysis.frame(analysis.load_table(run, "cells", COLUMNS))
    rows = cells.to_dict("records") if len(cells) else []
    return [*_gpu_lines(rows, manifest), *adaptive_lines(rows), *budget_lines(manifest.budget, manifest.phases)]


def _gpu_lines(rows: Sequence[Mapping[str, Any]], manifest: SweepManifest) -> list[str]:
    if not rows:
        return []
    total = sum(_num(r.get("gpu_seconds")) for r in rows)
    line = f"GPU time: {total / 3600:,.3f} GPU-hours measured over {len({r.get('group_id') for r in rows})} servers"
    if manifest.cost is not None:
        line += f" (planned with {manifest.cost.source})"
    return [line]


def adaptive_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """How many requests the adaptive cells sent of their suites', and why they stopped."""
    adaptive = [r for r in rows if isinstance(r.get("stop_reason"), str)]
    if not adaptive:
        return []
    sent = sum(int(_num(r.get("n_samples"))) for r in adaptive)
    planned = sum(int(_num(r.get("samples_planned"))) for r in adaptive)
    stops = Counter(str(r["stop_reason"]) for r in adaptive)
    saved = 1 - sent / planned if planned else 0.0
    why = ", ".join(f"{stops[s]} {s}" for s in ("failing", "clean", "width", "exhausted", "server") if stops[s])
    return [(f"adaptive: {sent:,} of {planned:,} requests sent ({saved:.0%} fewer than whole suites); "
             f"cells stopped: {why}")]


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0  # NaN: nothing measured
