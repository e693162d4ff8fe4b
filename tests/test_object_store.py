"""Runs in object storage: `--runs-dir s3://bucket/prefix` against a real S3 endpoint on 127.0.0.1
(moto's standalone server, started and stopped here; the clients are the real pyarrow ones).

A sweep writes there, is killed mid-way, is resumed exactly once, and is then read back by
`sweep report`, `sweeper.store.frames`, bisect's reuse of stored samples, and pandas through pyarrow's
S3 filesystem.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pyarrow.fs as pafs
import pytest
from conftest import make_sim_repo
from objectstore import BUCKET, names, s3fs

# The full tier: a moto S3 server and a killed Ray run.
pytestmark = pytest.mark.full

pytest.importorskip("moto", reason="moto[server] (a dev extra) runs the local S3 endpoint")


def sweep_cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sweeper", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)


def sim_servers_of(tmp_path: Path) -> list[int]:
    """Simulator servers started from this test's files (there must be none left)."""
    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("SWEEP_SIM_TREE") and str(tmp_path) in " ".join(proc.cmdline()):
                alive.append(proc.pid)
        except psutil.Error:
            continue
    return alive


@pytest.mark.timeout(600)
def test_a_run_in_s3_killed_resumed_and_read_back(s3: dict[str, str], tmp_path: Path, tiny_suite: Path) -> None:
    from sweeper.bisect.select import select_cells
    from sweeper.drivers.bisect_evidence import Target, load_evidence
    from sweeper.install.matrix_loader import load_matrix
    from sweeper.judge import modes as fm
    from sweeper.spec.suite import load_suite
    from sweeper.store import frames as analysis
    from sweeper.store.catalogue import RunCatalogue
    from sweeper.store.run_folder import RunDir

    repo = tmp_path / "vllm"
    history = [(f"c{i}", {"token_latency_s": 0.01}) for i in range(6)]
    shas = make_sim_repo(repo, history)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {repo}}}\n"
                      "concurrency: 2\ntimeouts: {startup_s: 60, request_s: 20}\n"
                      f"axes:\n  commit: [{', '.join(t for t, _ in history)}]\n  spec_method: [none, mtp]\n"
                      "  num_speculative_tokens: [2]\n")
    runs = f"s3://{BUCKET}/team/runs"
    env = {**os.environ, **{k: v for k, v in s3.items() if k != "port"}, "RAY_ADDRESS": ""}
    fs = s3fs(s3)
    prefix = f"{BUCKET}/team/runs/r"

    # A bucket that does not exist: one line, exit 1.
    proc = sweep_cli("matrix", str(matrix), "--runs-dir", "s3://no-such-bucket/runs", "--run-id", "r", env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.startswith("error: s3://no-such-bucket/runs") and err.count("\n") == 1, err

    # Written, then the whole driver (and its Ray) killed mid-run.
    proc = sweep_cli("matrix", str(matrix), "--runs-dir", runs, "--run-id", "r", "--gpus", "2", env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len([n for n in names(fs, f"{prefix}/cells") if n.endswith(".parquet")]) < 2:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = [n for n in names(fs, f"{prefix}/cells") if n.endswith(".parquet")]
    assert 2 <= len(done_before) < 12

    # Resumed once: only the groups without results run.
    proc = sweep_cli("matrix", str(matrix), "--runs-dir", runs, "--resume", "r", "--gpus", "2", env=env)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    assert f"{len(done_before)} server groups already had results" in out
    assert f"results: {runs}/r" in out
    assert sim_servers_of(tmp_path) == []

    # pandas through pyarrow's S3 filesystem: every row exactly once.
    samples = pd.read_parquet(f"{prefix}/samples", filesystem=fs)
    assert len(samples) == 12 * 2 * 3
    assert not samples[["cell_id", "case_id", "repeat"]].duplicated().any()
    assert len(pd.read_parquet(f"{prefix}/cells", filesystem=fs)) == 12
    every = [i.path for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True))]
    assert not [p for p in every if p.endswith(".tmp")]
    logs = [n for n in names(fs, f"{prefix}/logs") if n.endswith(".log")]
    assert len(logs) == 12
    log = fs.open_input_stream(f"{prefix}/logs/{logs[0]}").read().decode()
    assert log.count("vLLM API server version") == 1

    # sweep report, with the heatmap (DuckDB over the S3 files).
    proc = sweep_cli("report", "--runs-dir", runs, "--heatmap", str(tmp_path / "h.png"), env=env)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err, out) == (0, "", f"heatmap: {tmp_path / 'h.png'}\n"), err
    assert (tmp_path / "h.png").stat().st_size > 1000
    proc = sweep_cli("report", "--runs-dir", runs, env=env)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, ""), err
    assert "run r" in out and out.count("c5") >= 2
    proc = sweep_cli("runs", "check", "--runs-dir", runs, env=env)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, "run r: sound (12 groups)\n", "")

    # sweeper.store.frames, from the URI (with its endpoint in the query, which is never shown).
    uri = f"s3://{BUCKET}/team/runs?endpoint_override=127.0.0.1:{s3['port']}&scheme=http"
    run = analysis.latest_run(uri)
    assert run.run_id == "r" and run.uri == f"{runs}/r" and run == RunDir(f"{runs}/r")
    mine = analysis.load_samples(run)
    assert sorted(mine["request_id"]) == sorted(samples["request_id"])
    counts = analysis.failure_counts(run, ["commit"])
    assert counts["n"].sum() == 12 * 2 * 3 and set(counts["commit"]) == set(shas)

    # Each group in the run's catalogue, as the bucket lists it (nothing to index again).
    catalogue = RunCatalogue.stored(run.location)
    assert len(catalogue.entries) == 24 and not catalogue.reconcile()

    # Bisect's reuse of stored samples: every (cell, commit) found, one server start each.
    m = load_matrix(matrix)
    suite = load_suite(tiny_suite)
    targets = [Target(c) for c in select_cells(m, [])]
    load_evidence(runs, targets, suite, set(shas.values()), fm.check_labels(suite), "another-run")
    assert len(targets) == 2
    for t in targets:
        assert set(t.evidence) == set(shas.values())
        assert all(len(e.starts) == 1 and len(e.starts[0].sets) == 6 and e.starts[0].reused
                   for e in t.evidence.values())
