"""How much the fan-out and the server reuse buy, on the demo matrix (local Ray + the simulator).

    .venv/bin/python benchmarks/sweep_speed.py

Runs matrices/demo.yaml with 1 and with 4 logical GPU slots and prints wall-clock times and their
ratio, plus the ratio of server starts to cells (request-level axes share one server).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from sweeper import analysis
from sweeper.matrix import load_matrix
from sweeper.sweep import run_matrix

ROOT = Path(__file__).parent.parent


def timed(matrix: Path, slots: int, runs: Path) -> float:
    t0 = time.monotonic()
    run_matrix(matrix, runs_dir=runs, run_id=f"slots{slots}", gpus=slots)
    return time.monotonic() - t0


def main() -> None:
    matrix = ROOT / "matrices" / "demo.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        run_matrix(matrix, runs_dir=runs, run_id="warm", gpus=4)  # makes the simulated history once
        t1, t4 = timed(matrix, 1, runs), timed(matrix, 4, runs)
        cells = analysis.load_cells(analysis.RunDir(runs / "slots4"))
    m = load_matrix(matrix)
    with_request_axis = len(m.cells)
    print("| measure | value |\n| --- | --- |")
    print(f"| cells / server starts (demo) | {with_request_axis} / {int(cells.server_starts.sum())} |")
    print(f"| wall time, 1 slot | {t1:.1f} s |")
    print(f"| wall time, 4 slots | {t4:.1f} s |")
    print(f"| speed-up 4 slots vs 1 | {t1 / t4:.2f}x |")


if __name__ == "__main__":
    main()
