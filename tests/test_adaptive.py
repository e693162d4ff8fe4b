"""Adaptive cells, the cost model in results, and a GPU-hour budget: real simulator servers through the
in-process executor, a git history made here, real Parquet. An adaptive run reaches the whole
replay's verdicts with fewer requests and says why each cell stopped; rows of schema version 1 still
read; a budget runs only what fits and the report says what it left."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_sim_repo, run_cli

from sweeper.drivers.sweep import make_plan, run_matrix
from sweeper.errors import ConfigError
from sweeper.execute.choice import choose as executor
from sweeper.install.matrix_loader import load_matrix
from sweeper.plan import budget, cost
from sweeper.store import frames as analysis
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import CELL_SCHEMA, open_run, parquet_bytes, table

ROOT = Path(__file__).resolve().parent.parent
FLAKY = {"effect": "fsm_whitespace", "when": {"spec_method": ["mtp"]}, "rate": 0.5}


def matrix_file(tmp_path: Path, suite: Path, repo: Path, extra: str = "") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"""name: t
model: Qwen/Qwen3-8B
suite: {suite}
install: {{kind: sim, repo: {repo}}}
concurrency: 4
repeats: 10
timeouts: {{startup_s: 30, request_s: 10}}
{extra}
axes:
  commit: [good, flaky]
  spec_method: [none, mtp]
  num_speculative_tokens: [2]
  request.temperature: [0, 0.5]
""")
    return path


def _verdicts(cells: object) -> dict[str, bool]:
    return {r["cell_id"]: bool(r["n_failed"]) for r in cells.to_dict("records")}  # type: ignore[attr-defined]


def test_adaptive_cells_reach_the_whole_replays_verdicts_with_fewer_requests(tmp_path: Path,
                                                                             tiny_suite: Path) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("good", {}), ("flaky", {"bugs": [FLAKY]})])
    path = matrix_file(tmp_path, tiny_suite, repo)
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    whole = analysis.load_cells(run_matrix(path, runs_dir=runs, run_id="whole", executor=executor("local"),
                                           cache_dir=cache).run)
    outcome = run_matrix(path, runs_dir=runs, run_id="adaptive", executor=executor("local"), cache_dir=cache,
                         adaptive=True)
    cells = analysis.load_cells(outcome.run)
    samples = analysis.load_samples(outcome.run)
    # Verdicts compare only between cells that ran: one cut short (a replay stopped by timeouts on a
    # loaded machine) would read as clean.
    for run in (whole, cells):
        assert set(run.status) == {"ok"}, run[["cell_id", "status", "n_samples", "status_detail"]].to_string()
    assert _verdicts(cells) == _verdicts(whole)
    # The flaky commit's two mtp cells (its FSM bug), and at temperature 0.5 a sixth of the answers
    # run past the tiny suite's max_tokens on every commit.
    assert sorted(c for c, failing in _verdicts(whole).items() if failing) == sorted(
        [c for c in whole.cell_id if c.startswith("flaky-mtp2")] + [c for c in whole.cell_id if "=0.5" in c
                                                                  and not c.startswith("flaky-mtp2")])
    assert set(whole.stop_reason.isna()) == {True} and set(whole.samples_planned) == {60}
    rows = {r["cell_id"]: r for r in cells.to_dict("records")}
    for cell_id, failing in _verdicts(whole).items():
        row = rows[cell_id]
        assert row["samples_planned"] == 60
        # Clean: 31 clean samples settle it, sent in rounds of 8; failing at 1/2: within a round or two.
        assert (row["stop_reason"], row["n_samples"]) == ("clean", 32) if not failing else \
            (row["stop_reason"] == "failing" and row["n_samples"] <= 16), row
        # Every case of the suite is in a partial replay: the order is interleaved.
        mine = samples[samples.cell_id == cell_id]
        assert len(mine) == row["n_samples"] and set(mine.case_id) == {"invoice", "event"}
    assert cells.n_samples.sum() <= 0.6 * whole.n_samples.sum()
    manifest = outcome.run.read_manifest()
    assert isinstance(manifest, SweepManifest) and manifest.adaptive is not None
    assert (manifest.adaptive.threshold, manifest.adaptive.detect, manifest.adaptive.round) == (0.01, 0.1, 8)
    # GPU-seconds are the cost model's, from each group's measured install, start and replay.
    for r in cells.to_dict("records"):
        assert r["install_s"] >= 0 and r["replay_s"] > 0 and r["startup_s"] > 0
        assert 0 < r["gpu_seconds"] <= r["duration_s"]
    by_group = cells.groupby("group_id").agg(gpu=("gpu_seconds", "sum"), duration=("duration_s", "first"))
    assert (abs(by_group.gpu - by_group.duration) < 1e-6).all()  # one GPU per server: the group's time
    measured = cost.learn(cells.to_dict("records"))
    assert measured.install_s is not None and measured.request_s and measured.groups == 4

    # A resumed run keeps its rule: a lost group runs adaptive again.
    lost = cells.group_id.iloc[0]
    for kind in ("cells", "samples"):
        (outcome.run.root / kind / f"{lost}.parquet").unlink()
    again = run_matrix(path, runs_dir=runs, resume="adaptive", executor=executor("local"), cache_dir=cache)
    assert again.ran == [lost]
    assert set(analysis.load_cells(again.run).stop_reason) <= {"clean", "failing"}


def test_the_matrix_adaptive_key_and_its_bad_values(tmp_path: Path, tiny_suite: Path) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("good", {}), ("flaky", {})])
    path = matrix_file(tmp_path, tiny_suite, repo, "adaptive: {threshold: 0.02, detect: 0.3, round: 4}")
    plan = make_plan(path, tmp_path / "runs", resolve=False)
    assert plan.rule is not None and (plan.rule.threshold, plan.rule.detect, plan.rule.round) == (0.02, 0.3, 4)
    assert plan.modelled_requests_per_cell() == plan.rule.expected_samples(60) < 60
    assert make_plan(path, tmp_path / "runs", resolve=False, adaptive=False).rule is None
    for bad, why in (("adaptive: {threshold: 0.2, detect: 0.1}", "threshold (0.2) must be below detect (0.1)"),
                     ("adaptive: {confidence: 1.5}", "adaptive.confidence"),
                     ("adaptive: {rounds: 3}", "unknown key")):
        with pytest.raises(ConfigError, match=r"m\.yaml") as caught:
            load_matrix(matrix_file(tmp_path, tiny_suite, repo, bad))
        assert why in str(caught.value) and "\n" not in str(caught.value)


def test_cells_of_schema_version_1_still_read_beside_version_2(tmp_path: Path) -> None:
    new = {"install_s", "replay_s", "samples_planned", "stop_reason"}
    old_schema = pa.schema([f for f in CELL_SCHEMA if f.name not in new],
                           metadata={b"schema_version": b"1", b"sweeper.rows": b"1"})
    run = open_run(tmp_path, "mixed", create=True)
    for group, schema in (("old", old_schema), ("new", CELL_SCHEMA)):
        run.samples_path(group).write_atomic(parquet_bytes(table([], pa.schema(
            [f for f in CELL_SCHEMA if f.name == "run_id"]))))
        cells = table([{"run_id": "mixed", "group_id": group, "cell_id": group, "status": "ok", "n_samples": 3,
                        **({"stop_reason": "clean", "samples_planned": 9} if group == "new" else {})}], schema)
        sink = pa.BufferOutputStream()
        pq.write_table(cells, sink)
        run.cells_path(group).write_atomic(sink.getvalue())
    rows = {r["cell_id"]: r for r in analysis.load_table(run, "cells").to_pylist()}
    assert (rows["old"]["stop_reason"], rows["old"]["samples_planned"]) == (None, None)
    assert (rows["new"]["stop_reason"], rows["new"]["samples_planned"]) == ("clean", 9)


def test_a_budget_runs_what_fits_and_the_report_says_what_it_left(tmp_path: Path, tiny_suite: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("good", {}), ("flaky", {})])
    # Stated: 100 s a start, 1 s a request, no install: one server of 2 cells x 60 requests is 220 s.
    path = matrix_file(tmp_path, tiny_suite, repo, "cost: {install_s: 0, start_s: 100, request_s: 1}")
    plan = make_plan(path, tmp_path / "runs", budget_hours=500 / 3600)
    assert plan.budget is not None and len(plan.groups) == 2 and len(plan.budget.left) == 2
    assert plan.budget.modelled_s == 440 and plan.estimate().gpu_seconds == 440
    adaptive = make_plan(path, tmp_path / "runs", budget_hours=500 / 3600, adaptive=True)
    assert adaptive.budget is not None and len(adaptive.groups) == 3  # 100 + 2 x 32 s each

    code, out, err = run_cli(["matrix", str(path), "--dry-run", "--budget", str(500 / 3600),
                              "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    assert "budget 0.138889 GPU-hours: 2 of 4 servers fit (0.12 GPU-hours modelled)" in out
    assert "left untested: 2 servers, 4 cells:" in out

    code, out, err = run_cli(["matrix", str(path), "--budget", str(500 / 3600), "--executor", "local",
                              "--runs-dir", str(tmp_path / "runs"), "--run-id", "b",
                              "--cache-dir", str(tmp_path / "cache")], capsys)
    assert code == 0, err
    run = open_run(tmp_path / "runs", "b", create=False)
    assert sorted(set(analysis.load_cells(run).group_id)) == sorted(g.group_id for g in plan.groups)
    manifest = run.read_manifest()
    assert isinstance(manifest, SweepManifest) and manifest.budget is not None
    assert (manifest.budget.servers, manifest.budget.left_servers, manifest.budget.left_cells) == (2, 2, 4)
    assert set(manifest.budget.left_groups) == {g.group_id for g in plan.budget.left}
    code, out, err = run_cli(["report", "b", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    assert "budget: 0.138889 GPU-hours: 2 servers (4 cells) fitted, modelled at 0.122 GPU-hours" in out
    assert "left untested: 2 servers (4 cells): " in out and plan.budget.left[0].group_id in out
    assert "GPU time: " in out and "GPU-hours measured over 2 servers" in out

    code, _, err = run_cli(["matrix", str(path), "--dry-run", "--budget", "0"], capsys)
    assert code == 1 and "--budget: expected a number of GPU-hours above 0, got 0" in err
    code, _, err = run_cli(["bisect", "--good", "a", "--bad", "b", "--budget", "-1", "--runs-dir",
                            str(tmp_path / "runs")], capsys)
    assert code == 1 and err.strip() == "error: --budget: expected a number of GPU-hours above 0, got -1"
    code, _, err = run_cli(["bisect", "--good", "a", "--bad", "b", "--bumps", "-1", "--runs-dir",
                            str(tmp_path / "runs")], capsys)
    assert code == 1 and err.strip() == "error: --bumps: expected a number of commits >= 1, or 0 for no scan, got -1"
    code, _, err = run_cli(["bisect", "--good", "a", "--bad", "b", "--expect-changes", "0", "--runs-dir",
                            str(tmp_path / "runs")], capsys)
    assert code == 1 and err.strip() == "error: --expect-changes: expected a number of changes per range above 0, got 0"


def test_a_budget_spreads_the_servers_it_fits_over_the_axes(tmp_path: Path, tiny_suite: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(f"""model: m
suite: {tiny_suite}
install: {{kind: sim, repo: "sim:demo"}}
cost: {{install_s: 0, start_s: 10, request_s: 0}}
axes:
  env.A: ["0", "1", "2"]
  env.B: ["0", "1", "2"]
""")
    groups = load_matrix(path).groups()
    profile = cost.profile_for(load_matrix(path).spec, cost.stated("sim", (0.0, 0.0, 0.0)))
    fit = budget.fit(groups, profile, requests_per_cell=6, gpus=1, installs=True, budget_s=30)
    assert len(fit.kept) == 3 and len(fit.left) == 6 and fit.modelled_s == 30
    # Three servers hold every value of both axes once: each taken for the most new pairs of values.
    for axis in ("A", "B"):
        assert sorted(g.head.env[axis] for g in fit.kept) == ["0", "1", "2"]
    # An install per commit counts with its commit's first server only.
    assert budget.fit(groups, cost.Profile(100, 10, 0, "t"), requests_per_cell=1, gpus=2, installs=True,
                      budget_s=2 * (100 + 10 * 3)).kept.__len__() == 3
    assert budget.fit(groups, profile, requests_per_cell=6, gpus=1, installs=True, budget_s=5).kept == ()


def test_the_thor_dry_run_shows_the_covering_adaptive_phase_next_to_the_full_product(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["matrix", str(ROOT / "matrices/thor.yaml"), "--design", "covering:3", "--adaptive",
                              "--dry-run"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "thor: 26 cells on 26 servers, 101 requests per cell (suite thinking-budget+structured-output)"
    assert sum(line.startswith("server ") for line in lines) == 26
    tail = lines[-6:]
    assert tail[0] == "design: covering, strength 3 over 6 server axes (seed 0): 26 of 96 servers, 26 of 96 cells"
    assert tail[1].startswith("adaptive: each cell stops once settled (failing above 1%, clean below 10%, at 95%")
    assert tail[3:] == [
        "  this design, adaptive       26 starts, 3 installs, 832 requests: 2.27 GPU-hours",
        "  the design, whole suites    26 starts, 3 installs, 2,626 requests: 3.27 GPU-hours",
        "  full product, whole suites  96 starts, 3 installs, 9,696 requests: 11.86 GPU-hours"]
