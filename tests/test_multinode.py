"""Across nodes: worker nodes that cannot see the driver's disk, a node lost mid-sweep, `ray job submit`.

One local cluster for the module (`tests/multinode.py`): the head here, two worker nodes each in its
own mount namespace with tmpfs over this module's folder (matrices, suites, repositories, runs) and
over the environment caches, and a HOME of its own. Sweeps run as the `sweep` command line, a
driver of its own connecting to that cluster, as on a real one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import git, make_sim_repo
from multinode import NamespacedCluster, free_port, unshare_refused
from objectstore import BUCKET, names, s3fs

from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

# The full tier: several Ray nodes in namespaces.
pytestmark = pytest.mark.full

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "Glaiveai2K--generate_invoice_59ae297a.json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespacedCluster]:
    why = unshare_refused()
    if why:
        pytest.skip(f"worker nodes need their own mount namespace: {why}")
    root = tmp_path_factory.mktemp("multinode")
    caches = Path(os.environ["SWEEP_CACHE"]).parent  # the session's environment caches (conftest)
    c = NamespacedCluster(hide=[root, caches], workdir=root)
    try:
        c.start_head()
        c.wait_nodes(1)  # a worker node started before the head is registered gives up
        c.add_worker("w1")
        c.add_worker("w2")
        c.wait_nodes(3)
        yield c
    finally:
        c.close()
    assert c.servers() == []


@pytest.fixture(scope="module")
def files(cluster: NamespacedCluster) -> Path:
    """This module's driver-side folder: hidden on every worker node."""
    root = cluster.workdir
    (root / "suites" / "schemas").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "suites" / "schemas" / SCHEMA, root / "suites" / "schemas" / SCHEMA)
    (root / "suites" / "s.yaml").write_text(f"""
name: s
defaults: {{repeat: 2, body: {{max_tokens: 256, temperature: 0}}}}
cases:
  - id: invoice
    schema_file: schemas/{SCHEMA}
    body: {{messages: [{{role: user, content: "Make an invoice as JSON."}}]}}
    checks: [http_ok, json_schema]
  - id: hello
    body: {{messages: [{{role: user, content: "Say hello."}}]}}
""")
    return root


def sweep(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sweeper", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def check_run(cluster: NamespacedCluster, run: RunDir, groups: int, cells: int, samples_per_cell: int,
              nodes: tuple[str, ...] = ("w1", "w2")) -> tuple[pd.DataFrame, pd.DataFrame]:
    cell_rows = analysis.load_cells(run)
    samples = analysis.load_samples(run)
    assert len(cell_rows) == cells and set(cell_rows.status) == {"ok"}, cell_rows[["cell_id", "status", "status_detail"]]
    # Every group ran on a worker node (each has a host name of its own), never here.
    assert set(cell_rows.node) <= {cluster.hostname(n) for n in nodes}, set(cell_rows.node)
    assert len(samples) == cells * samples_per_cell
    assert not samples[["cell_id", "case_id", "repeat"]].duplicated().any()
    logs = sorted(run.logs.glob("*.log"))
    assert len(logs) == groups and {p.stem for p in logs} == set(cell_rows.group_id)
    for log in logs:
        assert log.read_text().count("vLLM API server version") == 1, log.name
    return cell_rows, samples


def sim_matrix(files: Path) -> Path:
    path = files / "matrices" / "sim.yaml"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text("""
name: sim
model: Qwen/Qwen3-8B
suite: ../suites/s.yaml
install: {kind: sim, repo: "sim:demo"}
concurrency: 4
timeouts: {startup_s: 60, request_s: 30}
axes:
  commit: [v0.27.0, main]
  spec_method: [none, mtp]
  num_speculative_tokens: [2]
""")
    return path


def test_a_sim_history_runs_on_nodes_that_cannot_see_the_driver(cluster: NamespacedCluster, files: Path) -> None:
    # RAY_ADDRESS, as inside a Ray job, names the cluster.
    done = sweep("matrix", str(sim_matrix(files)), "--runs-dir", str(files / "runs"), "--run-id", "sim",
                 env={**cluster.env, "RAY_ADDRESS": cluster.address})
    assert done.returncode == 0, done.stderr[-3000:]
    cells, samples = check_run(cluster, RunDir(files / "runs" / "sim"), groups=4, cells=4, samples_per_cell=4)
    # The suite travelled by value, its schema file included.
    invoice = samples[samples.case_id == "invoice"]
    assert invoice.passed.all() and invoice.content_tail.str.contains("{").all()
    assert cells.vllm_version.notna().all()
    assert cluster.wait_no_servers() == []


FAKE_VLLM = '''
import os, sys
PYTHON = {python!r}
def main():
    # The simulator, started as `vllm ...`: what a source install of vLLM gives.
    os.execv(PYTHON, [PYTHON, "-m", "vllmsim", *sys.argv[1:]])
'''
SETUP = '''
from setuptools import setup
setup(name="vllm", version=open("VERSION").read().strip(), py_modules=["fake_vllm"],
      entry_points={"console_scripts": ["vllm=fake_vllm:main"]})
'''


@pytest.mark.skipif(shutil.which("uv") is None, reason="install: source builds venvs with uv")
def test_a_source_install_of_a_local_repository_runs_on_such_nodes(cluster: NamespacedCluster, files: Path) -> None:
    repo = files / "vllm-src"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "setup.py").write_text(SETUP)
    (repo / "fake_vllm.py").write_text(FAKE_VLLM.format(python=sys.executable))
    for version in ("0.31.0", "0.32.0"):
        (repo / "VERSION").write_text(version)
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"release {version}")
        git(repo, "tag", f"v{version}")
    matrix = files / "matrices" / "source.yaml"
    matrix.parent.mkdir(exist_ok=True)
    matrix.write_text("""
name: source
model: Qwen/Qwen3-8B
suite: ../suites/s.yaml
install: {kind: source, repo: ../vllm-src}
timeouts: {startup_s: 60, request_s: 30}
axes: {commit: [v0.31.0, v0.32.0], spec_method: [none]}
""")
    done = sweep("matrix", str(matrix), "--runs-dir", str(files / "runs"), "--run-id", "source",
                 "--address", cluster.address, env=cluster.env)
    assert done.returncode == 0, done.stderr[-3000:]
    cells, _ = check_run(cluster, RunDir(files / "runs" / "source"), groups=2, cells=2, samples_per_cell=4)
    assert dict(zip(cells.commit, cells.vllm_version, strict=True)) == {"v0.31.0": "0.31.0", "v0.32.0": "0.32.0"}
    assert cluster.wait_no_servers() == []


def test_ray_job_submit_of_the_demo_writes_its_run_to_object_storage(cluster: NamespacedCluster,
                                                                      s3: dict[str, str]) -> None:
    """The README's command: the repository as the job's working dir, the demo as its entrypoint, the
    runs dir in S3 (moto on 127.0.0.1), credentials given to the job as a user gives them."""
    runs = f"s3://{BUCKET}/cluster/runs"
    credentials = {k: v for k, v in s3.items() if k != "port"}
    done = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", cluster.dashboard,
                           "--working-dir", str(ROOT), "--runtime-env-json", json.dumps({"env_vars": credentials}),
                           "--", "sweep", "matrix", "matrices/demo.yaml", "--runs-dir", runs, "--run-id", "job"],
                          env=cluster.env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"results: {runs}/job" in done.stdout
    # Read back by hand, through pyarrow's own S3 client: every cell ran on a worker node, every
    # sample is there once, and every server's log reached the bucket.
    fs = s3fs(s3)
    prefix = f"{BUCKET}/cluster/runs/job"
    cells = pd.read_parquet(f"{prefix}/cells", filesystem=fs)
    samples = pd.read_parquet(f"{prefix}/samples", filesystem=fs)
    assert len(cells) == 48 and set(cells.status) == {"ok"}, cells[["cell_id", "status", "status_detail"]]
    assert set(cells.node) <= {cluster.hostname("w1"), cluster.hostname("w2")}, set(cells.node)
    assert cells.group_id.nunique() == 24
    assert len(samples) == cells.n_samples.sum() and not samples[["cell_id", "case_id", "repeat"]].duplicated().any()
    assert not samples.passed.all() and samples.groupby("cell_id").passed.all().any()  # the demo's bugs, and clean cells
    logs = [n for n in names(fs, f"{prefix}/logs") if n.endswith(".log")]
    assert sorted(n.removesuffix(".log") for n in logs) == sorted(set(cells.group_id))
    assert fs.open_input_stream(f"{prefix}/logs/{logs[0]}").read().decode().count("vLLM API server version") == 1
    # `sweep report` reads it there.
    report = sweep("report", "--runs-dir", runs, env={**cluster.env, **credentials}, timeout=120)
    assert (report.returncode, report.stderr) == (0, ""), report.stderr[-2000:]
    assert "run job" in report.stdout
    assert cluster.wait_no_servers() == []


def test_a_lost_node_is_retried_elsewhere_and_every_row_is_stored_once(cluster: NamespacedCluster,
                                                                       files: Path) -> None:
    """Also: the repository is a URL (a git daemon here), which each node clones into its own cache."""
    # Last in this module: it loses one of its two worker nodes.
    victim = cluster.namespace("w2")
    repo = files / "slow"
    # ~3 s of replay per group: long enough to lose a node under running groups.
    history = [(f"c{i}", {"token_latency_s": 0.004}) for i in range(6)]
    make_sim_repo(repo, history)
    port = free_port()
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}", "--export-all",
                               f"--base-path={files}", str(repo)], start_new_session=True, stderr=subprocess.DEVNULL)
    matrix = files / "matrices" / "lost.yaml"
    matrix.parent.mkdir(exist_ok=True)
    matrix.write_text(yaml.safe_dump({
        "name": "lost", "model": "m", "suite": "../suites/s.yaml",
        "install": {"kind": "sim", "repo": f"git://127.0.0.1:{port}/slow"},
        "concurrency": 1, "timeouts": {"startup_s": 60, "request_s": 30},
        "axes": {"commit": [t for t, _ in history], "spec_method": ["none"]}}))
    err = files / "lost.err"
    with open(err, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "sweeper", "matrix", str(matrix), "--runs-dir",
                                 str(files / "runs"), "--run-id", "lost", "--address", cluster.address],
                                env=cluster.env, stdout=subprocess.DEVNULL, stderr=f)
    try:
        deadline = time.monotonic() + 180
        while not any(_namespace(p.pid) == victim for p in cluster.servers()):
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, "no server ever ran on the node to lose"
            time.sleep(0.1)
        cluster.kill("w2")
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()
    assert proc.returncode == 0, err.read_text()[-3000:]
    run = RunDir(files / "runs" / "lost")
    cells, _ = check_run(cluster, run, groups=6, cells=6, samples_per_cell=4)
    retried = json.loads(run.manifest_path.read_text())["retried"]
    assert retried and all(r["attempt"] == 2 and r["group_id"].startswith("c") for r in retried), retried
    assert any(word in retried[0]["error"] for word in ("NodeDied", "WorkerCrashed", "died")), retried
    # Retried on the node that is left.
    assert set(cells[cells.group_id.isin([r["group_id"] for r in retried])].node) == {cluster.hostname("w1")}
    # The lost node's servers stopped with their workers.
    assert cluster.wait_no_servers() == []


def _namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None
