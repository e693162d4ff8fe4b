"""How much the fan-out and the server reuse buy, on the demo matrix (local Ray + the simulator).

    .venv/bin/python benchmarks/sweep_speed.py

Runs matrices/demo.yaml with 1 and with 4 logical GPU slots and prints wall-clock times and their
ratio, plus cells against the server starts the runner counted (request-level axes share one
server). `--starts-only`: one run at 4 slots, for the count alone.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from sweeper.drivers.sweep import run_matrix
from sweeper.execute.choice import choose
from sweeper.install.matrix_loader import load_matrix
from sweeper.store import frames as analysis

ROOT = Path(__file__).parent.parent


def timed(matrix: Path, slots: int, runs: Path) -> float:
    t0 = time.monotonic()
    run_matrix(matrix, runs_dir=runs, run_id=f"slots{slots}", executor=choose(gpus=slots))
    return time.monotonic() - t0


def main() -> None:
    starts_only = "--starts-only" in sys.argv[1:]
    matrix = ROOT / "matrices" / "demo.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        if starts_only:
            timed(matrix, 4, runs)
        else:
            run_matrix(matrix, runs_dir=runs, run_id="warm", executor=choose(gpus=4))  # makes the simulated history once
            t1, t4 = timed(matrix, 1, runs), timed(matrix, 4, runs)
        cells = analysis.load_cells(analysis.RunDir(runs / "slots4"))
    print("| measure | value |\n| --- | --- |")
    print(f"| cells / server starts (demo) | {len(load_matrix(matrix).cells)} / {analysis.server_starts(cells)} |")
    if not starts_only:
        print(f"| wall time, 1 slot | {t1:.1f} s |")
        print(f"| wall time, 4 slots | {t4:.1f} s |")
        print(f"| speed-up 4 slots vs 1 | {t1 / t4:.2f}x |")


if __name__ == "__main__":
    main()
