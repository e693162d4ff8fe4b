"""Post-processing time per sample must not grow with the requests of a group.

    .venv/bin/python benchmarks/postprocess.py [--sizes 100,10000]

Runs one server group in-process (simulator server, real replay, real checks) per size and reads
the runner's own phase timings. Side by side on the same log, it times the per-sample scan the
runner used before the log index (`request_log_lines` over the whole log for each sample), on at
most `--scan-sample` samples, extrapolated to the group.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from sweeper.drivers.sweep import jobs_for, make_plan
from sweeper.execute.runner import run_group
from sweeper.store.run_folder import open_run
from sweeper.vllm import request_log_lines
from sweeper.vllm.logs import LogIndex

ROOT = Path(__file__).parent.parent
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
# A third of the structured-output requests fail with the FSM error line, as in the demo history.
SIM = {"version": "0.28.0", "startup_s": 0.1, "token_latency_s": 0.0,
       "bugs": [{"effect": "fsm_whitespace", "when": {"spec_method": ["mtp"]}, "rate": 0.33}]}


def sim_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "sim.yaml").write_text(yaml.safe_dump(SIM))
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "sim"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env)
    return path


def matrix(tmp: Path, repo: Path, requests: int) -> Path:
    suite = tmp / f"suite-{requests}.yaml"
    suite.write_text(yaml.safe_dump({
        "name": "pp", "defaults": {"repeat": requests, "body": {"max_tokens": 64, "temperature": 0}},
        "cases": [{"id": "invoice", "checks": ["http_ok", {"finish_reason": {"expected": ["stop", "length"]}},
                                                "json_schema", "no_whitespace_tail",
                                                {"log_absent": {"pattern": "Failed to advance FSM"}}],
                   "body": {"messages": [{"role": "user", "content": "Extract the invoice as JSON."}],
                            "response_format": {"type": "json_schema", "json_schema": {"name": "i", "schema": {
                                "type": "object", "properties": {"customer": {"type": "string"},
                                                                 "items": {"type": "array", "items": {"type": "string"}}},
                                "required": ["customer", "items"]}}}}}]}))
    path = tmp / f"pp-{requests}.yaml"
    path.write_text(yaml.safe_dump({
        "name": f"pp{requests}", "model": "m", "suite": str(suite), "install": {"kind": "sim", "repo": str(repo)},
        "concurrency": 16, "timeouts": {"startup_s": 30, "request_s": 30},
        "axes": {"commit": ["main"], "spec_method": ["mtp"], "num_speculative_tokens": [2]}}))
    return path


def one(tmp: Path, repo: Path, requests: int, scan_sample: int) -> dict[str, float]:
    runs = tmp / "runs"
    plan = make_plan(matrix(tmp, repo, requests), runs)
    run = open_run(runs, f"pp{requests}-{time.monotonic_ns()}", create=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    (job,) = jobs_for(plan, run, tmp / "cache")
    result = run_group(job)
    n = result.samples.num_rows
    assert n == requests, (n, requests)
    log = (run.logs / f"{job.group.group_id}.log").read_text().splitlines()
    ids = result.samples.column("request_id").to_pylist()
    k = min(scan_sample, n)
    t0 = time.perf_counter()
    for rid in ids[:k]:
        request_log_lines(log, rid)
    scan = (time.perf_counter() - t0) / k * n
    t0 = time.perf_counter()
    # As the runner indexes: only the runs holding one of the group's id prefixes.
    index = LogIndex(log, hints={"-".join(rid.split("-")[:3]) + "-" for rid in ids})
    for rid in ids:
        index.lines_for(rid)
    indexed = time.perf_counter() - t0
    return {"n": n, "post": result.timings["postprocess"], "replay": result.timings["replay"],
            "log_lines": len(log), "scan": scan, "indexed": indexed,
            "failed": n - sum(result.samples.column("passed").to_pylist())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,10000")
    ap.add_argument("--scan-sample", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        repo = sim_repo(tmp / "vllm")
        # A first group pays this process's one-time imports (pyarrow loads pandas when it builds the
        # first table); a Ray worker pays them in its warm-up, before any group.
        one(tmp, repo, 10, 10)
        rows = [one(tmp, repo, int(s), args.scan_sample) for s in args.sizes.split(",")]
    print("| requests in the group | log lines | failed | post-processing | per sample | "
          "per-sample log scan (before), extrapolated | one log index, all lookups (now) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['log_lines']:,} | {r['failed']:,} | {r['post']:.3f} s | "
              f"{1e3 * r['post'] / r['n']:.3f} ms | {r['scan']:.2f} s ({1e3 * r['scan'] / r['n']:.2f} ms/sample) | "
              f"{r['indexed']:.3f} s |")
    flat = (rows[-1]["post"] / rows[-1]["n"]) / (rows[0]["post"] / rows[0]["n"])
    print(f"\nper-sample post-processing, largest ÷ smallest group: {flat:.2f} "
          f"(1-minute load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
