"""A failure is data: a group that raises, a missed /metrics scrape, a server whose owner dies."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import git, make_sim_repo

from sweeper.drivers.sweep import run_matrix
from sweeper.errors import MetricsError
from sweeper.execute import server_metrics as metrics
from sweeper.execute.server import ServerProcess, free_port
from sweeper.store import frames as analysis


@pytest.mark.usefixtures("ray_cluster")
def test_a_group_that_raises_is_error_rows_and_the_others_finish(tmp_path: Path, tiny_suite: Path) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("before", {})])
    # A commit whose sim.yaml is a folder: reading it raises inside the runner (an OSError, which
    # nothing there expects). Whatever a group raises, its cells say so and the sweep goes on.
    git(repo, "rm", "-q", "sim.yaml")
    (repo / "sim.yaml").mkdir()
    (repo / "sim.yaml" / "oops").write_text("x\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "planted")
    git(repo, "tag", "planted")
    git(repo, "rm", "-q", "-r", "sim.yaml")
    (repo / "sim.yaml").write_text("version: 0.29.0\nstartup_s: 0.1\ntoken_latency_s: 0.0002\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "after")
    git(repo, "tag", "after")
    path = tmp_path / "m.yaml"
    path.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {repo}}}\n"
                    "timeouts: {startup_s: 30, request_s: 10}\n"
                    "axes: {commit: [before, planted, after], spec_method: [none, mtp], num_speculative_tokens: [2]}\n")
    outcome = run_matrix(path, runs_dir=tmp_path / "runs", run_id="r")
    cells = analysis.load_cells(outcome.run).set_index("cell_id")
    samples = analysis.load_samples(outcome.run)
    assert len(cells) == 6 and len(outcome.ran) == 6
    bad = cells[cells.commit == "planted"]
    assert set(bad.status) == {"error"} and bad.server_starts.eq(0).all()
    assert bad.status_detail.str.startswith("IsADirectoryError: ").all()
    assert bad.log_tail.str.contains("Traceback").all() and bad.log_tail.str.contains("_sim_yaml").all()
    good = cells[cells.commit != "planted"]
    assert set(good.status) == {"ok"}
    assert len(samples) == 4 * 6 and set(samples.commit) == {"before", "after"}


def test_a_missed_scrape_leaves_the_spec_figures_empty_and_says_why(tmp_path: Path) -> None:
    with pytest.raises(MetricsError, match="GET /metrics failed: ConnectError"):
        metrics.scrape(f"http://127.0.0.1:{free_port()}", timeout=2)
    port = free_port()
    argv = [sys.executable, "-m", "vllmsim", "serve", "--model", "m", "--port", str(port), "--api-key", "k",
            "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    with ServerProcess(argv, dict(os.environ), port=port, log_path=tmp_path / "s.log", startup_timeout_s=60) as srv:
        with pytest.raises(MetricsError, match="HTTP 404"):
            metrics.scrape(srv.base_url + "/elsewhere", "k")
        before, after = metrics.try_scrape(srv.base_url, "k"), metrics.try_scrape(srv.base_url, "k")
    missed = metrics.try_scrape(srv.base_url, "k", timeout=2)  # the server is gone
    assert before.text and after.text and missed.text is None and "ConnectError" in missed.error
    figures, note = metrics.group_figures(before, after)
    assert figures["spec_drafts"] == 0 and note == ""
    # Without the scrape before, the counters after are totals since the server started: no figures.
    figures, note = metrics.group_figures(missed, after)
    assert figures == {} and note == f"spec-decode figures left empty: the scrape before the replay failed: {missed.error}"
    figures, note = metrics.group_figures(before, missed)
    assert figures == {} and "the scrape after the replay failed" in note
    figures, note = metrics.group_figures(before, metrics.Scrape("this is { not prometheus"))
    assert figures == {} and "is not Prometheus text" in note
    # The server gone: its status says so; nothing to add.
    assert metrics.group_figures(before, None) == ({}, "")


OWNER = """
import sys, time
from pathlib import Path
from sweeper.execute.server import ServerProcess
port, log = int(sys.argv[1]), Path(sys.argv[2])
srv = ServerProcess([sys.executable, "-m", "vllmsim", "serve", "--model", "m", "--port", str(port)],
                    {}, port=port, log_path=log, startup_timeout_s=60)
srv.__enter__()
print(srv.proc.pid, flush=True)
time.sleep(600)
"""


def test_a_server_does_not_outlive_the_process_that_started_it(tmp_path: Path) -> None:
    port = free_port()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(port), str(tmp_path / "s.log")],
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert owner.stdout is not None
        pgid = int(owner.stdout.readline())
        members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]
        assert len(members) == 3  # the guard, its watcher and the server
        owner.kill()  # as a Ray worker dies with its node: no chance to stop anything
        owner.wait()
        assert not _left_in_group(members, pgid, 15)
        assert "is gone: stopping this server" in (tmp_path / "s.log").read_text()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        with contextlib.suppress(OSError, UnboundLocalError):
            os.killpg(pgid, signal.SIGKILL)  # what a failing check would leave behind


@pytest.mark.usefixtures("ray_cluster")
def test_a_server_does_not_outlive_a_ray_worker_that_exits(tmp_path: Path) -> None:
    """When a worker exits, Ray SIGKILLs the worker's own children: the guard, with no chance to stop
    its server. The server hears of its guard's death at once and stops."""
    import ray

    @ray.remote(num_cpus=0)
    class Owner:
        def start(self, log: str) -> tuple[int, int]:
            port = free_port()
            srv = ServerProcess([sys.executable, "-m", "vllmsim", "serve", "m", "--host", "127.0.0.1", "--port",
                                 str(port)], dict(os.environ), port=port, log_path=Path(log), startup_timeout_s=60)
            srv.start()
            srv.wait_ready()
            assert srv.proc is not None
            self.srv = srv  # kept alive with the actor
            return srv.proc.pid, os.getpid()

    owner = Owner.remote()  # type: ignore[attr-defined]
    guard, worker = ray.get(owner.start.remote(str(tmp_path / "s.log")), timeout=120)
    members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == guard]
    assert len(members) == 3  # the guard, its watcher and the server
    ray.kill(owner)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(worker) and _pgid(worker) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _left_in_group(members, guard, 15)
    with contextlib.suppress(OSError):
        os.killpg(guard, signal.SIGKILL)  # what a failing check would leave behind
    assert not left


def test_the_guard_passes_the_servers_exit_on(tmp_path: Path) -> None:
    """The guard leads the server's session; the server's exit status (or signal) is its own."""
    for code, script in ((3, "raise SystemExit(3)"), (-signal.SIGKILL, "import os; os.kill(os.getpid(), 9)"),
                         (-signal.SIGTERM, "import os; os.kill(os.getpid(), 15)")):
        srv = ServerProcess([sys.executable, "-c", script], dict(os.environ), port=free_port(),
                            log_path=tmp_path / "x.log", startup_timeout_s=10)
        srv.start()
        assert srv.proc is not None and srv.proc.wait(timeout=30) == code
        srv.stop()


def test_a_server_that_ignores_term_is_killed_when_its_guard_is(tmp_path: Path) -> None:
    """Ray SIGKILLs the guard (the worker's own child) when the worker exits. A server stuck in its
    shutdown (it ignores TERM) must still go: the guard's watcher, which nothing outside kills, ends
    the group after the grace period."""
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    srv = ServerProcess([sys.executable, "-c", script], dict(os.environ), port=free_port(), log_path=tmp_path / "s.log",
                        startup_timeout_s=10, grace_s=2)
    srv.start()
    assert srv.proc is not None
    pgid = srv.proc.pid
    try:
        deadline = time.monotonic() + 20
        while "up" not in (tmp_path / "s.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]
        assert len(members) == 3  # the guard, its watcher and the server
        srv.proc.kill()  # what Ray does to a worker's children
        srv.proc.wait()
        assert not _left_in_group(members, pgid, 15)
        assert f"the guard of this server ({pgid}) is gone: stopping this server" in (tmp_path / "s.log").read_text()
    finally:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)  # what a failing check would leave behind


def test_a_server_starts_with_the_signals_a_shell_gives_it(tmp_path: Path) -> None:
    """A Ray worker runs its task with SIGINT blocked, and Python ignores SIGPIPE: through fork and
    exec a server would inherit both. A server with TERM blocked would not even hear the signal its
    guard's death sends; one started from a shell has nothing blocked and nothing ignored."""
    blocked = {signal.SIGINT, signal.SIGTERM}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        srv = ServerProcess(["sleep", "60"], dict(os.environ), port=free_port(), log_path=tmp_path / "s.log",
                            startup_timeout_s=10)
        srv.start()
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        assert srv.proc is not None
        status = _status_once_exec(srv.proc.pid, "sleep", 20)
        assert int(status["SigBlk"], 16) == 0
        assert int(status["SigIgn"], 16) == 0, status["SigIgn"]
    finally:
        srv.stop()


def _left_in_group(members: list[psutil.Process], pgid: int, timeout_s: float) -> list[int]:
    """The members still in process group `pgid` once it empties or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while (left := [p.pid for p in members if _pgid(p.pid) == pgid]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _status_once_exec(root: int, name: str, timeout_s: float) -> dict[str, str]:
    """/proc/PID/status of the descendant of `root` that has exec'd `name` (waits for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(root).children(recursive=True):
            with contextlib.suppress(OSError):
                lines = Path(f"/proc/{child.pid}/status").read_text().splitlines()
                status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
                if status.get("Name") == name:
                    return status
        time.sleep(0.05)
    raise AssertionError(f"no process under {root} ran {name} within {timeout_s:.0f}s")


def _pgid(pid: int) -> int | None:
    """The process group of a live process; None once it is gone (or a zombie waiting to be reaped)."""
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return None
        return os.getpgid(pid)
    except (ProcessLookupError, psutil.Error):
        return None


def test_the_folders_of_groups_whose_worker_died_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from sweeper.execute.runner import remove_orphan_workdirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"sweep-group-{gone.pid}-abc"
    live = tmp_path / f"sweep-group-{os.getpid()}-def"
    other = tmp_path / "sweep-group-notapid-x"
    for folder in (dead, live, other):
        (folder / "server.log").parent.mkdir()
        (folder / "server.log").write_text("log")
    assert remove_orphan_workdirs() == [dead]
    assert not dead.exists() and live.exists() and other.exists()


def test_the_guard_imports_the_standard_library_only() -> None:
    """The guard runs as `python -I -S guard.py` under whatever interpreter a node has: nothing of
    the sweeper nor of site-packages may be needed to start it."""
    import ast

    from sweeper.execute import server

    tree = ast.parse(server.GUARD.read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert names and names <= sys.stdlib_module_names | {"__future__"}, names - sys.stdlib_module_names
