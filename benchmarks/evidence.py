"""A bisect's stored evidence against the size of the runs folder: files opened and time.

    .venv/bin/python benchmarks/evidence.py --unrelated 0,50,200 [--rows-per-group 2000]

Writes, through the store, one run holding the bisected cells of `matrices/demo.yaml` at 8 commits,
then adds unrelated runs (other settings and commits, 4 groups each) and reads the evidence with
`sweeper.drivers.bisect_evidence.load_evidence` (through each run's catalogue) and, side by side, with
`analysis.read_runs` (every file of every run, projection and filter pushed down: the read before
the catalogue). Each read runs in this process through a pyarrow filesystem that counts the Parquet
files opened; the first read after new runs also indexes nothing (the store catalogued them).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the counting filesystem the tests use
from countingfs import Counting


def write_run(runs: Path, run_id: str, settings: list[str], shas: list[str], digest: str, rows: int) -> None:
    from sweeper.store.manifest import SweepManifest
    from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, table

    run = RunDir(runs / run_id)
    run.write_manifest(SweepManifest(run_id=run_id))
    for s, key in enumerate(settings):
        for c, sha in enumerate(shas):
            group = f"g{s}-{c}"
            common = {"run_id": run_id, "group_id": group, "cell_id": f"{group}-cell", "server_key": group,
                      "settings_key": key, "commit": sha[:8], "commit_sha": sha, "suite_digest": digest}
            n = rows
            samples = pa.table({**{k: pa.repeat(pa.scalar(v, SAMPLE_SCHEMA.field(k).type), n) for k, v in common.items()},
                                "case_id": pa.repeat(pa.scalar("structured-output/invoice"), n),
                                "passed": pa.array([i % 3 != 0 for i in range(n)]),
                                "failed_checks": pa.array([["json_schema"] if i % 3 == 0 else [] for i in range(n)],
                                                          pa.list_(pa.string()))})
            samples = pa.table([samples.column(f.name) if f.name in samples.column_names else pa.nulls(n, f.type)
                                for f in SAMPLE_SCHEMA], schema=SAMPLE_SCHEMA)
            failed = int(pc.sum(pc.invert(samples.column("passed"))).as_py())
            cells = table([{**common, "status": "ok", "n_samples": n, "n_failed": failed}], CELL_SCHEMA)
            run.write_group(group, samples, cells)


def read(runs: Path, how: str, targets: list[Any], suite: Any, shas: list[str]) -> tuple[float, int, int]:
    """(seconds, Parquet files opened, sample rows found) of one evidence read."""
    from sweeper.drivers.bisect_evidence import Target, load_evidence
    from sweeper.judge import modes as fm
    from sweeper.store import frames as analysis
    from sweeper.store.location import Location

    handler = Counting()
    where = Location(pafs.PyFileSystem(handler), str(runs), str(runs), False)
    fresh = [Target(t.cell) for t in targets]
    t0 = time.perf_counter()
    if how == "catalogue":
        load_evidence(where, fresh, suite, set(shas), fm.check_labels(suite), "bench")
        found = sum(len(st.sets) for t in fresh for ev in t.evidence.values() for st in ev.starts)
    else:
        expr = (pc.field("suite_digest") == suite.digest) & pc.field("settings_key").isin(
            pa.array([t.settings_key for t in targets])) & pc.field("commit_sha").isin(pa.array(shas))
        analysis.read_runs(where, "cells", ["run_id", "group_id", "status"], expr)
        found = analysis.read_runs(where, "samples", ["run_id", "group_id", "case_id", "failed_checks"], expr).num_rows
    return time.perf_counter() - t0, len(handler.parquet()), found


def main() -> None:
    from sweeper.bisect.select import select_cells
    from sweeper.drivers.bisect_evidence import Target
    from sweeper.install.matrix_loader import load_matrix
    from sweeper.spec.suite import load_suites

    ap = argparse.ArgumentParser()
    ap.add_argument("--unrelated", default="0,50,200")
    ap.add_argument("--rows-per-group", type=int, default=2000)
    args = ap.parse_args()
    matrix = load_matrix(ROOT / "matrices" / "demo.yaml")
    targets = [Target(c) for c in select_cells(matrix, [])]
    suite = load_suites(tuple((ROOT / "matrices" / p).resolve() for p in matrix.spec.suite))
    shas = [f"{i:040x}" for i in range(1, 9)]
    base = Path(tempfile.mkdtemp(prefix="sweep-evidence-"))
    try:
        runs = base / "runs"
        write_run(runs, "matching", [t.settings_key for t in targets[:2]], shas, suite.digest, args.rows_per_group)
        written = 0
        print("| unrelated runs | Parquet files under runs/ | read | files opened | time | sample rows found |\n"
              "|---|---|---|---|---|---|")
        for count in (int(n) for n in args.unrelated.split(",")):
            for i in range(written, count):
                write_run(runs, f"other-{i:04d}", [f"elsewhere-{i}", targets[0].settings_key],
                          [f"{i + 1000:040x}", f"{i + 5000:040x}"], suite.digest, args.rows_per_group)
            written = max(written, count)
            total = sum(1 for _ in runs.glob("*/*/*.parquet"))
            for how in ("catalogue", "every file"):
                seconds, opened, found = read(runs, how, targets, suite, shas)
                print(f"| {count} | {total} | {how} | {opened} | {seconds:.2f} s | {found:,} |", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
