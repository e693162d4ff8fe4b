"""What must hold at scale, with real parts: a burst of new connections to the simulator, caches
filled once under concurrency, Ray start-up retried and cleaned up."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sweeper.execute.replay import Request, run_replay

SIM = [sys.executable, "-m", "vllmsim"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _sim(tmp: Path, sim_yaml: dict[str, object]) -> Iterator[str]:
    tree = tmp / "tree"
    tree.mkdir()
    (tree / "sim.yaml").write_text(yaml.safe_dump(sim_yaml))
    port = _free_port()
    with (tmp / "sim.log").open("wb") as log:
        proc = subprocess.Popen([*SIM, "serve", "m", "--host", "127.0.0.1", "--port", str(port), "--api-key", "k"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "SWEEP_SIM_TREE": str(tree)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "sim.log").read_text()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "simulator never became healthy"
            time.sleep(0.05)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_burst_of_new_connections_loses_no_request(tmp_path: Path) -> None:
    """1,000 requests in bursts of 128 fresh connections (a new client per burst): every one is
    answered. With the stdlib's listen backlog of 5 the kernel drops connections and the replay
    records transport errors as failed samples of the configuration under test."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    requests = [Request("c", i, f"burst-{i}", body) for i in range(1000)]
    errors: list[str] = []
    with _sim(tmp_path, {"version": "0.28.0", "startup_s": 0.0, "token_latency_s": 0.0}) as url:
        for start in range(0, len(requests), 128):
            outcome = run_replay(url, "k", requests[start:start + 128], concurrency=128, timeout_s=60)
            assert outcome.aborted is None and outcome.unsent == 0
            errors += [r.error or "" for r in outcome.replies if r.http_status != 200]
    assert errors == []


HELP = "usage: vllm serve [-h] [--port PORT] [--max-model-len MAX_MODEL_LEN] [--api-key API_KEY]\n"
# A stand-in for `vllm serve --help` (and the environment's Python): it notes each run, and takes
# long enough that concurrent callers overlap.
FAKE = f"""#!{sys.executable}
import os, sys, time
with open(os.environ["RUNS_FILE"], "a") as f:
    f.write(str(os.getpid()) + "\\n")
time.sleep(1.5)
print({{"help": {HELP!r}}}.get("help") if "--help" in sys.argv else '{{"torch": "2.9.0", "cuda": null}}')
"""
CALLER = """
import json, sys
from sweeper.install.cache import Installed
from sweeper.execute import fingerprint
from sweeper.install.supported import supported_flags
fake, root = sys.argv[1], sys.argv[2]
inst = Installed(commit="c", sha=None, kind="preinstalled", launch=(fake,), python=fake, root=root)
flags = supported_flags(inst)
print(json.dumps({"flags": sorted(flags.flags), "torch": fingerprint.fingerprint(inst).torch_version}))
"""


def test_concurrent_groups_ask_one_environment_once(tmp_path: Path) -> None:
    """Six processes (Ray workers of one commit) learn the flags and the fingerprint of one
    environment at the same moment: `--help` and the probe each run once, all six get the answer."""
    fake = tmp_path / "fake-vllm"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    root = tmp_path / "env"
    root.mkdir()
    runs = tmp_path / "runs.txt"
    env = {**os.environ, "RUNS_FILE": str(runs)}
    procs = [subprocess.Popen([sys.executable, "-c", CALLER, str(fake), str(root)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
             for _ in range(6)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs.append(yaml.safe_load(out))
    assert all(o == outs[0] for o in outs)
    assert "--max-model-len" in outs[0]["flags"] and outs[0]["torch"] == "2.9.0"
    assert len(runs.read_text().split()) == 2  # one `--help`, one fingerprint probe


# Each scenario runs in its own Python: a Ray of its own (not the session's), and a process whose
# every child can be checked for afterwards.
RAY_SCRIPT = """
import json, os, sys, time
import psutil, ray
from sweeper.execute.ray_executor import Cluster
from sweeper.errors import ClusterError

mode = sys.argv[1]
real_init, temp_dirs = ray.init, []

def flaky_init(*args, **kwargs):
    # The failure seen on busy machines: Ray's processes are up, then the start fails.
    temp_dirs.append(kwargs.get("_temp_dir"))
    real_init(*args, **kwargs)
    if mode == "never" or len(temp_dirs) == 1:
        raise RuntimeError("Failed to register worker to Raylet: IOError: [RayletClient] Unable to register")

ray.init = flaky_init
out = {}
try:
    with Cluster(logical_gpus=4, num_cpus=1) as cluster:
        cluster.preflight(1)
        time.sleep(3)  # past Ray's idle-worker reaping (1 s): the warm workers must still be there

        @ray.remote(max_calls=0)
        def where(barrier):
            open(os.path.join(barrier, str(os.getpid())), "w").close()
            while len(os.listdir(barrier)) < 4:
                time.sleep(0.02)
            return os.getpid()

        barrier = os.path.join(temp_dirs[-1], "jobs")
        os.mkdir(barrier)
        pids = ray.get([where.options(num_gpus=1, num_cpus=0).remote(barrier) for _ in range(4)], timeout=120)
        out.update(warm=sorted(cluster.warm_pids), jobs=sorted(pids), timings=cluster.timings)
except ClusterError as exc:
    out["error"] = str(exc)
left = [p.pid for p in psutil.process_iter(["cmdline"])
        if any(d and d in " ".join(p.info["cmdline"] or ()) for d in temp_dirs)]
out.update(attempts=len(temp_dirs), dirs_left=[d for d in temp_dirs if os.path.exists(d)], processes_left=left)
print(json.dumps(out))
"""


def _ray_scenario(mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-c", RAY_SCRIPT, mode], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=280)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return yaml.safe_load(out.strip().splitlines()[-1])


@pytest.mark.full  # starts (and fails to start) real local Rays
def test_a_failed_ray_start_is_retried_and_leaves_nothing_behind() -> None:
    """The first start fails after Ray's processes are up: the cluster cleans that attempt up and
    starts again; every slot then has a worker started before any job, and the jobs run on them."""
    out = _ray_scenario("once")
    assert "error" not in out and out["attempts"] == 2
    assert len(out["warm"]) == 4 and out["jobs"] == out["warm"]
    assert out["dirs_left"] == [] and out["processes_left"] == []


@pytest.mark.full  # starts (and fails to start) real local Rays
def test_a_ray_that_never_starts_is_one_clear_error_and_leaves_nothing_behind() -> None:
    out = _ray_scenario("never")
    assert out["attempts"] == 3
    assert "could not start a local Ray cluster (3 attempts)" in str(out["error"])
    assert "Failed to register worker" in str(out["error"])
    assert out["dirs_left"] == [] and out["processes_left"] == []
