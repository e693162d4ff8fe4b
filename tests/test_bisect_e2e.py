"""`sweep bisect` end to end on simulated vLLM histories: real Ray, real simulator servers, real git,
real Parquet. The demo history holds a regression and its fix plus two later modes; the bisect
history's bug varies per server start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for_files

from sweeper.drivers.bisect import BisectOptions, BisectScope, run_bisect
from sweeper.errors import BisectError
from sweeper.execute.choice import choose
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

SUITES = Path(__file__).parent.parent / "suites"
DEMO_MATRIX = """
name: d
model: Qwen/Qwen3.5-35B-A3B
suite: [{suites}/structured-output.yaml, {suites}/thinking-budget.yaml]
install: {{kind: sim, repo: {repo}}}
serve: {{--enable-auto-tool-choice: true, --tool-call-parser: qwen3_coder, --reasoning-parser: qwen3,
        --max-model-len: 32768}}
env: {{VLLM_ENFORCE_STRICT_TOOL_CALLING: "1"}}
concurrency: 8
timeouts: {{startup_s: 60, request_s: 30}}
axes:
  commit: [v0.27.0, main]
  spec_method: [none, mtp]
  num_speculative_tokens: [4]
  env.VLLM_USE_V2_MODEL_RUNNER: ["1"]
"""
FSM = "log_absent(Failed to advance FSM)"
CELL = ["spec_method=mtp"]


def make_repo(path: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "vllmsim", "make-repo", str(path), *args, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("bisect-demo")
    plan = make_repo(root / "vllm", "--scenario", "demo")
    (root / "m.yaml").write_text(DEMO_MATRIX.format(suites=SUITES, repo=root / "vllm"))
    return root, plan


def found(summary: dict[str, Any]) -> set[tuple[str, str, int | None]]:
    """(mode kind, direction, PR) of every settled change; the mode kind names the bug by its checks."""
    out = set()
    for ch in summary["cells"][0]["changes"]:
        if not ch["found"]:
            continue
        mode = ch["mode"]
        kind = "fsm" if FSM in mode else "budget" if "reasoning_tokens_at_most" in mode else \
            "whitespace" if "no_whitespace_tail" in mode else mode
        out.add((kind, ch["direction"], ch["commit"]["pr"]))
    return out


# The demo history (vllmsim/repo.py): the FSM bug rises at #43911 and is fixed at #44297, whose
# fix leaves whitespace tails without the log line; the thinking budget is ignored from #54120.
DEMO_CHANGES = {("fsm", "regression", 43911), ("fsm", "fix", 44297), ("whitespace", "regression", 44297),
                ("budget", "regression", 54120)}


@pytest.mark.timeout(900)
@pytest.mark.usefixtures("ray_cluster")
def test_the_demo_range_names_every_change(demo: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, _ = demo
    outcome = run_bisect(BisectScope(good="v0.27", bad="main", matrix_path=root / "m.yaml", where=CELL),
                         BisectOptions(parallel=4, runs_dir=tmp_path / "runs", run_id="b", cache_dir=tmp_path / "cache"))
    summary = outcome.summary
    assert found(summary) == DEMO_CHANGES
    cell = summary["cells"][0]
    assert cell["done"] and cell["bad_endpoint"] == "fails"
    # The report leads with what still fails at bad, and where each of those modes started.
    failing = {f["mode"]: f for f in cell["failing_at_bad"]}
    assert not any(FSM in m for m in failing)
    starts = {f["started"]["commit"]["pr"] for f in failing.values()}
    assert starts == {44297, 54120}
    fsm_rise = next(c for c in cell["changes"] if FSM in c["mode"] and c["direction"] == "regression")
    assert fsm_rise["fixed_by"] is not None and fsm_rise["confidence"] >= 0.99
    assert fsm_rise["before"]["failures"] == 0 and fsm_rise["after"]["rate"] > 0.1
    # bisect.json on disk is the same report, with its schema name.
    on_disk = json.loads((outcome.run.root / "bisect.json").read_text())
    assert on_disk["schema"] == "sweep-bisect/2" and found(on_disk) == DEMO_CHANGES and on_disk["final"]
    # probes/*.parquet record the counts per mode; one row per server start of the cell.
    probes = analysis.load_table(outcome.run, "probes").to_pylist()
    assert len(probes) == summary["server_starts"] == cell["probes"]
    assert sum(dict(p["mode_failures"]).get(fsm_rise["mode"], 0) for p in probes) == \
        fsm_rise["after"]["failures"]
    assert all(p["n_failed"] == sum(dict(p["mode_failures"]).values()) for p in probes)


def test_ambiguous_cell_is_a_clear_error(demo: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, _ = demo
    with pytest.raises(BisectError, match=r"2 cells match \(nothing\); add --where to pick one of: "
                                          r"spec_method=none .*; spec_method=mtp num_speculative_tokens=4"):
        run_bisect(BisectScope(good="v0.27", bad="main", matrix_path=root / "m.yaml"),
                   BisectOptions(runs_dir=tmp_path / "runs"))


@pytest.mark.full  # a real `sweep bisect` on Ray, killed and resumed
@pytest.mark.timeout(900)
def test_interrupted_bisect_resumes_to_the_same_report(demo: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, _ = demo
    runs = tmp_path / "runs"
    args = [sys.executable, "-m", "sweeper", "bisect", "--good", "v0.27", "--bad", "main", "--matrix",
            str(root / "m.yaml"), "--where", CELL[0], "--parallel", "2", "--gpus", "2", "--runs-dir", str(runs),
            "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.Popen([*args, "--run-id", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    probes_dir = runs / "r" / "probes"
    wait_for_files(probes_dir, 7, proc, 240)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = analysis.load_table(RunDir(runs / "r"), "probes").to_pandas()
    assert len(before) >= 7
    proc = subprocess.Popen([*args, "--resume", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    summary = json.loads((runs / "r" / "bisect.json").read_text())
    assert found(summary) == DEMO_CHANGES
    assert "fixed later in the range by" in out and "started at" in out
    after = analysis.load_table(RunDir(runs / "r"), "probes").to_pandas()
    # Every probe stored before the interruption is kept and counted; none is run again under its
    # name, and the resumed run adds only what the rebuilt search still wanted.
    assert set(before.group_id) <= set(after.group_id)
    assert not after.group_id.duplicated().any()
    # A start whose results were written whole before the kill but not yet its probe row is evidence
    # all the same: the starts are the groups on disk, each once.
    starts = analysis.load_table(RunDir(runs / "r"), "cells").to_pandas().group_id.nunique()
    assert set(after.group_id) <= set(analysis.load_table(RunDir(runs / "r"), "cells").to_pandas().group_id)
    assert summary["server_starts"] == starts
    assert summary["cells"][0]["probes"] == starts


@pytest.fixture(scope="module")
def varying(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("bisect-varying")
    plan = make_repo(root / "vllm", "--scenario", "bisect", "--commits", "120", "--rate-sd", "0.15")
    suite = SUITES / "structured-output.yaml"
    (root / "m.yaml").write_text(f"""
name: v
model: Qwen/Qwen3-8B
suite: {suite}
install: {{kind: sim, repo: {root / "vllm"}}}
serve: {{--enable-auto-tool-choice: true, --tool-call-parser: qwen3_coder}}
env: {{VLLM_ENFORCE_STRICT_TOOL_CALLING: "1"}}
concurrency: 8
timeouts: {{startup_s: 30, request_s: 20}}
axes:
  commit: [v0.27.0, v0.29.0]
  spec_method: [mtp]
  num_speculative_tokens: [4]
""")
    return root, plan


# The full tier: a whole simulated bisect of a rate that varies per start (20 s); the search's side of
# it is checked on scripted counts in the fast tier (`tests/test_bisect.py`, `tests/test_search_power.py`).
@pytest.mark.full
@pytest.mark.timeout(900)
def test_a_bug_that_varies_per_server_start_is_still_pinned(varying: tuple[Path, dict[str, Any]],
                                                           tmp_path: Path) -> None:
    root, plan = varying
    assert plan["bugs"][0]["rate_sd"] == pytest.approx(0.15)
    # In this process (the demo range above runs on Ray): the driver is the same either way.
    outcome = run_bisect(BisectScope(good="v0.27", bad="v0.29.0", matrix_path=root / "m.yaml", where=CELL),
                         BisectOptions(parallel=4, runs_dir=tmp_path / "runs", run_id="b", cache_dir=tmp_path / "cache"),
                         executor=choose("local"))
    cell = outcome.summary["cells"][0]
    regressions = [c for c in cell["changes"] if c["found"] and c["direction"] == "regression"]
    assert [c["commit"]["sha"] for c in regressions] == [plan["culprit"]["sha"]]
    assert all(c["confidence"] >= 0.99 for c in regressions)
    # The planted broken installs are untestable, never a change.
    broken = set(plan["install_broken"]["shas"])
    assert not broken & {c["commit"]["sha"] for c in cell["changes"]}


@pytest.mark.timeout(600)
def test_an_engine_crash_under_the_cells_settings_is_a_change_not_a_skip(tmp_path: Path,
                                                                         tiny_suite: Path) -> None:
    from conftest import crash_history

    shas = crash_history(tmp_path, tiny_suite, 9, crash_from=5, after_requests=2)
    outcome = run_bisect(BisectScope(good="v0.27", bad="c8", matrix_path=tmp_path / "m.yaml", where=CELL),
                         BisectOptions(parallel=4, runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache"),
                         executor=choose("local"))
    cell = outcome.summary["cells"][0]
    assert cell["skipped"] == []
    (change,) = [c for c in cell["changes"] if c["found"]]
    assert change["commit"]["sha"] == shas["c5"] and change["direction"] == "regression"
    # The crash is its own mode, named by its root cause: exception type + innermost vLLM frame.
    assert change["mode"] == "crash: TypeError in vllm/v1/sample/rejection_sampler.py:rejection_sample"
    probes = analysis.load_table(outcome.run, "probes").to_pylist()
    assert {p["status"] for p in probes if p["position"] >= 5} == {"crashed"}


# The full tier: two whole simulated bisects (15 s) beside the other resume tests there.
@pytest.mark.full
@pytest.mark.timeout(600)
def test_a_start_lost_with_its_driver_is_not_counted_on_resume(tmp_path: Path, tiny_suite: Path) -> None:
    """A driver killed while two starts ran can leave the later one stored and the earlier one not:
    the resumed bisect counts the starts on disk, not the highest probe number."""
    from conftest import crash_history

    crash_history(tmp_path, tiny_suite, 4, crash_from=2, after_requests=2)
    scope = BisectScope(good="v0.27", bad="c3", matrix_path=tmp_path / "m.yaml", where=CELL)
    runs = tmp_path / "runs"
    run_bisect(scope, BisectOptions(parallel=2, runs_dir=runs, run_id="r", cache_dir=tmp_path / "cache"),
               executor=choose("local"))
    run = RunDir(runs / "r")
    first = min(p.stem for p in (run.root / "probes").glob("*.parquet"))
    # The first probe's every trace gone, as if its server were still starting when the driver died.
    for f in run.root.rglob(f"{first}*"):
        f.unlink()
    outcome = run_bisect(scope, BisectOptions(parallel=2, runs_dir=runs, resume="r", cache_dir=tmp_path / "cache"),
                         executor=choose("local"))
    on_disk = analysis.load_table(run, "cells").to_pandas().group_id.nunique()
    assert outcome.summary["server_starts"] == on_disk
