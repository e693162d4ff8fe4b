"""What a sweep spent and what it left: its GPU time by the cost model, the requests its adaptive
cells did not need, and the servers its budget left untested. A reader: the run's manifest and its
cells rows in, lines of text out."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from sweeper.store import frames as analysis
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import RunDir

SHOWN = 8  # untested servers named by the report; the manifest lists them all
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
    return [*_gpu_lines(rows, manifest), *adaptive_lines(rows), *budget_lines(manifest)]


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


def budget_lines(manifest: SweepManifest) -> list[str]:
    """What the budget fitted, and the servers it left untested (counted per axis value)."""
    b = manifest.budget
    if b is None:
        return []
    lines = [(f"budget: {b.gpu_hours:g} GPU-hours: {b.servers} servers ({b.cells} cells) fitted, modelled at "
              f"{b.modelled_hours:.3f} GPU-hours")]
    # A zoom after the design runs what the budget leaves: some of the servers it left may have run since.
    zoomed = {g for p in manifest.phases if p.kind == "zoom" for g in p.groups}
    if zoomed:
        lines.append(f"  then zoom phases within what was left: {len(zoomed)} servers")
    left = [g for g in b.left_groups if g not in zoomed]
    if not b.left_servers or not left:
        lines.append("  nothing left untested" if not b.left_servers else
                     "  nothing of the design left untested (the zoom ran what the budget had left out)")
        return lines
    shown = ", ".join(left[:SHOWN]) + (f", … ({len(left) - SHOWN} more)" if len(left) > SHOWN else "")
    cells = f" ({b.left_cells} cells)" if len(left) == b.left_servers else ""
    lines.append(f"  left untested: {len(left)} servers{cells}: {shown}")
    return lines


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0  # NaN: nothing measured
