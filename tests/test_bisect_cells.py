"""`sweep bisect --good --bad` as typed after `sweep matrix`: every changing cell of the sweep at once,
sharing installs and server starts. Real Ray, real simulator servers, a git history made here."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SUITE as TINY_SUITE
from conftest import make_sim_repo, starts_in_logs

from sweeper.drivers.bisect import BisectOptions, BisectScope, run_bisect
from sweeper.drivers.sweep import run_matrix
from sweeper.errors import BisectError
from sweeper.execute.choice import choose
from sweeper.install.cache import list_environments
from sweeper.reports.bisect import render
from sweeper.store import frames as analysis

FSM = {"id": "fsm", "effect": "fsm_whitespace", "when": {"spec_method": ["mtp"], "strict_tool_calling": [True]},
       "rate": 0.5}
BUDGET = {"id": "budget", "effect": "thinking_budget_ignored",
          "when": {"spec_method": ["none"], "model_runner": ["V2"]}, "rate": 1.0}
NGRAM = {"id": "ngram-ws", "effect": "silent_whitespace", "when": {"spec_method": ["ngram"]}, "rate": 0.5}
N = 12
REGRESS_FSM, REGRESS_BUDGET, FIX_NGRAM = 7, 10, 4

INVOICE = next(c for c in yaml.safe_load(TINY_SUITE)["cases"] if c["id"] == "invoice")
SUITE = yaml.safe_dump({
    "name": "small",
    "defaults": {"repeat": 24, "body": {"max_tokens": 1024, "temperature": 0},
                 "checks": ["http_ok", {"finish_reason": {"expected": "stop"}}, "json_schema", "no_whitespace_tail",
                            {"log_absent": {"pattern": "Failed to advance FSM"}}]},
    "cases": [INVOICE, {
        "id": "budget", "repeat": 8,
        "checks": ["http_ok", {"finish_reason": {"expected": "stop"}}, {"reasoning_tokens_at_most": {"max": 4}},
                   "content_nonempty"],
        "body": {"thinking_token_budget": 4, "chat_template_kwargs": {"enable_thinking": True},
                 "messages": [{"role": "user", "content": "What is 1+1?"}]}}],
})

MATRIX = """
name: cells
model: Qwen/Qwen3-8B
suite: small.yaml
install: {{kind: sim, repo: {repo}}}
serve: {{--enable-auto-tool-choice: true, --tool-call-parser: qwen3_coder, --reasoning-parser: qwen3}}
env: {{VLLM_ENFORCE_STRICT_TOOL_CALLING: "1"}}
concurrency: 8
timeouts: {{startup_s: 30, request_s: 20}}
axes:
  commit: [v0.27.0, main]
  spec_method: [none, ngram, mtp]
  num_speculative_tokens: [2]
  env.VLLM_USE_V2_MODEL_RUNNER: ["0", "1"]
  request.top_p: [1.0, 0.95]
exclude:
  - {{spec_method: ngram, env.VLLM_USE_V2_MODEL_RUNNER: "0"}}
  - {{spec_method: mtp, env.VLLM_USE_V2_MODEL_RUNNER: "0"}}
"""


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """12 commits: the ngram whitespace bug (one request in two) is fixed at c4, the FSM bug arrives at c7
    (MTP), the thinking budget is ignored from c10 (no speculation, Model Runner V2)."""
    root = tmp_path_factory.mktemp("cells")
    commits = []
    for i in range(N):
        bugs = ([NGRAM] if i < FIX_NGRAM else []) + ([FSM] if i >= REGRESS_FSM else []) \
            + ([BUDGET] if i >= REGRESS_BUDGET else [])
        commits.append(("v0.27.0" if i == 0 else f"c{i}", {"bugs": bugs}))
    shas = make_sim_repo(root / "vllm", commits)
    (root / "small.yaml").write_text(SUITE)
    (root / "m.yaml").write_text(MATRIX.format(repo=root / "vllm"))
    return root, shas


@pytest.mark.timeout(900)
@pytest.mark.usefixtures("ray_cluster")
def test_bisect_as_typed_names_both_culprits_and_the_fix_with_their_cells(
        history: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, shas = history
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    with pytest.raises(BisectError, match=r"no sweep run under .*: run `sweep matrix MATRIX.yaml` first"):
        run_bisect(BisectScope(good="v0.27", bad="main"), BisectOptions(runs_dir=runs, cache_dir=cache))
    sweep = run_matrix(root / "m.yaml", runs_dir=runs, run_id="sweep", executor=choose(gpus=4), cache_dir=cache)
    envs_after_sweep = {e.sha for e in list_environments(cache)}

    # As typed: no --parallel. Three of the four slots are taken when the bisect plans its rounds (as
    # Ray still counts them right after its warm-up): the rounds are planned on the cluster's four.
    import ray

    release = tmp_path / "release"

    @ray.remote(num_gpus=3, num_cpus=0)
    def hold(flag: str) -> None:
        while not Path(flag).exists():
            time.sleep(0.05)

    held = hold.remote(str(release))
    while ray.available_resources().get("GPU", 0) > 1:
        time.sleep(0.05)
    events: list[str] = []

    def on_event(line: str) -> None:
        events.append(line)
        if "per round" in line:
            release.touch()  # the rounds are planned: give the slots back

    try:
        outcome = run_bisect(BisectScope(good="v0.27", bad="main"),
                             BisectOptions(runs_dir=runs, run_id="b", cache_dir=cache), on_event=on_event)
    finally:
        release.touch()
        ray.get(held)
    assert "4 server starts per round" in events
    rounds = [e for e in events if e.startswith("round ")]
    assert rounds and all(" GPU-s" in e for e in rounds)
    summary = outcome.summary
    assert summary["rounds"] < summary["server_starts"]
    text = render(summary)
    assert text.startswith("Changes by commit (newest first):")
    assert "Next: a bug report per change:" in text and "sweep report sweep --issue --mode " in text
    labels = {t.label for t in outcome.targets}
    # Every cell that changed and only those: MTP (FSM), none + V2 (budget), ngram (the fix); each x 2 top_p.
    assert len(labels) == 2 + 2 + 2
    assert not any("spec_method=none" in lb and "RUNNER=0" in lb for lb in labels)

    by_commit = {entry["commit"]["sha"]: entry["changes"] for entry in summary["by_commit"]}
    assert set(by_commit) == {shas[f"c{REGRESS_FSM}"], shas[f"c{REGRESS_BUDGET}"], shas[f"c{FIX_NGRAM}"]}

    def cells_of(sha: str, direction: str, check: str) -> set[str]:
        return {cell for ch in by_commit[sha] if ch["direction"] == direction and check in ch["mode"]
                for cell in ch["cells"]}

    assert cells_of(shas[f"c{REGRESS_FSM}"], "regression", "log_absent") == \
        {lb for lb in labels if "spec_method=mtp" in lb}
    assert cells_of(shas[f"c{REGRESS_BUDGET}"], "regression", "reasoning_tokens_at_most") == \
        {lb for lb in labels if "spec_method=none" in lb and "RUNNER=1" in lb}
    assert cells_of(shas[f"c{FIX_NGRAM}"], "fix", "no_whitespace_tail") == \
        {lb for lb in labels if "spec_method=ngram" in lb}
    assert summary["reused_samples"] > 0  # the sweep's samples at good and bad

    # One environment per distinct commit, built once however many cells and starts used it.
    probes = analysis.load_table(outcome.run, "probes").to_pylist()
    probed = {p["commit_sha"] for p in probes}
    envs = [e.sha for e in list_environments(cache)]
    assert sorted(envs) == sorted(envs_after_sweep | probed)  # one each, none twice
    # Server starts, counted from the servers' own logs: one per probe, and cells that differ only in a
    # request axis share it (two cells per start here, when both cells' searches want that commit: a
    # search that is done, or wants another commit, leaves its twin to start alone).
    starts = {p["group_id"] for p in probes}
    assert starts_in_logs(outcome.run.root) == len(starts) == summary["server_starts"]
    cells_per_start = Counter(p["group_id"] for p in probes)
    assert set(cells_per_start.values()) <= {1, 2} and Counter(cells_per_start.values())[2] > len(starts) // 2
    assert starts_in_logs(sweep.run.root) == 2 * 4  # the sweep: 2 commits x 4 server keys


@pytest.mark.timeout(600)
def test_no_run_and_a_run_without_changes_are_one_line_each(history: tuple[Path, dict[str, str]],
                                                         tmp_path: Path) -> None:
    root, _ = history
    runs = tmp_path / "runs"

    def bisect(good: str, bad: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sweeper", "bisect", "--good", good, "--bad", bad,
                               "--runs-dir", str(runs), "--executor", "local"], capture_output=True, text=True, timeout=120, check=False)

    out = bisect("v0.27", "main")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        (f"error: no sweep run under {runs}: run `sweep matrix MATRIX.yaml` first, or pass --matrix MATRIX.yaml "
         "--where AXIS=VALUE")]
    # A sweep whose cells all pass at good and at bad: nothing to bisect.
    quiet = root / "quiet.yaml"
    quiet.write_text((root / "m.yaml").read_text().replace("commit: [v0.27.0, main]", "commit: [c6, c7]")
                     .replace("spec_method: [none, ngram, mtp]", "spec_method: [none]")
                     .replace('env.VLLM_USE_V2_MODEL_RUNNER: ["0", "1"]', 'env.VLLM_USE_V2_MODEL_RUNNER: ["0"]'))
    done = subprocess.run([sys.executable, "-m", "sweeper", "matrix", str(quiet), "--runs-dir", str(runs),
                           "--cache-dir", str(tmp_path / "cache"), "--gpus", "2", "--executor", "local"],
                          capture_output=True, text=True, timeout=300, env=_no_ray_address(), check=False)
    assert done.returncode == 0, done.stderr
    out = bisect("c6", "c7")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "no cell fails differently at c7 than at c6" in line and "nothing to bisect" in line


def _no_ray_address() -> dict[str, Any]:
    import os

    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


# The full tier: three whole simulated bisects (25 s). The fast tier checks the search's side of a
# budget on scripted counts (`tests/test_search_power.py`) and a matrix's budget (`tests/test_adaptive.py`).
@pytest.mark.full
@pytest.mark.timeout(600)
def test_a_budget_stops_the_rounds_and_a_resume_with_more_finishes(history: tuple[Path, dict[str, str]],
                                                                    tmp_path: Path) -> None:
    """`--budget`: no round starts past it, what is open is reported undecided with what deciding
    would cost; resumed with a larger budget, the search goes on from its stored probes."""
    root, shas = history
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    cell = ("spec_method=mtp", "env.VLLM_USE_V2_MODEL_RUNNER=1", "request.top_p=1.0")
    scope = BisectScope(good="v0.27", bad="main", matrix_path=root / "m.yaml", where=cell)
    # In a runs folder of its own: a bisect reads the stored evidence of every run beside it.
    whole = run_bisect(scope, BisectOptions(runs_dir=tmp_path / "alone", cache_dir=cache, run_id="whole"),
                       executor=choose("local", gpus=4))
    assert "budget" not in whole.summary
    small = whole.summary["gpu_seconds"] / 3 / 3600  # GPU-hours: a third of what the search wants
    outcome = run_bisect(scope, BisectOptions(runs_dir=runs, cache_dir=cache, run_id="b", budget_h=small),
                         executor=choose("local", gpus=4))
    budget = outcome.summary["budget"]
    assert budget["exhausted"] and budget["gpu_hours"] == small
    starts = outcome.summary["server_starts"]
    assert 0 < starts < whole.summary["server_starts"]
    assert not outcome.summary["cells"][0]["done"]
    text = render(outcome.summary)
    assert "raise --budget" in text and f"budget {small:g} GPU-h" in text
    # Every round but the last started within the budget: what was spent before it was less.
    probes = analysis.load_table(outcome.run, "probes").to_pylist()
    last = max(p["round"] for p in probes)
    assert sum(p["gpu_seconds"] for p in probes if p["round"] < last) < small * 3600
    more = run_bisect(scope, BisectOptions(runs_dir=runs, cache_dir=cache, resume="b", budget_h=1.0),
                      executor=choose("local", gpus=4))
    assert not more.summary["budget"]["exhausted"] and more.summary["server_starts"] > starts
    found = [ch for ch in more.summary["cells"][0]["changes"] if ch["found"]]
    assert [ch["commit"]["sha"] for ch in found] == [shas["c7"]]
