"""`sweep matrix` end to end: real local Ray, real simulator servers, a git history made here, real Parquet."""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import psutil
import pytest
from conftest import make_sim_repo, wait_for_files

from sweeper.drivers.sweep import run_matrix
from sweeper.execute import ray_executor as cluster
from sweeper.execute.server import ServerProcess
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

STRICT_FSM = {"effect": "fsm_whitespace", "when": {"spec_method": ["mtp"], "strict_tool_calling": True}, "rate": 0.5}

HISTORY = [
    ("good", {}),
    ("flaky", {"bugs": [STRICT_FSM]}),
    ("refuse", {"bugs": [{"effect": "refuse_start", "message": "CUDA error: no kernel image"}]}),
    ("slow", {"startup_s": 1000}),
    ("crash", {"bugs": [{"effect": "crash", "after_requests": 2}]}),
    ("hang", {"bugs": [{"effect": "hang"}]}),
    ("broken", {"install": "fail: no wheel for this commit"}),
]


def matrix_file(tmp_path: Path, suite: Path, repo: Path, commits: list[str], extra_axes: str = "") -> Path:
    # The timeouts are loose for a simulator (its start is well under a second when the machine is
    # idle): on a loaded machine a start of 4 s once failed a good commit's server.
    path = tmp_path / "m.yaml"
    path.write_text(f"""
name: t
model: Qwen/Qwen3-8B
suite: {suite}
install: {{kind: sim, repo: {repo}}}
env: {{VLLM_ENFORCE_STRICT_TOOL_CALLING: "1"}}
concurrency: 2
timeouts: {{startup_s: 15, request_s: 5}}
axes:
  commit: {json.dumps(commits)}
  spec_method: [none, mtp]
  num_speculative_tokens: [2]
{extra_axes}""")
    return path


def server_groups_alive(run: RunDir) -> list[int]:
    """Processes that still write into this run (a server's output goes to its log under
    `logs/`): there must be none once the run is over."""
    alive = []
    for proc in psutil.process_iter():
        try:
            if any(f.path.startswith(str(run.root)) for f in proc.open_files()):
                alive.append(proc.pid)
        except psutil.Error:
            continue
    return alive


def test_a_live_server_of_the_run_is_seen(tmp_path: Path) -> None:
    """The check above can fail: a server writing its log into the run is found while it runs."""
    run = RunDir(tmp_path / "run")
    server = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), port=0,
                           log_path=run.logs / "g.log", startup_timeout_s=1, grace_s=1)
    server.start()
    try:
        assert server_groups_alive(run) == [server.proc.pid]
    finally:
        server.stop()
    assert server_groups_alive(run) == []


@pytest.mark.usefixtures("ray_cluster")
def test_every_cell_status_one_server_per_key_and_parquet(tmp_path: Path, tiny_suite: Path) -> None:
    repo = tmp_path / "vllm"
    shas = make_sim_repo(repo, HISTORY)
    path = matrix_file(tmp_path, tiny_suite, repo, [t for t, _ in HISTORY], "  request.temperature: [0, 0.5]\n")
    outcome = run_matrix(path, runs_dir=tmp_path / "runs", run_id="r1")
    run = outcome.run
    cells = analysis.load_cells(run)
    samples = analysis.load_samples(run)
    assert len(cells) == 7 * 2 * 2
    # Request-level axes reuse the server: 14 server keys, one start each where the install worked.
    assert len(outcome.ran) == 14
    assert cells.groupby("group_id")["cell_id"].nunique().eq(2).all()
    logs = {log.stem: log.read_text() for log in (run.root / "logs").glob("*.log")}
    assert len(logs) == 12  # the broken commit never got a server
    for gid, text in logs.items():
        # One banner per key; one more for a process stopped because another server (another test's,
        # under xdist) took the port chosen for it: the log names the move, and it is not a start.
        assert 1 <= text.count("vLLM API server version") <= 1 + text.count("starting again on port"), gid
    assert cells.loc[cells.commit == "broken", "server_starts"].eq(0).all()
    assert cells.loc[cells.commit != "broken", "server_starts"].eq(1).all()
    # The runner's counts, once per group, are the servers started: 12 for 28 cells.
    assert analysis.server_starts(cells) == len(logs)

    status = cells.groupby("commit")["status"].agg(lambda s: sorted(set(s)))
    assert status.to_dict() == {"good": ["ok"], "flaky": ["ok"], "refuse": ["server_failed"],
                                "slow": ["server_failed"], "crash": ["crashed"], "hang": ["timeout"],
                                "broken": ["install_failed"]}
    refused = cells[cells.commit == "refuse"].iloc[0]
    assert "CUDA error: no kernel image" in refused.log_tail and "exited with code" in refused.status_detail
    assert "not healthy after 15s" in cells[cells.commit == "slow"].iloc[0].status_detail
    assert "no wheel for this commit" in cells[cells.commit == "broken"].iloc[0].status_detail

    ok = samples[samples.commit.isin(["good", "flaky"])]
    assert len(ok) == 2 * 2 * 2 * 2 * 3  # commits x spec x temperature x cases x repeats
    assert ok[(ok.commit == "good") | (ok.spec_method == "none")].passed.all()
    flaky = ok[(ok.commit == "flaky") & (ok.spec_method == "mtp")]
    assert 0 < (~flaky.passed).sum() < len(flaky)
    broken = flaky[~flaky.passed].iloc[0]
    assert set(broken.failed_checks) >= {"no_whitespace_tail", "log_absent"}
    assert broken.finish_reason == "length" and "Failed to advance FSM" in broken.log_errors[0]
    assert (samples.commit_sha.dropna().isin(shas.values())).all()
    assert (ok["request.temperature"].isin([0, 0.5])).all()
    crash = cells[cells.commit == "crash"]
    assert crash.n_samples.sum() >= 2

    # Failure rates carry Wilson intervals around the observed rate.
    row = cells[(cells.commit == "flaky") & (cells.spec_method == "mtp")].iloc[0]
    assert row.ci_low < row.failure_rate < row.ci_high
    # pandas and DuckDB read the same rows from the Parquet files.
    assert len(pd.read_parquet(run.root / "samples")) == len(samples)
    con = analysis.duckdb_connect(tmp_path / "runs")
    assert con.execute("select count(*) from samples").fetchone()[0] == len(samples)
    assert duckdb.sql(f"select count(*) from read_parquet('{run.root}/cells/*.parquet')").fetchall()[0][0] == 28
    assert server_groups_alive(run) == []
    # The analysis notebook runs on these results and draws its heatmap.
    run_notebook(Path(__file__).parent.parent / "notebooks" / "failure-rates.ipynb", run.root)


def sweep_cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sweeper", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)  # type: ignore[call-overload]


def six_commits(tmp_path: Path, suite: Path) -> tuple[Path, Path, dict[str, str]]:
    """A 12-cell matrix over six commits slow enough (~10 ms a token) to interrupt mid-run: (matrix
    file, runs folder, environment of a driver that starts its own local Ray)."""
    repo = tmp_path / "vllm"
    history = [(f"c{i}", {"token_latency_s": 0.01}) for i in range(6)]
    make_sim_repo(repo, history)
    return matrix_file(tmp_path, suite, repo, [t for t, _ in history]), tmp_path / "runs", \
        {**os.environ, "RAY_ADDRESS": ""}


@pytest.mark.full  # `sweep matrix` on Ray in a subprocess, stopped mid-run
def test_resume_after_a_killed_run_gives_exactly_once_rows(tmp_path: Path, tiny_suite: Path) -> None:
    path, runs, env = six_commits(tmp_path, tiny_suite)
    proc = sweep_cli("matrix", str(path), "--runs-dir", str(runs), "--run-id", "r", "--gpus", "2", env=env)
    cells_dir = runs / "r" / "cells"
    wait_for_files(cells_dir, 2, proc, 120)
    # Kill the whole driver (and its Ray) at once, mid-run, as a lost machine would.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = proc.pid
    assert glob.glob(f"{cluster.RAY_TMP_PREFIX}{killed}-*")  # its local Ray's folder, left behind
    done_before = {p.name for p in cells_dir.glob("*.parquet")}
    assert 2 <= len(done_before) < 12
    proc = sweep_cli("matrix", str(path), "--runs-dir", str(runs), "--resume", "r", "--gpus", "2", env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"{len(done_before)} server groups already had results" in out
    run = RunDir(runs / "r")
    samples = analysis.load_samples(run)
    keys = samples[["cell_id", "case_id", "repeat"]]
    assert not keys.duplicated().any()
    assert len(samples) == 12 * 2 * 3
    assert len(list(cells_dir.glob("*.parquet"))) == 12
    assert not list(run.root.rglob("*.tmp"))
    assert server_groups_alive(run) == []
    # The next local cluster removed the killed driver's.
    assert not glob.glob(f"{cluster.RAY_TMP_PREFIX}{killed}-*")


@pytest.mark.full  # `sweep matrix` on Ray in a subprocess, stopped mid-run
def test_ctrl_c_stores_nothing_under_way_and_names_the_resume_command(tmp_path: Path, tiny_suite: Path) -> None:
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group (the driver and its local
    Ray). The run keeps every finished group whole, no server is left, and the command it prints
    finishes the run with every row once."""
    path, runs, env = six_commits(tmp_path, tiny_suite)
    # SIGINT as a shell gives it (a test runner may have it ignored, and children inherit that).
    tmp = tmp_path / "tmp"  # the workers' temp folder (they inherit the driver's environment)
    tmp.mkdir()
    env["TMPDIR"] = str(tmp)
    proc = subprocess.Popen([sys.executable, "-m", "sweeper", "matrix", str(path), "--runs-dir", str(runs), "--run-id",
                             "r", "--gpus", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    cells_dir = runs / "r" / "cells"
    wait_for_files(cells_dir, 2, proc, 120)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"interrupted: {runs / 'r'} keeps what finished"), err[-2000:]
    command = last.split("`")[1]
    assert command == f"sweep matrix {path} --runs-dir {runs} --resume r"
    run = RunDir(runs / "r")
    stored = analysis.load_cells(run)
    assert 2 <= len(stored) < 12 and set(stored.status) == {"ok"}, stored[["cell_id", "status", "status_detail"]]
    assert not list(run.root.rglob("*.tmp"))
    # The printed command, as printed, finishes the run.
    done = subprocess.run([sys.executable, "-m", "sweeper", *shlex.split(command)[1:], "--gpus", "2"], capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    samples = analysis.load_samples(run)
    assert len(samples) == 12 * 2 * 3 and not samples[["cell_id", "case_id", "repeat"]].duplicated().any()
    assert set(analysis.load_cells(run).status) == {"ok"}
    # The interrupted groups' folders went with their workers' clean-up or the next run's.
    assert not list(tmp.glob("sweep-group-*"))


def test_bad_matrix_is_one_line_and_exit_1(tmp_path: Path, tiny_suite: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"model: m\nsuite: {tiny_suite}\ninstall: {{kind: sim}}\naxes:\n  spec_method: [none, mtp]\n"
                    "  num_speculative_tokens: [0]\n")
    proc = sweep_cli("matrix", str(path), "--dry-run")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.strip() == f"error: {path}:6: axes.num_speculative_tokens[0]: expected a positive integer, got 0"
    assert "Traceback" not in err


def test_dry_run_groups_cells_by_server(tmp_path: Path, tiny_suite: Path) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, HISTORY[:2])
    path = matrix_file(tmp_path, tiny_suite, repo, ["good", "flaky"], "  request.temperature: [0, 0.5]\n")
    proc = sweep_cli("matrix", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines()[0] == "t: 8 cells on 4 servers, 6 requests per cell (suite tiny)"
    assert out.count("server ") == 4 and "spec mtp x2" in out and "[temperature=0.5]" in out
    assert not (tmp_path / "runs" / "t").exists()


def run_notebook(path: Path, run_dir: Path, env: dict[str, str] | None = None) -> None:
    """Execute the notebook on `run_dir` (named by SWEEP_RUN, or by the variables in `env`)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = env if env is not None else {"SWEEP_RUN": str(run_dir)}
    old = {k: os.environ.get(k) for k in ("SWEEP_RUN", "SWEEP_RUNS", "SWEEP_RUNS_DIR")}
    for k in old:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    assert (run_dir / "heatmap.png").stat().st_size > 1000


def test_the_notebook_finds_the_runs_where_the_cli_does(tmp_path: Path, tiny_suite: Path) -> None:
    """SWEEP_RUNS_DIR, the variable of every command's --runs-dir, is the notebook's too."""
    from sweeper.execute.choice import choose

    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("main", {})])
    path = tmp_path / "m.yaml"
    path.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {repo}}}\n"
                    "timeouts: {startup_s: 30, request_s: 10}\naxes: {commit: [main], spec_method: [none, mtp]}\n")
    run = run_matrix(path, runs_dir=tmp_path / "runs", run_id="r", executor=choose("local"),
                     cache_dir=tmp_path / "cache").run
    run_notebook(Path(__file__).parent.parent / "notebooks" / "failure-rates.ipynb", run.root,
                 env={"SWEEP_RUNS_DIR": str(tmp_path / "runs")})


def test_a_crash_on_the_last_request_is_a_crash(tmp_path: Path, tiny_suite: Path) -> None:
    """The server answers the last request with a 500 and exits just after: the replay is over by
    then, and the group is still a crash, not a run with a few server errors."""
    from sweeper.drivers.sweep import jobs_for, make_plan
    from sweeper.execute.runner import run_group
    from sweeper.store.run_folder import open_run

    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("crash-last", {"bugs": [{"effect": "crash", "after_requests": 5}]})])
    path = tmp_path / "m.yaml"
    path.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {repo}}}\nconcurrency: 1\n"
                    "timeouts: {startup_s: 30, request_s: 10}\naxes: {commit: [crash-last], spec_method: [none]}\n")
    runs = tmp_path / "runs"
    run = open_run(runs, "r", create=True)
    (job,) = jobs_for(make_plan(path, runs), run, tmp_path / "cache")
    result = run_group(job)
    cells = result.cells.to_pylist()
    assert [c["status"] for c in cells] == ["crashed"]
    assert result.samples.num_rows == 6 and result.samples.column("http_status").to_pylist()[-1] == 500
    # The root cause from the log, not only "exited with code 1".
    assert cells[0]["status_detail"].startswith("engine died: RuntimeError: CUDA error: an illegal memory access")
    assert cells[0]["failure_signature"] == "RuntimeError in vllm/v1/worker/gpu_model_runner.py:execute_model"
    assert server_groups_alive(run) == []


def test_an_engine_that_died_is_a_crash_while_the_server_still_runs(tmp_path: Path, tiny_suite: Path) -> None:
    """vLLM's API server outlives its engine for a while (it answers 500 to everything, then shuts
    down): the log and the answers say the engine died, whether the process has exited yet or not."""
    from sweeper.drivers.sweep import jobs_for, make_plan
    from sweeper.execute.runner import run_group
    from sweeper.store.run_folder import open_run

    repo = tmp_path / "vllm"
    bug = {"effect": "crash", "after_requests": 1, "exit_after_s": 120, "when": {"spec_method": ["ngram"]},
           "message": "TypeError: Cannot inspect kernel parameters for function"}
    make_sim_repo(repo, [("c", {"bugs": [bug]})])
    path = tmp_path / "m.yaml"
    path.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {repo}}}\nconcurrency: 1\n"
                    "timeouts: {startup_s: 30, request_s: 10}\n"
                    "axes: {commit: [c], spec_method: [ngram], num_speculative_tokens: [3]}\n")
    runs = tmp_path / "runs"
    run = open_run(runs, "r", create=True)
    (job,) = jobs_for(make_plan(path, runs), run, tmp_path / "cache")
    result = run_group(job)
    (cell,) = result.cells.to_pylist()
    assert cell["status"] == "crashed"
    assert "TypeError: Cannot inspect kernel parameters for function" in cell["status_detail"]
    assert "the server still ran" in cell["status_detail"]
    assert cell["failure_signature"] == "TypeError in vllm/v1/sample/rejection_sampler.py:rejection_sample"
    codes = result.samples.column("http_status").to_pylist()
    assert codes[0] == 200 and set(codes[1:]) == {500}
    assert server_groups_alive(run) == []
