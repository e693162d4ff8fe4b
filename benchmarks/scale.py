"""P6: results at 1 M and 10 M sample rows — write, load, failure pivot, `sweep report`, heatmap.

    .venv/bin/python benchmarks/scale.py --rows 1000000,10000000 [--dir /tmp/sweep-scale] [--repeat 3]

Writes a synthetic run through the store (the declared schema, one Parquet file per server group:
2,000 cells = 50 commits x 5 spec methods x 2 runners x 4 temperatures, 4 cells per group), then
runs each step in a fresh child process and reports its wall time and peak RSS (`wait4`). Side by
side: the pandas loader against a plain Arrow -> pandas read, and the failure pivot in pandas against
DuckDB. Steps that hold every sample in pandas are skipped above `--pandas-max` rows (at 10 M they
need more memory than this machine has to spare).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent
COMMITS = [f"c{i:02d}" for i in range(50)]
SPECS = [("none", None), ("ngram", 4), ("mtp", 4), ("eagle", 4), ("eagle3", 4)]
RUNNERS = ["0", "1"]
TEMPERATURES = [0, 0.3, 0.7, 1.0]
CONTENT = ['{"customer": "Dana Whitfield", "items": [{"sku": "KB-ERGO", "qty": 3}, {"sku": "DOCK-C", "qty": 2}]}',
           '{"title": "Quarterly planning", "attendees": [' + " " * 150,
           '{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}']


def generate(runs_dir: Path, rows: int, seed: int = 0) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from sweeper.spec.matrix import canonical
    from sweeper.store.manifest import SweepManifest
    from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, table

    rng = np.random.default_rng(seed)
    run = RunDir(runs_dir / "scale")
    shutil.rmtree(run.root, ignore_errors=True)
    cells_total = len(COMMITS) * len(SPECS) * len(RUNNERS) * len(TEMPERATURES)
    per_cell = max(1, rows // cells_total)
    run.write_manifest(SweepManifest(run_id="scale", commits=dict.fromkeys(COMMITS), matrix={"axes": {"commit": COMMITS}},
                                     suite="synthetic", suite_digest="0" * 64))
    fields = {f.name: f.type for f in SAMPLE_SCHEMA}
    for ci, commit in enumerate(COMMITS):
        for spec, nst in SPECS:
            for runner in RUNNERS:
                group = f"{commit}-{spec}-r{runner}"
                cell_ids, axes, cell_rows = [], [], []
                for t in TEMPERATURES:
                    values = {"commit": commit, "spec_method": spec, "env.VLLM_USE_V2_MODEL_RUNNER": runner,
                              "request.temperature": t, **({"num_speculative_tokens": nst} if nst else {})}
                    cell_ids.append(f"{group}-t{t}")
                    axes.append([(k, canonical(v)) for k, v in values.items()])
                n = per_cell * len(TEMPERATURES)
                cell_of = np.repeat(np.arange(len(TEMPERATURES)), per_cell)
                # A regression at commit 30 for mtp with the V2 runner; a little noise elsewhere.
                rate = 0.33 if (spec == "mtp" and runner == "1" and ci >= 30) else 0.01
                passed = rng.random(n) >= rate
                failed = ~passed
                k = 2 * failed.astype(np.int32)
                offsets = pa.array(np.concatenate([[0], np.cumsum(k)]).astype(np.int32))
                names = pa.array(np.tile(["json_schema", "log_absent"], int(failed.sum())))
                cells_arr = pa.array(cell_ids)
                cell_col = pc.take(cells_arr, pa.array(cell_of))
                axis_keys = [k for k, _ in axes[0]]
                axis_items = pa.array([v for a in axes for _, v in a])
                per = len(axis_keys)
                ax_idx = (cell_of[:, None] * per + np.arange(per)[None, :]).ravel()
                const = {"run_id": "scale", "group_id": group, "server_key": group, "settings_key": f"{spec}-{runner}",
                         "commit": commit, "commit_sha": f"{ci:040x}", "spec_method": spec, "suite": "synthetic",
                         "suite_digest": "0" * 64, "vllm_version": "0.28.0"}
                data = {name: pa.repeat(pa.scalar(v, fields[name]), n) for name, v in const.items()}
                data.update({
                    "cell_id": cell_col,
                    "num_speculative_tokens": pa.repeat(pa.scalar(nst, pa.int32()), n),
                    "async_scheduling": pa.nulls(n, pa.bool_()), "attention_backend": pa.nulls(n, pa.string()),
                    "axes": pa.MapArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * per),
                                                    pa.array(np.tile(axis_keys, n)), pc.take(axis_items, pa.array(ax_idx))),
                    "case_id": pc.take(pa.array(["invoice", "event", "tool"]), pa.array(rng.integers(0, 3, n))),
                    "repeat": pa.array(np.arange(n, dtype=np.int32) % per_cell),
                    "request_id": pc.binary_join_element_wise(cell_col, pc.cast(pa.array(np.arange(n)), pa.string()), "-"),
                    "passed": pa.array(passed),
                    "failed_checks": pa.ListArray.from_arrays(offsets, names),
                    "check_details": pa.MapArray.from_arrays(offsets, names, pa.repeat(pa.scalar("whitespace after ':'"), len(names))),
                    "finish_reason": pc.take(pa.array(["stop", "length"]), pa.array(failed.astype(np.int64))),
                    "prompt_tokens": pa.array(rng.integers(50, 400, n).astype(np.int32)),
                    "completion_tokens": pa.array(rng.integers(20, 512, n).astype(np.int32)),
                    "reasoning_tokens": pa.nulls(n, pa.int32()),
                    "latency_s": pa.array(rng.gamma(2.0, 0.4, n)), "ttft_s": pa.array(rng.gamma(2.0, 0.05, n)),
                    "http_status": pa.repeat(pa.scalar(200, pa.int32()), n), "error": pa.nulls(n, pa.string()),
                    "content_tail": pc.take(pa.array(CONTENT), pa.array(rng.integers(0, len(CONTENT), n))),
                    "log_errors": pa.ListArray.from_arrays(
                        pa.array(np.concatenate([[0], np.cumsum(failed)]).astype(np.int32)),
                        pa.repeat(pa.scalar("ERROR 11-29 08:16:41 [backend_xgrammar.py:167] Failed to advance FSM"),
                                  int(failed.sum()))),
                    "started_at": pa.array((1_790_000_000_000 + np.arange(n) * 37).astype("datetime64[ms]"),
                                           pa.timestamp("ms", tz="UTC")),
                })
                samples = pa.table([data[f.name] for f in SAMPLE_SCHEMA], schema=SAMPLE_SCHEMA)
                for j, cid in enumerate(cell_ids):
                    nf = int(failed[cell_of == j].sum())
                    cell_rows.append({"run_id": "scale", "group_id": group, "cell_id": cid, "server_key": group,
                                      "commit": commit, "spec_method": spec, "num_speculative_tokens": nst,
                                      "axes": axes[j], "status": "ok", "n_samples": per_cell, "n_failed": nf,
                                      "failure_rate": nf / per_cell, "failed_checks": [("json_schema", nf)] if nf else [],
                                      "effective_differs": []})
                run.write_group(group, samples, table(cell_rows, CELL_SCHEMA))
    return run.root


# ---- the steps, each run in a child process -------------------------------------------------------

def step(name: str, runs_dir: Path) -> dict[str, object]:
    from sweeper.reports import tables as report
    from sweeper.store import frames as analysis
    from sweeper.store.run_folder import RunDir

    run = RunDir(runs_dir / "scale")
    t0 = time.perf_counter()
    out: dict[str, object] = {}
    if name == "load":
        df = analysis.load_samples(run)
        out["rows"] = len(df)
    elif name == "load-arrow":
        import pyarrow.parquet as pq
        out["rows"] = len(pq.read_table(run.root / "samples").to_pandas())
    elif name == "load-cell":
        import pyarrow.compute as pc
        df = analysis.load_samples(run, filter=pc.field("cell_id") == "c31-mtp-r1-t0")
        out["rows"] = len(df)
    elif name == "pivot-pandas":
        pivot = report.failure_pivot(analysis.load_samples(run), ["commit"], ["spec_method", "env.VLLM_USE_V2_MODEL_RUNNER"])
        out["cells"] = int(pivot.size)
    elif name == "pivot-duckdb":
        by = ["commit", "spec_method", "env.VLLM_USE_V2_MODEL_RUNNER"]
        pivot = report.failure_pivot(analysis.failure_counts(run, by), ["commit"], by[1:])
        out["cells"] = int(pivot.size)
    else:
        raise SystemExit(f"unknown step {name}")
    out["seconds"] = time.perf_counter() - t0
    return out


def child(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, out


def measure(rows: int, base: Path, pandas_max: int, repeat: int) -> list[tuple[str, str, str, str]]:
    runs = base / f"rows-{rows}"
    me = [sys.executable, __file__, "--runs-dir", str(runs)]
    results = []
    wall, rss, _ = child([*me, "--generate", str(rows)])
    size = sum(p.stat().st_size for p in (runs / "scale" / "samples").glob("*.parquet"))
    results.append(("write (store, 500 files)", f"{wall:.1f} s", f"{rss:,.0f} MB", f"{size / 2**20:,.0f} MB on disk"))
    steps = [("load-cell", "one cell's samples, filter pushed down"),
             ("pivot-duckdb", "failure pivot, DuckDB counts")]
    if rows <= pandas_max:
        steps = [("load-arrow", "plain Arrow -> pandas read"), ("load", "analysis.load_samples"), *steps,
                 ("pivot-pandas", "failure pivot, pandas over load_samples")]
    for name, label in steps:
        wall, rss, out = child([*me, "--step", name])
        info = json.loads(out.strip().splitlines()[-1])
        results.append((label, f"{wall:.1f} s", f"{rss:,.0f} MB", f"{info['seconds']:.2f} s inside"))
    sweep = [sys.executable, "-m", "sweeper", "report", "scale", "--runs-dir", str(runs)]
    png = base / f"heatmap-{rows}.png"
    heatmap = [*sweep, "--heatmap", str(png), "--rows", "commit", "--cols", "spec_method,env.VLLM_USE_V2_MODEL_RUNNER"]
    for label, argv in (("`sweep report` (2,000 cells: the 200 that fail most)", sweep),
                        ("`sweep report --all` (every cell)", [*sweep, "--all"]),
                        ("`sweep report --heatmap` (map axis)", heatmap)):
        runs_of = [child(argv) for _ in range(repeat)]
        walls = sorted(w for w, _, _ in runs_of)
        note = (f"{len(runs_of[-1][2].splitlines())} lines" if argv is not heatmap else f"{png.stat().st_size:,} B png")
        shown = f"{walls[0]:.1f} s" if repeat == 1 else f"{walls[len(walls) // 2]:.1f} s (median of {repeat}: " \
            + ", ".join(f"{w:.1f}" for w, _, _ in runs_of) + ")"
        results.append((label, shown, f"{max(r for _, r, _ in runs_of):,.0f} MB",
                        f"{note}; load {os.getloadavg()[0]:.1f}"))
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000000,10000000")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/sweep-scale"))
    ap.add_argument("--pandas-max", type=int, default=2_000_000)
    ap.add_argument("--keep", action="store_true", help="keep the generated runs")
    ap.add_argument("--repeat", type=int, default=1, help="run each `sweep report` step this many times")
    ap.add_argument("--runs-dir", type=Path)
    ap.add_argument("--generate", type=int)
    ap.add_argument("--step")
    args = ap.parse_args()
    if args.generate:
        generate(args.runs_dir, args.generate)
        return
    if args.step:
        print(json.dumps(step(args.step, args.runs_dir)))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        for rows in (int(r) for r in args.rows.split(",")):
            print(f"\n{rows:,} sample rows (1-minute load average {os.getloadavg()[0]:.1f} at the start, "
                  f"{os.cpu_count()} cores)\n\n| step | wall (child process) | peak RSS | note |\n|---|---|---|---|")
            for row in measure(rows, args.dir, args.pandas_max, args.repeat):
                print("| " + " | ".join(row) + " |", flush=True)
            if not args.keep:
                shutil.rmtree(args.dir / f"rows-{rows}", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
