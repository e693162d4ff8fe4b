"""Server starts of `sweep triage` against a full-product sweep plus `sweep bisect` of the same cells.

On the demo matrix as shipped and the demo history (in-process executor, 4 slots), in three fresh
runs folders under a temporary folder:

1. `sweep triage matrices/demo.yaml --good v0.27 --bad main`;
2. `sweep matrix matrices/demo.yaml` (the full product), then `sweep bisect` of the cells the
   triage bisected (its bisect manifest's settings keys), over the same range;
3. the same full-product sweep, then `sweep bisect --good v0.27 --bad main` as typed (every cell
   that changes).

Starts are counted from the servers' logs (one API-server banner per start). Prints one JSON line.

    .venv/bin/python benchmarks/triage_starts.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from sweeper.drivers.bisect import BisectOptions, BisectScope, Subject, bisect_cells, run_bisect
from sweeper.drivers.sweep import run_matrix
from sweeper.drivers.triage import TriageOptions, TriageScope, run_triage
from sweeper.execute.choice import choose
from sweeper.install.matrix_loader import load_matrix
from sweeper.spec.suite import load_suites

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "matrices" / "demo.yaml"


def starts(root: Path) -> int:
    return sum(p.read_text().count("vLLM API server version") for p in root.glob("**/logs/*.log"))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        cache = tmp / "cache"
        triage = run_triage(TriageScope(DEMO, "v0.27", "main"),
                            TriageOptions(runs_dir=tmp / "t", run_id="t", cache_dir=cache), executor=choose("local"))
        keys = json.loads((triage.run.root / "phases" / "bisect" / "manifest.json").read_text())["settings_keys"]
        matrix = load_matrix(DEMO)
        cells = sorted({c.settings_key: c for c in matrix.cells if c.settings_key in keys}.values(),
                       key=lambda c: c.cell_id)
        run_matrix(DEMO, runs_dir=tmp / "a", run_id="full", executor=choose("local"), cache_dir=cache)
        bisect_cells(Subject(matrix, cells, load_suites(matrix.suite_paths)), BisectScope(good="v0.27", bad="main"),
                     BisectOptions(runs_dir=tmp / "a", run_id="b", cache_dir=cache), executor=choose("local"),
                     on_event=lambda _: None)
        run_matrix(DEMO, runs_dir=tmp / "e", run_id="full", executor=choose("local"), cache_dir=cache)
        run_bisect(BisectScope(good="v0.27", bad="main"), BisectOptions(runs_dir=tmp / "e", run_id="b", cache_dir=cache),
                   executor=choose("local"))
        phases = {p.name: p.starts for p in triage.record.phases}
        out = {"triage": starts(triage.run.root), "triage_phases": phases, "full_sweep": starts(tmp / "a" / "full"),
               "bisect_same_cells": starts(tmp / "a" / "b"), "bisect_every_cell": starts(tmp / "e" / "b"),
               "modes": len(triage.record.modes)}
        sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
