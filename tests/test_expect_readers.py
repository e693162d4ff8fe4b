"""A server start outside an `expect:` bound is a failure every reader shows as a named mode: `sweep
report`'s table, `--explain` (text and JSON), `--html`, `--issue --mode expect:…` and the triage's
explanation; and `--explain --metric` names the setting conjunction that moves the metric.

One real run for all of them: simulator servers started by the in-process executor, a bench phase
measuring real timings into real Parquet. The simulator's performance model plants the regression:
a decode step three times as long only without async scheduling on the Triton attention backend, so
that cell's TPOT is about 30 ms where every other cell's is about 10, and the bound `mean_tpot_ms
<= 20` breaks there alone with room on both sides for a busy machine's timing noise. No speculative
decoding: TPOT is then the step itself, with no draws of accepted tokens to blur it between starts.

Three server starts per configuration, not two: `--explain --metric` compares the per-start values
inside a conjunction with those outside by Welch's t, and with two starts inside it has one degree of
freedom, so after Holm over the conjunctions tried it names the conjunction only when the two starts
agree within about 1.5 % (a busy machine's timing noise is more); with three they may differ by 15 %.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from conftest import SUITE, make_sim_repo, run_cli

from sweeper.drivers.sweep import run_matrix
from sweeper.execute.choice import choose
from sweeper.reports import triage as triage_report
from sweeper.store.run_folder import open_run

# Every test reads one simulated sweep with a bench (the module's fixture, about 17 s): the full tier.
pytestmark = pytest.mark.full

MODE = "expect:mean_tpot_ms<=20"
SLOW = "async_scheduling=false ∧ attention_backend=TRITON_ATTN"
PERF = {"prefill_s_per_token": 0.0002, "decode_step_s": 0.01, "draft_s_per_token": 0.0, "batch_slowdown": 0.0,
        "start_cv": 0.0, "request_cv": 0.0,
        "changes": [{"id": "slow-sync-triton", "metric": "decode_step", "factor": 3.0,
                     "when": {"async_scheduling": False, "attention_backend": "TRITON_ATTN"}}]}
BENCH = {"input_len": 20, "output_len": 11, "load": {"concurrency": [1, 4]}, "num_prompts": 8, "num_warmups": 1,
         "starts": 3, "seed": 7}
# Every option of `vllm bench serve` (vllm/benchmarks/serve.py) the report may write; the command is
# runnable when it writes no other.
BENCH_SERVE_OPTIONS = {"--backend", "--base-url", "--endpoint", "--model", "--served-model-name", "--dataset-name",
                       "--dataset-path", "--random-input-len", "--random-output-len", "--random-range-ratio",
                       "--custom-output-len", "--num-prompts", "--num-warmups", "--max-concurrency", "--request-rate",
                       "--burstiness", "--ignore-eos", "--seed", "--temperature"}
FLAGS = {"--ignore-eos"}  # options that take no value


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run `r` under the returned runs folder: 4 cells × 3 starts × 2 load points, one cell slow."""
    root = tmp_path_factory.mktemp("expect")
    (root / "tiny.yaml").write_text(SUITE)
    make_sim_repo(root / "vllm", [("good", {"perf": PERF})])
    matrix = {"name": "expect-readers", "model": "m", "suite": str(root / "tiny.yaml"),
              "install": {"kind": "sim", "repo": str(root / "vllm")}, "timeouts": {"startup_s": 30, "request_s": 10},
              "axes": {"commit": ["good"], "async_scheduling": [True, False],
                       "attention_backend": ["FLASH_ATTN", "TRITON_ATTN"]},
              "bench": BENCH, "expect": {"mean_tpot_ms": {"max": 20}}}
    (root / "m.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    run_matrix(root / "m.yaml", runs_dir=root / "runs", run_id="r", executor=choose("local"), cache_dir=root / "cache")
    metrics = pd.read_parquet(root / "runs" / "r" / "metrics")
    # The premise of every test here: only the planted cell is outside the bound, in every start.
    assert metrics["valid"].all(), metrics["invalid_reason"].tolist()
    slow = metrics["cell_id"].str.contains("-sync-triton")
    assert (metrics.loc[slow, "mean_tpot_ms"] > 20).all() and (metrics.loc[~slow, "mean_tpot_ms"] < 20).all(), \
        metrics[["cell_id", "start", "load_point", "mean_tpot_ms"]].to_string()
    return root / "runs"


def slow_cell(runs: Path) -> str:
    cells = pd.read_parquet(runs / "r" / "cells")
    (cell,) = [c for c in cells["cell_id"] if "-sync-triton" in c]
    return str(cell)


def report(runs: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run_cli(["report", "r", "--runs-dir", str(runs), *args], capsys)
    assert code == 0, err
    return out


def test_the_table_counts_the_start_outside_the_bound_as_the_cells_failure(
        runs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # the mode's name on one line
    out = report(runs, capsys)
    rows = [line for line in out.splitlines() if "│" in line and ("TRITON_ATTN" in line or "FLASH_ATTN" in line)]
    assert len(rows) == 4, out
    slow = [r for r in rows if re.search(r"False\s*│TRITON_ATTN", r)]
    assert len(slow) == 1, out
    # Its 6 replayed requests passed; its 3 starts × 2 load points all broke the bound: 6 failures of 12.
    assert MODE in slow[0] and "6/12" in slow[0], slow[0]
    assert rows[0] == slow[0]  # failing cells first
    assert all(MODE not in r and "0/12" in r for r in rows if r is not slow[0]), out


def test_explain_names_the_mode_in_text_and_json(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = report(runs, capsys, "--explain")
    assert re.search(rf"^mode 1: {re.escape(MODE)}  \(6 of 24 server starts × load points failed\)", text, re.MULTILINE), text
    data = json.loads(report(runs, capsys, "--explain", "--json"))
    (mode,) = data["modes"]
    assert (mode["mode"], mode["unit"], mode["failures"]) == (MODE, "server starts × load points", 6)
    assert mode["failing_cells"] == [{"cell_id": slow_cell(runs), "failed": 6, "n": 6}]
    assert set(mode["cases"]) == {f"{MODE} @ concurrency=1", f"{MODE} @ concurrency=4"}


def test_the_html_report_shows_the_mode_and_the_metrics(runs: Path, capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    page_path = tmp_path / "r.html"
    report(runs, capsys, "--html", str(page_path))
    page = page_path.read_text()
    escaped = MODE.replace("<", "&lt;")
    # In the explanation, in a heatmap of its own, and in the slow cell's drill-down, marked failing.
    assert re.search(rf'<div class="mode" id="mode-1"><h3><span class="n">mode 1</span> {re.escape(escaped)} ', page)
    assert f"<figcaption>mode 1: {escaped} — " in page
    cell = re.search(rf'<details class="cell failing" id="cell-{re.escape(slow_cell(runs))}">(.*?)</details>', page, re.DOTALL)
    assert cell is not None and "6/12 failing" in cell.group(1) and f"{escaped} @ concurrency=" in cell.group(1)
    assert page.count('<details class="cell failing"') == 1
    assert "server starts × load points judged, 6 outside" in page
    # The serving metrics section: the tables and the Pareto picture, inline.
    section = re.search(r'<section id="metrics">(.*?)</section>', page, re.DOTALL)
    assert section is not None and "load point concurrency=1" in section.group(1)
    assert 'src="data:image/png;base64,' in section.group(1)


def bench_line(issue: str) -> list[str]:
    (line,) = [x for x in issue.splitlines() if x.startswith("vllm bench serve ")]
    return shlex.split(line)


def options(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 3
    while i < len(argv):
        name = argv[i]
        assert name in BENCH_SERVE_OPTIONS, f"not an option of vllm bench serve: {name}"
        out[name] = None if name in FLAGS else argv[i + 1]
        i += 1 if name in FLAGS else 2
    return out


def test_the_issue_shows_the_metric_and_the_bench_command_of_the_load_point(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    issue = report(runs, capsys, "--issue", "--mode", "expect:")
    assert f"**Failure mode:** `{MODE}` — 6 failing server starts × load points." in issue
    assert "curl" not in issue  # no request failed: the metric is the evidence
    # The failing cell at both load points, its figure above the bound with its interval; the
    # neighbours below it, with none of their starts outside.
    after = [x for x in issue.splitlines() if x.startswith("| after (failing) |")]
    assert len(after) == 2, issue
    for line in after:
        mean, low, high = map(float, re.findall(r"\| ([\d.]+) \[(-?[\d.]+), ([\d.]+)\] \| 3 of 3 \|$", line)[0])
        assert low < mean < high and mean > 20, line
    neighbours = [x for x in issue.splitlines() if x.startswith("| neighbour |")]
    assert neighbours and all(x.endswith("| 0 of 3 |") for x in neighbours), issue
    # The load point as `vllm bench serve` sends it: every parameter the sweeper's load phase used.
    point = re.search(r"\*\*The load point\*\* `concurrency=(\d+)`", issue)
    assert point is not None, issue
    argv = bench_line(issue)
    assert argv[:3] == ["vllm", "bench", "serve"]
    got = options(argv)
    row = pd.read_parquet(runs / "r" / "metrics").query(f"concurrency == {point.group(1)}").iloc[0]
    expected: dict[str, Any] = {"--backend": "openai", "--endpoint": "/v1/completions", "--model": "m",
                                "--dataset-name": "random", "--random-input-len": str(row["input_len"]),
                                "--random-output-len": str(row["output_len"]), "--num-prompts": str(row["num_prompts"]),
                                "--num-warmups": str(row["num_warmups"]), "--max-concurrency": point.group(1),
                                "--ignore-eos": None, "--seed": str(row["seed"]), "--temperature": "0",
                                "--base-url": "http://127.0.0.1:8000"}
    assert got == expected
    assert (row["input_len"], row["output_len"], row["num_prompts"], row["seed"]) == (20, 11, 8, 7)
    # The server it runs against, as the cell started it.
    assert "--no-async-scheduling --attention-backend TRITON_ATTN" in issue


def test_explain_on_the_metric_names_the_planted_conjunction(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = report(runs, capsys, "--explain", "--metric", "mean_tpot_ms").splitlines()
    assert [x.split(":")[0] for x in lines] == ["mean_tpot_ms @ concurrency=1", "mean_tpot_ms @ concurrency=4"]
    for line in lines:
        effect = re.search(rf": {re.escape(SLOW)}: \+(\d+\.\d)% \[\+([\d.]+), \+([\d.]+)\] \(3 starts inside, 9 outside",
                           line)
        # Three times the step: about +200 %, inside its interval.
        assert effect is not None and 150 < float(effect.group(1)) < 260, line
        assert float(effect.group(2)) < float(effect.group(1)) < float(effect.group(3)), line
    data = json.loads(report(runs, capsys, "--explain", "--metric", "mean_tpot_ms", "--json"))
    assert [p["text"] for p in data["load_points"]] == [SLOW, SLOW]
    code, out, err = run_cli(["report", "r", "--runs-dir", str(runs), "--explain", "--metric", "mean_tpot"], capsys)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "unknown metric 'mean_tpot'" in err


def test_the_triage_explains_the_expect_mode_like_any_other(runs: Path) -> None:
    explanation, samples, _ = triage_report.explained([open_run(runs, "r", create=False)], ["good"])
    assert [m.mode for m in explanation.modes] == [MODE]
    assert explanation.modes[0].failing_cells[0][0] == slow_cell(runs)
    assert (samples["case_id"].str.startswith("expect:") & ~samples["passed"].astype(bool)).sum() == 6
