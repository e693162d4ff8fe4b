"""P1 and P2: how close the fan-out comes to its lower bound, the fixed cost of a run, and how many
servers really start per server key.

    .venv/bin/python benchmarks/fanout.py [--slots 8] [--runs 2]

Runs a 48-cell simulator matrix (matrices/demo.yaml with a `request.temperature` axis: 24 server
keys, 2 cells on each) through `run_matrix` on a local Ray with `--slots` logical GPUs, and times it
from the outside (the cluster's methods are wrapped, nothing in the product changes):

* P1 = makespan ÷ max(Σ group work / slots, longest group), where makespan runs from the first
  submission to the last result and a group's work is its worker-side duration (install, server
  start, replay, post-processing: `GroupResult.timings["total"]`). The fixed overhead is the rest of
  the run's wall time: planning, Ray start, worker warm-up, shutdown.
* P2 = servers that started (each `Started server process` line in the run's server logs) ÷
  distinct server keys among the cells.

`--cold` alternates runs with and without the worker warm-up (`Cluster.warm` replaced by a no-op
for the "cold" runs), to show what the warm-up moves from the makespan into the fixed overhead.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from sweeper.drivers import sweep
from sweeper.execute import ray_executor as cluster
from sweeper.execute.choice import choose
from sweeper.store import frames as analysis

ROOT = Path(__file__).parent.parent
REAL_WARM = cluster.Cluster.warm


def matrix(tmp: Path) -> Path:
    spec = yaml.safe_load((ROOT / "matrices" / "demo.yaml").read_text())
    spec["suite"] = [str((ROOT / "matrices" / s).resolve()) for s in spec["suite"]]
    spec["name"] = "fanout"
    spec["axes"]["request.temperature"] = [0, 0.6]
    path = tmp / "fanout.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class Clock:
    """Timestamps from wrapped Cluster methods."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.cluster_timings: dict[str, float] = {}

    def install(self) -> None:
        clock, real = self, cluster.Cluster

        class Timed(real):  # type: ignore[misc, valid-type]
            def __enter__(self) -> Any:
                clock.marks["enter"] = time.monotonic()
                out = super().__enter__()
                return out

            def preflight(self, gpus_per_cell: float) -> None:
                super().preflight(gpus_per_cell)
                clock.marks["ready"] = time.monotonic()
                clock.cluster_timings = dict(self.timings)

            def run(self, jobs: Any, **kw: Any) -> Any:
                clock.marks["submit"] = time.monotonic()
                for item in super().run(jobs, **kw):
                    clock.marks["last_result"] = time.monotonic()
                    yield item

            def __exit__(self, *exc: object) -> None:
                clock.marks["exit"] = time.monotonic()
                super().__exit__(*exc)  # type: ignore[arg-type]
                clock.marks["closed"] = time.monotonic()

        sweep.Cluster = Timed  # type: ignore[misc]


def one(path: Path, runs: Path, cache: Path, slots: int, run_id: str, warm: bool) -> dict[str, float]:
    clock = Clock()
    clock.install()
    cluster.Cluster.warm = REAL_WARM if warm else (lambda self, gpus_per_cell: None)  # type: ignore[method-assign]
    work: list[float] = []
    t0 = time.monotonic()
    outcome = sweep.run_matrix(path, runs_dir=runs, run_id=run_id, executor=choose(gpus=slots), cache_dir=cache,
                               on_group=lambda job, result: work.append(result.timings.get("total", 0.0)))
    total = time.monotonic() - t0
    m = clock.marks
    makespan = m["last_result"] - m["submit"]
    bound = max(sum(work) / slots, max(work))
    cells = analysis.load_cells(outcome.run)
    started = sum(len(re.findall(r"Started server process \[\d+\]", p.read_text()))
                  for p in (outcome.run.root / "logs").glob("*.log"))
    return {"warmed": warm, "cells": len(cells), "keys": cells["server_key"].nunique(), "groups": len(work), "started": started,
            "total": total, "makespan": makespan, "bound": bound, "sum_work": sum(work), "longest": max(work),
            "p1": makespan / bound, "p1_total": total / bound, "overhead": total - makespan,
            "plan": m["enter"] - t0, "init": clock.cluster_timings.get("init", 0.0),
            "warm": clock.cluster_timings.get("warm", 0.0), "ready_to_submit": m["submit"] - m["ready"],
            "shutdown": m["closed"] - m["exit"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cold", action="store_true", help="alternate runs without the worker warm-up")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="sweep-fanout-"))
    try:
        path, runs, cache = matrix(tmp), tmp / "runs", tmp / "cache"
        sweep.make_plan(path, runs)  # makes the simulated history once, outside the timing
        rows = [one(path, runs, cache, args.slots, f"r{i}", warm=not (args.cold and i % 2))
                for i in range(args.runs)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r = rows[0]
    print(f"{r['cells']} cells, {r['keys']} server keys, {args.slots} slots, {len(rows)} runs "
          f"(1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)\n")
    print("| run | workers | makespan | Σ work / slots | longest group | P1 makespan ÷ bound | whole run ÷ bound | "
          "fixed overhead (plan + Ray start + warm-up + shutdown) | P2 servers started ÷ keys |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        print(f"| {i} | {'warmed up' if r['warmed'] else 'cold'} | {r['makespan']:.1f} s | {r['sum_work'] / args.slots:.1f} s | {r['longest']:.1f} s | "
              f"{r['p1']:.2f} | {r['p1_total']:.2f} | {r['overhead']:.1f} s ({r['plan']:.1f} + {r['init']:.1f} + "
              f"{r['warm']:.1f} + {r['shutdown']:.1f}) | {r['started']}/{r['keys']} = {r['started'] / r['keys']:.2f} |")
    for warm in (True, False):
        some = [r for r in rows if r["warmed"] == warm]
        if some:
            print(f"\n{'warmed up' if warm else 'cold'}: median P1 {statistics.median(r['p1'] for r in some):.2f}, "
                  f"whole run {statistics.median(r['total'] for r in some):.1f} s, "
                  f"fixed overhead {statistics.median(r['overhead'] for r in some):.1f} s", end="")
    print()


if __name__ == "__main__":
    main()
