"""`sweep bisect --metric`: a serving metric bisected end to end on simulated histories (real simulator
servers, real git repositories made here, the in-process executor, real Parquet and bisect.json).

Each history declares a performance model in every commit's `sim.yaml` (`perf:`, see `vllmsim/tree.py`)
with a small per-start and per-request variation; a planted change slows the decode step from one commit
on, which moves TPOT by about the same factor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_sim_repo, run_cli, starts_in_logs

import sweeper

# Decode steps long enough that timer jitter on a busy machine stays a few percent of TPOT.
PERF = {"prefill_s_per_token": 0.00002, "decode_step_s": 0.005, "draft_s_per_token": 0.0, "batch_slowdown": 0.0,
        "start_cv": 0.01, "request_cv": 0.01}
# A tiny bench: one load point, a few short requests, one start per server key in a sweep beside it.
BENCH: dict[str, Any] = {"input_len": 8, "output_len": 10, "load": {"concurrency": [1]}, "num_prompts": 5,
                         "num_warmups": 1, "starts": 2, "after": "instead"}
SLOWER = {"id": "slow-step", "metric": "decode_step"}


def history(root: Path, n: int, *, at: int | None = None, factor: float = 1.0,
            bench: dict[str, Any] | None = BENCH) -> dict[str, str]:
    """A history v0.27.0, c1, ..., c<n-1> whose decode step is `factor` times slower from commit `at` on,
    and `root/m.yaml`: its two ends without speculative decoding, with `bench`. Returns tag -> sha."""
    tags = ["v0.27.0", *(f"c{i}" for i in range(1, n))]
    changes = [{**SLOWER, "factor": factor}]
    shas = make_sim_repo(root / "vllm", [(t, {"perf": {**PERF, "changes": changes if at is not None and i >= at else []}})
                                         for i, t in enumerate(tags)])
    (root / "s.yaml").write_text("cases: [{id: a, body: {messages: [{role: user, content: hi}]}}]\n")
    text = (f"name: perf\nmodel: m\nsuite: {root / 's.yaml'}\ninstall: {{kind: sim, repo: {root / 'vllm'}}}\n"
            f"timeouts: {{startup_s: 30, request_s: 10}}\naxes: {{commit: [v0.27.0, {tags[-1]}], spec_method: [none]}}\n")
    (root / "m.yaml").write_text(text + (yaml.safe_dump({"bench": bench}) if bench is not None else ""))
    return shas


def bisect_args(root: Path, bad: str, *extra: str, matrix: bool = True) -> list[str]:
    where = ["--matrix", str(root / "m.yaml"), "--where", "spec_method=none"] if matrix else []
    return ["bisect", "--metric", "mean_tpot_ms", "--good", "v0.27.0", "--bad", bad, *where, "--min-effect", "5%",
            "--executor", "local", "--gpus", "4", "--runs-dir", str(root / "runs"), "--cache-dir", str(root / "cache"),
            *extra]


def verdict(root: Path, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "runs" / run_id / "bisect.json").read_text())
    return data


@pytest.mark.full
def test_a_planted_tpot_regression_is_named_with_its_effect_and_interval(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    shas = history(tmp_path, 40, at=23, factor=1.13)
    code, out, err = run_cli(bisect_args(tmp_path, "c39", "--run-id", "b"), capsys)
    assert code == 0, err
    planted = shas["c23"]
    summary = verdict(tmp_path, "b")
    assert summary["schema"] == "sweep-metric-bisect/1" and summary["final"]
    assert summary["question"] == {"metric": "mean_tpot_ms", "unit": "ms", "load_point": "concurrency=1",
                                   "min_effect": 0.05, "higher_is_better": False, "direction": "lower is better",
                                   "confidence": 0.99}
    (cell,) = summary["cells"]
    assert cell["verdict"] == "changes" and cell["label"] == "spec_method=none"
    (change,) = cell["changes"]
    assert change["commit"]["sha"] == planted and change["commit"]["pr"] == 1023
    assert change["kind"] == "regression" and change["found"] and change["confidence"] >= 0.99
    assert change["last_before"] == shas["c22"]
    # Slower by about the planted factor, its 95 % interval around the estimate and above the minimum effect.
    assert 0.02 < change["effect_low"] < change["effect"] < change["effect_high"] < 0.3
    assert 0.07 < change["effect"] < 0.2
    assert change["after"] > change["before"] > 0
    # Every start is one simulator server, one probe; none ran without being told to the search.
    assert summary["server_starts"] == cell["starts"] == starts_in_logs(tmp_path / "runs")
    assert summary["rounds"] >= 2 and summary["gpu_seconds"] > 0 and summary["reused_starts"] == []
    # The text names the commit (its PR and subject) with the size and interval; progress went to stderr.
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("regression at"))
    assert f"{planted[:10]} 'commit c23 (#1023)' (#1023)" in line and "95 % interval" in line and " ms → " in line
    assert "round 1: 4 starts" in err
    # `sweep report` shows the same verdict from bisect.json, and --json is bisect.json itself.
    code, again, _ = run_cli(["report", "b", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0 and line.strip() in again and "metric bisect of mean_tpot_ms (lower is better)" in again
    code, raw, _ = run_cli(["report", "b", "--json", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0 and json.loads(raw) == summary


@pytest.mark.full
def test_a_history_without_a_change_says_no_change_larger_than_the_minimum(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    history(tmp_path, 30)
    # Through the library's way in: the same driver the CLI calls.
    run = sweeper.bisect("v0.27.0", "c29", matrix=tmp_path / "m.yaml", where=["spec_method=none"],
                         runs_dir=tmp_path / "runs", executor="local", gpus=4, metric="mean_tpot_ms",
                         min_effect=0.05, run_id="quiet", cache_dir=tmp_path / "cache")
    assert run.run_id == "quiet"
    (cell,) = verdict(tmp_path, "quiet")["cells"]
    assert cell["verdict"] == "no_change" and cell["changes"] == [] and cell["drifts"] == []
    assert cell["no_change"]["larger_than"] == 0.05 and cell["no_change"]["confidence"] >= 0.99
    code, out, _ = run_cli(["report", "quiet", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0
    assert "no change larger than 5 % (confidence 0.99" in out and "regression" not in out


@pytest.mark.full
def test_a_sweeps_starts_are_reused_and_a_resumed_bisect_runs_no_start_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shas = history(tmp_path, 16, at=9, factor=1.15)
    code, _, err = run_cli(["matrix", str(tmp_path / "m.yaml"), "--executor", "local", "--gpus", "4", "--run-id", "s",
                            "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache")], capsys)
    assert code == 0, err
    # Without --matrix: the sweep's cells with metrics rows at both ends; its 2 starts at each are told first.
    # A budget that one round of starts spends: the bisect stops undecided, its probes stored.
    code, out, err = run_cli(bisect_args(tmp_path, "c15", "--run-id", "b", "--budget", "0.003", matrix=False), capsys)
    assert code == 0, err
    assert "reusing 4 stored start(s) of run s before any probe" in err
    first = verdict(tmp_path, "b")
    assert len(first["reused_starts"]) == 4 and {r["run_id"] for r in first["reused_starts"]} == {"s"}
    assert first["budget"]["exhausted"] and first["cells"][0]["verdict"] == "undecided"
    assert "undecided: about" in out and "budget spent" in out
    probes = sorted((tmp_path / "runs" / "b" / "probes").glob("*.parquet"))
    assert 1 <= len(probes) == first["server_starts"]
    # Endpoint starts came from the sweep: the first round bisects inside the range.
    assert "positions 0, 0, 15, 15 " not in err
    stored = {p.name: p.read_bytes() for p in probes}

    code, out, err = run_cli(bisect_args(tmp_path, "c15", "--resume", "b", matrix=False), capsys)
    assert code == 0, err
    assert f"resuming: {len(probes)} stored probe(s) of run b told again, none run twice" in err
    summary = verdict(tmp_path, "b")
    (cell,) = summary["cells"]
    (change,) = cell["changes"]
    assert change["commit"]["sha"] == shas["c9"] and change["found"]
    # The first invocation's probes are as they were, and every probe of both invocations (one server start
    # each, as the logs count them) was told to the search once, beside the sweep's four.
    assert all((tmp_path / "runs" / "b" / "probes" / name).read_bytes() == data for name, data in stored.items())
    runs_starts = starts_in_logs(tmp_path / "runs" / "b")
    assert summary["server_starts"] == runs_starts == cell["starts"] - 4
    assert f"round {first['rounds'] + 1}:" in err and "round 1:" not in err


def test_starts_without_a_valid_figure_are_no_evidence_and_make_their_commit_untestable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    # The bad endpoint's engine dies in every load phase (its streamed requests): no start there measures TPOT.
    crash = {"id": "dies", "effect": "crash", "when": {"stream": True}, "after_requests": 1, "exit_after_s": 0.05}
    shas = history(tmp_path, 4)
    sim = yaml.safe_load((tmp_path / "vllm" / "sim.yaml").read_text())
    from conftest import git

    (tmp_path / "vllm" / "sim.yaml").write_text(yaml.safe_dump({**sim, "bugs": [crash]}))
    git(tmp_path / "vllm", "commit", "-q", "-am", "dies under load (#2000)")
    bad = git(tmp_path / "vllm", "rev-parse", "HEAD")
    code, out, err = run_cli(bisect_args(tmp_path, bad, "--run-id", "b"), capsys)
    assert code == 0, err
    assert "invalid, not evidence: the server exited during the load phase" in err
    (cell,) = verdict(tmp_path, "b")["cells"]
    # Every start's engine died with one root cause (the simulator's traceback): the release's, so the
    # commit is given up after MAX_SAME_CRASH starts, not MAX_INVALID.
    assert cell["invalid_starts"] == 2 and cell["verdict"] != "changes"
    ((sha, why),) = cell["skipped"]
    assert sha == bad and why.startswith("the engine crashed in 2 starts (") and "vllm/" in why, why
    metrics = pd.read_parquet(tmp_path / "runs" / "b" / "metrics")
    reasons = set(metrics[metrics["commit_sha"] == bad]["invalid_reason"])
    assert len(reasons) >= 1 and all("; the engine crashed: " in r for r in reasons), reasons
    probes = pd.read_parquet(tmp_path / "runs" / "b" / "probes")
    assert (probes[probes["commit_sha"] == bad]["status"] == "invalid").sum() == cell["invalid_starts"]
    assert shas["v0.27.0"] in set(probes["commit_sha"])
    assert f"untestable: {bad[:10]}" in out


def test_resuming_a_run_that_is_not_there_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history(tmp_path, 3)
    code, out, err = run_cli(bisect_args(tmp_path, "c2", "--resume", "nope"), capsys)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "nope" in err, err


@pytest.mark.parametrize("extra,bench,expected", [
    (["--metric", "mean_tpt_ms"], BENCH,
     "--metric: unknown metric 'mean_tpt_ms'; expected one of: request_throughput, "),
    (["--metric", "completed"], BENCH, "--metric: unknown metric 'completed'"),
    (["--metric", "spec_decode_acceptance_length"], BENCH,
     ("--metric: spec_decode_acceptance_length is measured only with speculative decoding; the cell "
      "spec_method=none has none")),
    (["--min-effect", "0%"], BENCH,
     "--min-effect: expected a positive percentage below 100 such as 3%, got '0%'"),
    (["--min-effect", "-3%"], BENCH, "--min-effect: expected a positive percentage"),
    (["--min-effect", "0.03"], BENCH, "--min-effect: expected a positive percentage"),
    (["--min-effect", "lots%"], BENCH, "--min-effect: expected a positive percentage"),
    ([], None, "has no bench: section, so no metric is measured; --metric needs"),
    (["--load-point", "concurrency=9"], {**BENCH, "load": {"concurrency": [1, 4]}},
     "--load-point: the bench has no load point 'concurrency=9'; expected one of: concurrency=1, concurrency=4"),
    ([], {**BENCH, "load": {"concurrency": [1, 4]}},
     "--load-point: the bench has 2 load points; pick one with --load-point (concurrency=1, concurrency=4)"),
    (["--widen"], BENCH, "--widen: is for a failure bisect"),
])
def test_bad_metric_bisect_input_is_one_line_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], bench: dict[str, Any] | None,
        expected: str) -> None:
    history(tmp_path, 3, bench=bench)
    args = bisect_args(tmp_path, "c2")
    # The last --metric and --min-effect given win (click): each case overrides what it tests.
    code, out, err = run_cli([*args, *extra], capsys)
    assert code == 1 and out == "", err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert expected in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_metric_flags_without_a_metric_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history(tmp_path, 3)
    args = ["bisect", "--good", "v0.27.0", "--bad", "c2", "--matrix", str(tmp_path / "m.yaml"),
            "--runs-dir", str(tmp_path / "runs"), "--executor", "local"]
    code, out, err = run_cli([*args, "--load-point", "concurrency=1"], capsys)
    assert (code, out) == (1, "") and err == "error: --load-point: goes with --metric NAME (a metric bisect)\n"
