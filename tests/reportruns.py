"""Runs the report tests share (made once per test run, whatever the number of xdist workers): the
demo matrix as shipped, and a small run of the demo history with secrets planted in its settings.
Import the fixtures into a test module; the tests only read these runs (a test writing beside them
gives its own run a name of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import filelock
import pytest

from sweeper.drivers.sweep import run_matrix
from sweeper.execute.choice import choose
from sweeper.store.run_folder import RunDir

ROOT = Path(__file__).resolve().parent.parent
# Planted in the matrix settings: must appear in no report.
TOKEN = "hf_PlantedSecretToken0123456789abcdef"
TOKEN_AXIS = "tok-PlantedAxisSecret-42x"
DEMO_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def report_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # Under xdist every worker has a base temp of its own inside one shared by the run: the runs are
    # made there, once, by whichever worker asks first (a demo run is 30-50 s of two busy cores).
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "report-runs"
    root.mkdir(exist_ok=True)
    yield root


def _once(root: Path, name: str, make: Callable[[], RunDir]) -> RunDir:
    """The run `name` under `root`, made by `make` unless a worker made it already (a marker file
    written after the run is complete; the lock keeps the others waiting meanwhile)."""
    done = root / f"{name}.done"
    with filelock.FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            run = make()
            done.write_text(str(run.root.relative_to(root)))
        return RunDir(root / done.read_text())


def _start_demo(root: Path) -> threading.Thread | None:
    """Start the demo run in the background unless a worker has (the `demo.started` marker). The
    thread returned reaps it and writes `demo.out` (exit code and piped output), then `demo.done`."""
    try:
        (root / "demo.started").touch(exist_ok=False)
    except FileExistsError:
        return None
    env = {**os.environ, "COLUMNS": "100", "SWEEP_CACHE": str(root / "cache")}
    env.pop("LINES", None)
    out, err = root / "demo.stdout", root / "demo.stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "sweeper", "matrix", str(ROOT / "matrices" / "demo.yaml"),
                                 "--runs-dir", str(root / "runs"), "--run-id", "demo", "--executor", "local"],
                                env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)

    def reap() -> None:
        try:
            code = proc.wait(timeout=DEMO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # its servers' guards stop them once it is gone
            code = proc.wait()
        (root / "demo.out").write_text(json.dumps([code, out.read_text() + err.read_text()]))
        (root / "demo.done").touch()

    thread = threading.Thread(target=reap, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="session", autouse=True)
def _demo_started_early(request: pytest.FixtureRequest, report_dirs: Path) -> Iterator[None]:
    """Where a test of this session reads the demo run, it starts with the session: its 25 s are
    mostly waits on simulated servers, which the first tests fill instead of a worker blocking."""
    wanted = any("demo_run" in getattr(item, "fixturenames", ()) for item in request.session.items)
    reaper = _start_demo(report_dirs) if wanted else None
    yield
    if reaper is not None:  # another worker may be waiting for it
        reaper.join()


@pytest.fixture(scope="session")
def demo_run(report_dirs: Path) -> RunDir:
    """`matrices/demo.yaml` exactly as shipped, its history and environments in the run's tmp; run as
    `sweep matrix matrices/demo.yaml --executor local` is typed, its output piped (COLUMNS=100) and kept
    for `demo_output` (tests/test_report_output.py checks that Ray gives the same results). Made once
    per test run, by whichever worker starts it first (usually as its session starts)."""
    reaper = _start_demo(report_dirs)
    deadline = time.monotonic() + DEMO_TIMEOUT_S + 60
    while not (report_dirs / "demo.done").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the shared demo run never finished")
        time.sleep(0.2)
    if reaper is not None:
        reaper.join()
    code, output = json.loads((report_dirs / "demo.out").read_text())
    if code != 0:  # every test reading the run would fail further from the cause
        raise RuntimeError(f"the shared demo run exited {code}:\n{output[-3000:]}")
    return RunDir(report_dirs / "runs" / "demo")


@pytest.fixture(scope="session")
def demo_output(demo_run: RunDir, report_dirs: Path) -> tuple[int, str]:
    """The exit code and the piped output (stdout, then stderr) of the command that made `demo_run`."""
    code, text = json.loads((report_dirs / "demo.out").read_text())
    return int(code), str(text)


@pytest.fixture(scope="session")
def secret_run(report_dirs: Path) -> RunDir:
    """The demo history at main, thinking-budget suite only, with a token in the env and in an axis."""
    def make() -> RunDir:
        path = report_dirs / "secret.yaml"
        path.write_text(f"""
name: secret
model: Qwen/Qwen3.5-35B-A3B
suite: {json.dumps(str(ROOT / "suites" / "thinking-budget.yaml"))}
install: {{kind: sim, repo: "sim:demo"}}
serve: {{--reasoning-parser: qwen3, --max-model-len: 32768}}
env: {{HF_TOKEN: "{TOKEN}"}}
concurrency: 4
timeouts: {{startup_s: 60, request_s: 30}}
axes:
  commit: [main]
  spec_method: [none, mtp]
  num_speculative_tokens: [4]
  env.VLLM_USE_V2_MODEL_RUNNER: ["0", "1"]
  env.SWEEP_TEST_SECRET_TOKEN: ["{TOKEN_AXIS}"]
""")
        return run_matrix(path, runs_dir=report_dirs / "secret-runs", run_id="secret", executor=choose("local"),
                          cache_dir=report_dirs / "cache").run
    return _once(report_dirs, "secret", make)
