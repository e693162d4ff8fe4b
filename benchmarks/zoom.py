"""Covering designs with and without the zoom against the full product, on planted histories.

    nice -n 19 .venv/bin/python benchmarks/zoom.py --seeds 50 --procs 2 --json /tmp/zoom-bench.json
    .venv/bin/python benchmarks/zoom.py --seeds 2 --families 6ax-2t --real   # the simulator's servers
    .venv/bin/python benchmarks/zoom.py --seeds 20 --procs 2 --repeat 50 --arms full,zoom,adaptive

Each history (`benchmarks/planted.py`: one conjunction of 1-3 terms over 6 or 8 server axes) is run
once per arm, each a real `sweep matrix` run into its own run folder: the full product (`full`), a
covering design of strength 3 without the zoom (`covering`), the same design with the zoom (`zoom`),
and the zoom with cells that stop when settled (`adaptive`: `--adaptive`, its default rule). The
suite is two cases `--repeat` times each (4: 8 requests a cell, fewer than the 32 clean samples that
settle an adaptive cell; the adaptive arm wants a suite of the demo's length). Servers are modelled in
process (`benchmarks/modelled.py`) unless `--real` starts the simulator's own servers (the local
executor). Per run: server starts counted from its server logs, requests counted from its samples,
GPU-hours modelled under the profile below, and the explanation over every phase (`sweep report
--explain`): a conjunction is named when a mode is explained (significant, no aliases), and named
exactly when its terms are the planted ones. Printed as markdown; `--json` keeps every history.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import planted
from modelled import BANNER, Modelled

from sweeper.drivers.sweep import ZoomOptions, run_matrix
from sweeper.judge.explain import Verdict
from sweeper.reports import tables as report
from sweeper.spec.matrix import DesignSpec
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

# The GPU profile the GPU-hours are modelled under (the example for a large model).
START_S, INSTALL_S, REQUEST_S = 240.0, 90.0, 1.0
ARMS = ("full", "covering", "zoom", "adaptive", "whole-adaptive", "again")
# Arms run as the full product: `whole-adaptive` with `--adaptive` (its cells' verdicts are compared
# with the full product's, cell by cell), `again` a second full product on other draws (how often two
# whole runs agree, the reference for that comparison).
WHOLE = ("full", "whole-adaptive", "again")


def starts_in_logs(run: RunDir) -> int:
    return sum(p.read_text(errors="replace").count(BANNER) for p in (run.root / "logs").glob("*.log"))


def cell_verdicts(run: RunDir) -> dict[str, bool]:
    """Each cell's verdict, failing or not: a failed sample or a server that did not serve (an adaptive
    cell that stopped clean after a failure or two is clean: its rule's verdict)."""
    cells = analysis.load_cells(run)
    out = {}
    for r in cells.to_dict("records"):
        stop = r.get("stop_reason")
        failed = r["status"] != "ok" or (r["n_failed"] > 0 and stop != "clean")
        out[str(r["cell_id"])] = bool(failed)
    return out


def named(run: RunDir) -> list[list[str]] | None:
    """The conjunctions the run's explanation names (explained modes), or None when it names none."""
    modes = report.explain_run(run).modes
    out = [sorted(f"{t.axis}={t.value}" for t in m.terms) for m in modes if m.verdict is Verdict.EXPLAINED]
    return sorted(out) or None


def one(task: tuple[str, int, bool, int, tuple[str, ...]]) -> dict[str, Any]:
    family, seed, real, repeat, arms = task
    history = planted.draw(family, seed)
    # On tmpfs where there is one: the store fsyncs every file, which is not what is measured here.
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="zoom-bench-", dir=shm if shm.is_dir() else None))
    os.environ["SWEEP_CACHE"] = str(folder / "cache")
    try:
        matrix = planted.write(history, folder, repeat)
        row: dict[str, Any] = {"family": family, "seed": seed, "effective": history.effective,
                               "flaky": history.flaky, "rate": history.bug["rate"],
                               "truth": sorted(f"{a}={v}" for a, v in history.truth)}
        verdicts: dict[str, dict[str, bool]] = {}
        for arm in arms:
            t0 = time.monotonic()
            spec = DesignSpec(kind="full") if arm in WHOLE else DesignSpec(kind="covering", strength=3, seed=seed)
            if real:
                from sweeper.execute.choice import choose

                factory: Any = choose("local")
            else:
                def factory(_matrix: Any, s: int = seed * 7919 + ARMS.index(arm)) -> Modelled:
                    return Modelled(s)
            outcome = run_matrix(matrix, runs_dir=folder / "runs", run_id=arm, executor=factory,
                                 cache_dir=folder / "cache", design_spec=spec,
                                 zoom_options=ZoomOptions(enabled=arm in ("zoom", "adaptive")),
                                 adaptive=arm in ("adaptive", "whole-adaptive"))
            run = outcome.run
            starts = starts_in_logs(run)
            requests = len(analysis.load_table(run, "samples", ["cell_id"]))
            installs = len({c for c in analysis.load_table(run, "cells", ["commit"]).column("commit").to_pylist()})
            names = named(run)
            row[arm] = {"starts": starts, "requests": requests, "phases": len(outcome.phases),
                        "gpu_h": (starts * START_S + installs * INSTALL_S + requests * REQUEST_S) / 3600,
                        "named": names, "exact": names == [row["truth"]], "s": round(time.monotonic() - t0, 2)}
            if arm in WHOLE:
                verdicts[arm] = cell_verdicts(run)
        for arm in ("whole-adaptive", "again"):
            if arm in verdicts and "full" in verdicts:
                full = verdicts["full"]
                row[arm]["cells"] = len(full)
                row[arm]["cells_same"] = sum(full[c] == verdicts[arm].get(c) for c in full)
        for arm in ("zoom", "adaptive"):
            if arm in row and "full" in row:
                row["same" if arm == "zoom" else "same_adaptive"] = row[arm]["named"] == row["full"]["named"]
        return row
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def table(rows: list[dict[str, Any]]) -> str:
    arms = [a for a in ARMS if all(a in r for r in rows)]
    names = " / ".join(arms)
    head = [f"| family | histories | starts {names} |"]
    if {"full", "zoom"} <= set(arms):
        head.append(" fewer starts (full ÷ zoom) |")
    head.append(f" requests {names} | GPU-h {names} | named exactly {names} |")
    head += [f" {a} names what full names |" for a in ("zoom", "adaptive") if {"full", a} <= set(arms)]
    out = ["".join(head), "|---" * ("".join(head).count("|") - 1) + "|"]
    for family in sorted({r["family"] for r in rows}):
        rs = [r for r in rows if r["family"] == family]

        def mean(arm: str, key: str, rs: list[dict[str, Any]] = rs) -> float:
            return sum(r[arm][key] for r in rs) / len(rs)

        def share(arm: str, rs: list[dict[str, Any]] = rs) -> str:
            return f"{100 * sum(r[arm]['exact'] for r in rs) / len(rs):.0f} %"

        cols = [family, str(len(rs)), " / ".join(f"{mean(a, 'starts'):.1f}" for a in arms)]
        if {"full", "zoom"} <= set(arms):
            cols.append(f"{mean('full', 'starts') / mean('zoom', 'starts'):.1f}×")
        cols += [" / ".join(f"{mean(a, 'requests'):.0f}" for a in arms),
                 " / ".join(f"{mean(a, 'gpu_h'):.2f}" for a in arms), " / ".join(share(a) for a in arms)]
        cols += [f"{100 * sum(r[k] for r in rs) / len(rs):.0f} %" for a, k in (("zoom", "same"), ("adaptive", "same_adaptive"))
                 if {"full", a} <= set(arms)]
        out.append("| " + " | ".join(cols) + " |")
    return "\n".join(out)


def cells_table(rows: list[dict[str, Any]]) -> str:
    """Per-cell verdicts of the full product run with `--adaptive` against the full product's, and of a
    second full product (the reference: what a whole replay's own noise allows)."""
    rows = [r for r in rows if "whole-adaptive" in r and "full" in r]
    if not rows:
        return ""
    again = all("again" in r for r in rows)
    out = ["| family | histories | cells | verdict as the full product's, adaptive | "
           + ("a second full product agrees | " if again else "")
           + "requests full / adaptive | fewer requests | starts full / adaptive |",
           "|---|---|---|---|" + ("---|" if again else "") + "---|---|---|"]
    for family in sorted({r["family"] for r in rows}):
        rs = [r for r in rows if r["family"] == family]
        cells = sum(r["whole-adaptive"]["cells"] for r in rs)
        same = sum(r["whole-adaptive"]["cells_same"] for r in rs)
        full_req = sum(r["full"]["requests"] for r in rs)
        ad_req = sum(r["whole-adaptive"]["requests"] for r in rs)
        worst = min(r["whole-adaptive"]["cells_same"] / r["whole-adaptive"]["cells"] for r in rs)
        cols = [family, str(len(rs)), f"{cells:,}", f"{same / cells:.2%} (worst history {worst:.2%})"]
        if again:
            cols.append(f"{sum(r['again']['cells_same'] for r in rs) / sum(r['again']['cells'] for r in rs):.2%}")
        starts = [sum(r[a]["starts"] for r in rs) / len(rs) for a in ("full", "whole-adaptive")]
        cols += [f"{full_req / len(rs):,.0f} / {ad_req / len(rs):,.0f}", f"{1 - ad_req / full_req:.0%}",
                 f"{starts[0]:.0f} / {starts[1]:.0f}"]
        out.append("| " + " | ".join(cols) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--families", default=",".join(planted.FAMILIES))
    parser.add_argument("--procs", type=int, default=1, help="at most 2 on a shared machine")
    parser.add_argument("--real", action="store_true", help="the simulator's own servers (slow)")
    parser.add_argument("--repeat", type=int, default=4, help="each of the suite's two cases this many times")
    parser.add_argument("--arms", default="full,covering,zoom", help=f"a subset of {','.join(ARMS)}")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--table", type=Path, help="only print the table of a file of rows (one JSON a line, "
                                                    "what a run prints on stderr)")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for line in args.table.read_text().splitlines() if line.startswith("{")]
        print(table(rows))
        print("\n" + cells_table(rows))
        print(f"\n{len(rows)} histories")
        return
    # Seed-major: a run cut short has every family at nearly the same count.
    arms = tuple(a for a in ARMS if a in args.arms.split(","))
    tasks = [(f, s, args.real, args.repeat, arms) for s in range(args.first_seed, args.first_seed + args.seeds)
             for f in args.families.split(",")]
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    if args.procs > 1:
        with mp.get_context("spawn").Pool(min(args.procs, 2)) as pool:
            for row in pool.imap_unordered(one, tasks):
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    else:
        for task in tasks:
            rows.append(one(task))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    print("\n" + cells_table(rows))
    print(f"\n{len(rows)} histories in {time.monotonic() - t0:.0f} s "
          f"({'simulator servers' if args.real else 'modelled servers'}); GPU profile: {START_S:g} s per start, "
          f"{INSTALL_S:g} s per install, {REQUEST_S:g} s per request; {2 * args.repeat} requests a cell")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
