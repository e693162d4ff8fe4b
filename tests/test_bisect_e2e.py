"""`sweep bisect` end to end on a simulated vLLM history: real Ray, real simulator servers, real git."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeper import analysis
from sweeper.bisect import Verdict
from sweeper.bisect_run import run_bisect
from sweeper.errors import BisectError
from sweeper.store import RunDir

MATRIX = """
name: b
model: Qwen/Qwen3-8B
suite: {suite}
install: {{kind: sim, repo: {repo}}}
serve: {{--enable-auto-tool-choice: true, --tool-call-parser: qwen3_coder}}
env: {{VLLM_ENFORCE_STRICT_TOOL_CALLING: "1"}}
concurrency: 8
timeouts: {{startup_s: 30, request_s: 20}}
axes:
  commit: [v0.27.0, v0.29.0]
  spec_method: [none, mtp]
  num_speculative_tokens: [4]
"""
SUITE = Path(__file__).parent.parent / "suites" / "structured-output.yaml"


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("bisect")
    repo = root / "vllm"
    out = subprocess.run([sys.executable, "-m", "sweeper.sim", "make-repo", str(repo), "--scenario", "bisect",
                          "--commits", "200", "--json"], check=True, capture_output=True, text=True).stdout
    plan = json.loads(out)
    (root / "m.yaml").write_text(MATRIX.format(suite=SUITE, repo=repo))
    return root, plan


def test_the_history_is_what_the_test_needs(history: tuple[Path, dict]) -> None:
    _, plan = history
    good, bad = plan["tag_indices"]["v0.27.0"], plan["tag_indices"]["v0.29.0"]
    assert plan["commits"] >= 200
    assert good < plan["culprit"]["index"] < bad < plan["fix"]["index"]
    assert plan["bugs"][0]["rate"] == pytest.approx(0.3)
    broken = plan["install_broken"]["indices"]
    assert good < broken[0] and broken[-1] < bad and plan["culprit"]["index"] not in broken


@pytest.mark.usefixtures("ray_cluster")
def test_bisect_finds_the_planted_commit_and_parallel_needs_fewer_rounds(history: tuple[Path, dict]) -> None:
    root, plan = history
    rounds = {}
    for k in (4, 1):
        outcome = run_bisect(matrix_path=root / "m.yaml", good="v0.27", bad="v0.29.0", where=["spec_method=mtp"],
                             parallel=k, runs_dir=root / f"runs-{k}", run_id="b")
        result = outcome.result
        assert result.kind is Verdict.CULPRIT
        assert result.culprit == plan["culprit"]["sha"]
        assert result.confidence >= 0.99
        assert outcome.summary["culprit"]["pr"] is not None
        assert outcome.summary["signature"]  # the checks failing on the bad endpoint
        assert "no_whitespace_tail" in outcome.summary["signature"]
        rounds[k] = outcome.summary["rounds"]
        probes = analysis.load_table(outcome.run, "probes").to_pandas()
        assert len(probes) == outcome.summary["probes"]
        assert (outcome.run.root / "bisect.json").exists()
    assert rounds[4] < rounds[1]


@pytest.mark.usefixtures("ray_cluster")
def test_ambiguous_cell_is_a_clear_error(history: tuple[Path, dict]) -> None:
    root, _ = history
    with pytest.raises(BisectError, match=r"2 cells match \(nothing\); add --where to pick one of: "
                                          r"spec_method=none; spec_method=mtp num_speculative_tokens=4"):
        run_bisect(matrix_path=root / "m.yaml", good="v0.27", bad="v0.29.0", runs_dir=root / "runs-x")


def test_interrupted_bisect_resumes_without_spending_a_probe_twice(history: tuple[Path, dict]) -> None:
    root, plan = history
    runs = root / "runs-resume"
    args = [sys.executable, "-m", "sweeper", "bisect", "--good", "v0.27", "--bad", "v0.29.0", "--matrix",
            str(root / "m.yaml"), "--where", "spec_method=mtp", "--parallel", "2", "--gpus", "2",
            "--runs-dir", str(runs)]
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.Popen([*args, "--run-id", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    probes_dir = runs / "r" / "probes"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(list(probes_dir.glob("*.parquet"))) < 4:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = analysis.load_table(RunDir(runs / "r"), "probes").to_pandas()
    assert len(before) >= 4
    proc = subprocess.Popen([*args, "--resume", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"culprit: {plan['culprit']['sha']}" in out
    after = analysis.load_table(RunDir(runs / "r"), "probes").to_pandas()
    new = after[~after.group_id.isin(before.group_id)]
    assert len(new) > 0
    # Commits probed before the interruption are not probed again: their stored samples are reused.
    assert not set(new.commit_sha) & set(before.commit_sha)
    assert not after.group_id.duplicated().any()
