"""Shared fixtures: one real local Ray for the session, git repositories of simulated vLLM commits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.pop("RAY_ADDRESS", None)
# Output widths are the tests' own choice (a test that needs one sets COLUMNS): not the invoking
# terminal's, nor the COLUMNS=80 that pytest-xdist's workers are given.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# Every environment the tests build goes to one temp folder of this session, never the user's cache:
# set before any Ray worker or subprocess starts, so they all inherit it.
_CACHE_ROOT = Path(tempfile.mkdtemp(prefix="sweep-test-cache-"))
os.environ["SWEEP_CACHE"] = str(_CACHE_ROOT / "envs")
_USER_CACHE = Path.home() / ".cache" / "sweep"


_REPO = Path(__file__).resolve().parent.parent


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.is_dir() else set()


def _repo_files() -> set[str]:
    """Files in the checkout that git neither tracks nor ignores (runs/ is ignored)."""
    try:
        out = subprocess.run(["git", "-C", str(_REPO), "status", "--porcelain", "--untracked-files=all"],
                             capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line[3:] for line in out.stdout.splitlines() if line.startswith("??")} if out.returncode == 0 else set()


# The full tier: what needs a real Ray, several nodes, the real vLLM CPU build, or many generated
# inputs. The fast tier (`bash scripts/test --fast`, i.e. `-m "not full"`) runs everything else,
# the drivers through the in-process executor; `.ci/run` runs both.
FULL_FIXTURES = {"ray_cluster"}
FULL_MARKERS = {"ray", "vllm", "full"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    full = Counter[Path]()
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if uses & FULL_FIXTURES or {m.name for m in item.iter_markers()} & FULL_MARKERS:
            item.add_marker(pytest.mark.full)
            full[item.path] += 1
    # Files with the most full-tier tests (the end-to-end drivers, a minute each) first: the xdist
    # workers take files in this order, so the long ones start at once and the many short files
    # fill the gaps after them. A stable sort: each file's own tests keep their order.
    items.sort(key=lambda item: -full[item.path])


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _listing(_USER_CACHE)
    session.config.stash[_REPO_BEFORE] = _repo_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_CACHE_ROOT, ignore_errors=True)
    # A test that writes outside its temp folders (and runs/) fails the run, however green it was.
    for where, new in ((_USER_CACHE, _listing(_USER_CACHE) - session.config.stash.get(_BEFORE, set())),
                       (_REPO, _repo_files() - session.config.stash.get(_REPO_BEFORE, set()))):
        if new:
            shown = sorted(new)
            print(f"\nerror: the tests wrote into {where}: {', '.join(shown[:5])}{' ...' if len(shown) > 5 else ''}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

_BEFORE = pytest.StashKey[set[str]]()
_REPO_BEFORE = pytest.StashKey[set[str]]()
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
FAST = {"startup_s": 0.1, "token_latency_s": 0.0002}


def servers_left() -> list[psutil.Process]:
    """Servers (simulator or vLLM, and their guards) that this session started and that still run:
    they carry the session's SWEEP_CACHE in their environment, on any node of any cluster here."""
    mine, out = os.environ["SWEEP_CACHE"], []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "serve" in (proc.info["cmdline"] or []) and proc.environ().get("SWEEP_CACHE") == mine:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def describe(proc: psutil.Process) -> str:
    """What a leftover server was doing: enough to find the path that left it (parent, state, age,
    signal masks, the end of its log, which is its standard output)."""
    try:
        head = (f"{proc.pid} ppid={proc.ppid()} {proc.status()} age={time.time() - proc.create_time():.0f}s "
                f"{' '.join(proc.cmdline())[:160]}")
    except psutil.Error as exc:
        return f"{proc.pid} ({exc})"
    try:
        masks = [ln for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if ln.startswith("Sig")]
        log = os.readlink(f"/proc/{proc.pid}/fd/1")
        lines = Path(log).read_text(errors="replace").splitlines()[-15:] if os.path.isfile(log) else []
    except OSError as exc:
        return f"{head}\n  ({exc})"
    return "\n  ".join([head, " ".join(masks), f"log {log}:", *lines])


@pytest.fixture(autouse=True)
def _no_server_outlives_its_test() -> Iterator[None]:
    """A server left running after its test is that test's failure: orphan servers hold ports,
    memory and CPU, and they hide the bug that left them (a guard or a stop that did not work)."""
    yield
    deadline = time.monotonic() + 20  # guards stop their servers with a grace period
    while (left := servers_left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        shown = [describe(proc) for proc in left]
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                continue
        pytest.fail("servers left running after the test (now killed):\n" + "\n".join(shown), pytrace=False)


def wait_for_files(folder: Path, n: int, proc: subprocess.Popen[str], timeout: float) -> None:
    """Until `folder` holds `n` Parquet files (results a running sweep or bisect wrote), while `proc`
    still runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(list(folder.glob("*.parquet"))) < n:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """A real S3 endpoint on 127.0.0.1 for the module (`objectstore.moto_s3`)."""
    from objectstore import moto_s3, moto_server

    server = moto_server()
    if server is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    with moto_s3(server) as env:
        yield env


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def starts_in_logs(root: Path) -> int:
    """Servers that bound their port, as the logs under `root` tell it: one "Starting vLLM API server"
    per server. A process stopped because another server took the port chosen for it never binds
    (the runner moves it to a fresh port and does not count it), though it may print its banner."""
    return sum(p.read_text().count("Starting vLLM API server") for p in root.glob("**/logs/*.log"))


def make_sim_repo(repo: Path, commits: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """A simulated vLLM history: one commit per (tag, sim.yaml content); returns tag -> sha."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    shas = {}
    for i, (tag, sim) in enumerate(commits):
        (repo / "sim.yaml").write_text(yaml.safe_dump({"version": f"0.{27 + i}.0", **FAST, **sim}))
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"commit {tag} (#{1000 + i})")
        git(repo, "tag", tag)
        shas[tag] = git(repo, "rev-parse", "HEAD")
    return shas


ENGINE_DEAD = {"id": "engine-dead", "effect": "crash", "when": {"spec_method": ["mtp"]},
               "message": "TypeError: Cannot inspect kernel parameters for function"}


def crash_history(root: Path, suite: Path, commits: int, *, crash_from: int, after_requests: int,
                  crash_until: int | None = None) -> dict[str, str]:
    """A simulated history (v0.27.0, c1, c2, ...) whose engine dies under MTP after `after_requests`
    requests from commit `crash_from` on (until `crash_until`, which is fixed), and `root/m.yaml`:
    one MTP cell over its two ends. Returns tag -> sha."""
    crash = {**ENGINE_DEAD, "after_requests": after_requests}
    tags = ["v0.27.0", *(f"c{i}" for i in range(1, commits))]
    until = commits if crash_until is None else crash_until
    shas = make_sim_repo(root / "vllm", [(t, {"bugs": [crash] if crash_from <= i < until else []})
                                         for i, t in enumerate(tags)])
    (root / "m.yaml").write_text(f"""
name: crash
model: Qwen/Qwen3-8B
suite: {suite}
install: {{kind: sim, repo: {root / "vllm"}}}
timeouts: {{startup_s: 30, request_s: 10}}
axes:
  commit: [v0.27.0, {tags[-1]}]
  spec_method: [mtp]
  num_speculative_tokens: [2]
""")
    return shas


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray with 4 logical GPU slots, shared by the tests (start-up costs seconds)."""
    import ray

    tmp = tempfile.mkdtemp(prefix="/tmp/sweep-ray-t")
    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=tmp, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


SUITE = """
name: tiny
defaults:
  repeat: 3
  body: {max_tokens: 64, temperature: 0}
  checks: [http_ok, {finish_reason: {expected: [stop, tool_calls]}}, json_schema, no_whitespace_tail,
           {log_absent: {pattern: "Failed to advance FSM"}}]
cases:
  - id: invoice
    body:
      messages: [{role: user, content: "Extract the invoice as JSON."}]
      response_format:
        type: json_schema
        json_schema:
          name: invoice
          schema:
            type: object
            properties:
              customer: {type: string}
              items: {type: array, items: {type: object, properties: {sku: {type: string}, qty: {type: integer}},
                                            required: [sku, qty]}}
            required: [customer, items]
  - id: event
    body:
      messages: [{role: user, content: "Make an event with attendees."}]
      response_format:
        type: json_schema
        json_schema:
          name: event
          schema:
            type: object
            properties:
              title: {type: string}
              attendees: {type: array, items: {type: string}}
            required: [title, attendees]
"""


@pytest.fixture
def tiny_suite(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(SUITE)
    return path


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`sweep ARGV` in this process: (exit code, stdout, stderr)."""
    from sweeper import cli

    old, code = sys.argv, 0
    sys.argv = ["sweep", *argv]
    try:
        cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return code, captured.out, captured.err
