"""What a triager reads first: `sweep report`'s table in 100 columns (through a terminal and a pipe),
in one order, with every failure's reason; `--json`; `sweep runs list`; a bisect run's verdict;
`--version` and `SWEEP_RUNS_DIR`. Runs written here through the store, no server needed."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import run_cli

from sweeper.drivers import runs
from sweeper.reports.bisect import render
from sweeper.spec.matrix import canonical
from sweeper.store import frames as analysis
from sweeper.store.manifest import BisectManifest, SweepManifest
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, table

# The shared demo run, in process (made once per test run).
pytest_plugins = ["reportruns"]

# The demo's shape: commits in history order (not by name), spec methods in the matrix's order, a
# constant axis that does not apply without a spec method, a request axis.
COMMITS = ["v0.27.0", "v0.28.0~3", "v0.28.0", "main"]
SPECS = ["none", "ngram", "mtp"]
TYPO = "--reasoning-parsr is not offered; commit main has vLLM 0.28.1.dev4"


def cell_rows(run_id: str, commits: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cells, samples = [], []
    for commit in commits:
        for spec in SPECS:
            for temperature in (0, 0.6):
                k = 4 if spec != "none" else None
                axes = [("commit", canonical(commit)), ("spec_method", canonical(spec)),
                        *([("num_speculative_tokens", canonical(k))] if k else []),
                        ("request.temperature", canonical(temperature))]
                cell_id = f"{commit}-{spec}-{temperature}"
                common = {"run_id": run_id, "group_id": f"g-{commit}-{spec}", "cell_id": cell_id,
                          "server_key": f"{commit}-{spec}", "commit": commit, "spec_method": spec,
                          "num_speculative_tokens": k, "axes": axes}
                failed = 3 if spec == "mtp" and commit != "v0.27.0" else 0
                status = "server_failed" if (commit, spec) == ("main", "ngram") else "ok"
                n = 0 if status != "ok" else 10
                cells.append({**common, "status": status, "status_detail": TYPO if status != "ok" else None,
                              "n_samples": n, "n_failed": failed if n else 0,
                              "failed_checks": [("finish_reason", failed), ("no_whitespace_tail", 1)] if failed and n
                              else [], "effective_differs": ["model_runner"] if spec == "ngram" else []})
                for i in range(n):
                    bad = i < failed
                    samples.append({**common, "case_id": f"case{i % 2}", "repeat": i, "passed": not bad,
                                    "failed_checks": ["finish_reason"] if bad else []})
    return cells, samples


def write_sweep(runs_dir: Path, run_id: str, created: str, fixed_env: str = "1",
                commits: list[str] = COMMITS) -> RunDir:
    run = RunDir(runs_dir / run_id)
    run.write_manifest(SweepManifest(
        run_id=run_id, created=created,
        matrix={"name": "demo", "env": {"VLLM_ENFORCE_STRICT_TOOL_CALLING": fixed_env},
                "axes": {"commit": sorted(COMMITS), "spec_method": SPECS, "num_speculative_tokens": [4],
                         "request.temperature": [0, 0.6]}},
        commit_order=tuple(COMMITS), groups=len(COMMITS) * len(SPECS)))
    cells, samples = cell_rows(run_id, commits)
    for group in dict.fromkeys(c["group_id"] for c in cells):
        run.write_group(group, table([s for s in samples if s["group_id"] == group], SAMPLE_SCHEMA),
                        table([c for c in cells if c["group_id"] == group], CELL_SCHEMA))
    return run


def sweep(*args: str, env: dict[str, str] | None = None, terminal: bool = False,
          unset: tuple[str, ...] = ()) -> tuple[int, str]:
    """`sweep ARGS` in a subprocess, COLUMNS=100: through a pseudo-terminal (the output a person sees)
    or a pipe; `unset`: variables of this process it does not get. Returns (exit code, output)."""
    environ = {**{k: v for k, v in os.environ.items() if k not in unset}, "COLUMNS": "100", **(env or {})}
    command = [sys.executable, "-m", "sweeper", *args]
    if not terminal:
        proc = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120, check=False)
        return proc.returncode, proc.stdout + proc.stderr
    leader, follower = pty.openpty()
    proc2 = subprocess.Popen(command, env=environ, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 120)
            if not ready:
                proc2.kill()
                break
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
    except BaseException:
        # A pytest timeout lands here with the run still going: end it as a user's kill would (it
        # stops its Ray), rather than leave it and its Ray behind the test.
        proc2.terminate()
        try:
            proc2.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc2.kill()
            proc2.wait()
        raise
    finally:
        os.close(leader)
    code = proc2.wait(timeout=60)
    text = b"".join(chunks).decode()
    # A terminal gets colours and CRLF line ends: what is left is what the eye sees.
    import re

    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r\n", "\n")


def rows_of(text: str) -> list[list[str]]:
    """The table's body rows as lists of cells (a folded cell's lines joined by spaces)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "━" in line) + 1
    out: list[list[str]] = []
    for line in lines[start:]:
        if "│" not in line:
            break
        parts = [p.strip() for p in line.split("│")]
        if parts[0]:
            out.append(parts)
        else:
            out[-1] = [f"{a} {b}".strip() for a, b in zip(out[-1], parts, strict=True)]
    return out


@pytest.mark.parametrize("terminal", [True, False], ids=["pty", "pipe"])
def test_the_report_fits_100_columns_failing_first_in_history_order(tmp_path: Path, terminal: bool) -> None:
    write_sweep(tmp_path, "demo", "2026-01-01T00:00:00+00:00")
    code, text = sweep("report", "demo", "--runs-dir", str(tmp_path), terminal=terminal)
    assert code == 0, text
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) <= 100, text
    # The constant axis is said once above the table, not a column of its own; headers are short.
    assert "fixed: k=4" in text and "num_speculative_tokens" not in text
    assert "spec " in text and "spec_method" not in text
    rows = rows_of(text)
    assert len(rows) == 24
    failing = [r for r in rows if r[3] != "ok" or not r[4].startswith("0/")]
    assert rows[:len(failing)] == failing  # failing cells first
    # Then commits in history order, spec methods in the matrix's order, temperatures as listed.
    expected = [(c, s, t) for c in COMMITS for s in SPECS for t in ("0", "0.6")]
    failing_keys = [(r[0], r[1], r[2]) for r in failing]
    assert failing_keys == [k for k in expected if k in failing_keys]
    assert [(r[0], r[1], r[2]) for r in rows[len(failing):]] == [k for k in expected if k not in failing_keys]
    # One short mode label per failing row, and the reason of every cell that is not ok.
    assert {r[6] for r in failing if r[3] == "ok"} == {"finish_reason +1"}
    notes = {r[7].replace(" ", "") for r in rows if r[3] != "ok"}
    assert notes == {TYPO.replace(" ", "")}
    assert "Token authentication" not in text


def test_json_matches_the_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_sweep(tmp_path, "demo", "2026-01-01T00:00:00+00:00")
    code, out, err = run_cli(["report", "demo", "--runs-dir", str(tmp_path), "--json"], capsys)
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["schema"], data["run_id"], data["kind"]) == ("sweep-report/1", "demo", "matrix")
    assert data["fixed"] == {"num_speculative_tokens": "4"}
    stored = {r["cell_id"]: r for f in sorted((run.root / "cells").glob("*.parquet"))
              for r in pq.read_table(f).to_pylist()}
    assert sorted(c["cell_id"] for c in data["cells"]) == sorted(stored)
    for cell in data["cells"]:
        row = stored[cell["cell_id"]]
        assert set(cell) == set(CELL_SCHEMA.names)
        assert cell["axes"] == {k: json.loads(v) for k, v in row["axes"]}
        assert cell["failed_checks"] == dict(row["failed_checks"] or [])
        for name in ("status", "status_detail", "n_samples", "n_failed", "commit", "spec_method",
                     "num_speculative_tokens", "effective_differs"):
            assert cell[name] == row[name], name
    # In the table's order: failing cells first.
    failing = [c["status"] != "ok" or c["n_failed"] > 0 for c in data["cells"]]
    assert failing == sorted(failing, reverse=True)


def test_explain_heatmap_and_html_print_only_their_own_output(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    write_sweep(tmp_path, "demo", "2026-01-01T00:00:00+00:00")
    base = ["report", "demo", "--runs-dir", str(tmp_path)]
    code, out, _ = run_cli([*base, "--heatmap", str(tmp_path / "h.png")], capsys)
    assert (code, out) == (0, f"heatmap: {tmp_path / 'h.png'}\n")
    code, out, _ = run_cli([*base, "--html", str(tmp_path / "r.html")], capsys)
    assert (code, out) == (0, f"html: {tmp_path / 'r.html'}\n")
    code, out, _ = run_cli([*base, "--explain"], capsys)
    assert code == 0 and "━" not in out and "failed/n" not in out
    code, out, err = run_cli([*base, "--heatmap", str(tmp_path / "x.png"), "--cols", "spec_methd"], capsys)
    assert (code, out) == (1, "") and "spec_methd" in err


def test_runs_list_by_creation_time_and_the_latest_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = write_sweep(tmp_path, "b-newer", "2026-01-02T00:00:00+00:00")
    old = write_sweep(tmp_path, "a-older", "2026-01-01T00:00:00+00:00")
    bisect = RunDir(tmp_path / "c-bisect")
    bisect.write_manifest(BisectManifest(run_id="c-bisect", created="2025-12-31T00:00:00+00:00",
                                         matrix={"name": "demo"}, good="v0.27.0", bad="main"))
    # The oldest run's manifest written last (a bisect resumed rewrites it): still the oldest.
    bisect.write_manifest(bisect.read_manifest())
    os.utime(new.manifest_path, (1, 1))
    assert bisect.read_manifest().created == "2025-12-31T00:00:00+00:00"
    assert [r.run_id for r in analysis.run_dirs(tmp_path)] == ["c-bisect", "a-older", "b-newer"]
    assert analysis.latest_run(tmp_path).run_id == "b-newer"
    assert analysis.latest_run(tmp_path, "bisect").run_id == "c-bisect"
    assert analysis.latest_run(tmp_path, "matrix").run_id == "b-newer"

    code, out, err = run_cli(["runs", "list", "--runs-dir", str(tmp_path), "--json"], capsys)
    assert (code, err) == (0, "")
    listed = json.loads(out)
    assert [(r["run_id"], r["kind"], r["matrix"], r["cells"], r["failing"], r["status"]) for r in listed] == [
        ("c-bisect", "bisect", "demo", 0, 0, "unfinished"), ("a-older", "matrix", "demo", 24, 8, "done"),
        ("b-newer", "matrix", "demo", 24, 8, "done")]
    assert listed[1]["created"] == "2026-01-01T00:00:00+00:00"
    stored = analysis.load_cells(old)
    assert listed[1]["cells"] == len(stored)
    assert listed[1]["failing"] == int(((stored.status != "ok") | (stored.n_failed > 0)).sum())
    assert [dataclasses.asdict(r) for r in runs.listing(tmp_path)] == listed

    code, out, err = run_cli(["runs", "list", "--runs-dir", str(tmp_path)], capsys)
    assert (code, err) == (0, "") and max(map(len, out.splitlines())) <= 100
    assert [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")] == [
        "c-bisect", "a-older", "b-newer"]


def test_runs_dir_from_the_environment_and_the_version(tmp_path: Path) -> None:
    write_sweep(tmp_path, "demo", "2026-01-01T00:00:00+00:00")
    code, text = sweep("runs", "list", "--json", env={"SWEEP_RUNS_DIR": str(tmp_path)})
    assert code == 0 and [r["run_id"] for r in json.loads(text)] == ["demo"]
    code, text = sweep("report", "--json", env={"SWEEP_RUNS_DIR": str(tmp_path)})
    assert code == 0 and json.loads(text)["run_id"] == "demo"
    from sweeper import __version__

    assert sweep("--version") == (0, f"sweep {__version__}\n")


SUMMARY = {"schema": "sweep-bisect/2", "final": True, "range": {"good": "a" * 40, "bad": "b" * 40, "commits": 5},
           "confidence": 0.99, "by_commit": [], "cells": [], "rounds": 1, "server_starts": 1, "reused_samples": 0,
           "gpu_seconds": 3.0}


def test_report_on_a_bisect_run_prints_its_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = RunDir(tmp_path / "bis")
    run.write_manifest(BisectManifest(run_id="bis", matrix={"name": "demo"}, good="v0.27.0", bad="main"))
    code, out, err = run_cli(["report", "--runs-dir", str(tmp_path)], capsys)
    assert (code, out) == (1, "")
    assert err == ("error: bisect run bis has no verdict yet (no readable bisect.json); "
                   "`sweep bisect --good v0.27.0 --bad main --resume bis` continues it\n")
    run.write_json("bisect.json", SUMMARY)
    code, out, err = run_cli(["report", "bis", "--runs-dir", str(tmp_path)], capsys)
    assert (code, out, err) == (0, render(SUMMARY) + "\n", "")
    assert "1 server start in 1 round," in out


def test_the_heatmap_scale_comes_from_the_data_with_a_labelled_bar(tmp_path: Path) -> None:
    """30 % at most: the colour bar runs 0–30 %, labelled, so that 30 % is a full colour, not a pale one."""
    run = write_sweep(tmp_path, "demo", "2026-01-01T00:00:00+00:00")
    from sweeper.reports import tables as report

    counts = analysis.failure_counts(run, ["commit", "spec_method"])
    path = report.heatmap(counts, ["commit"], ["spec_method"], tmp_path / "h.svg", orders=report.run_orders(run))
    svg = path.read_text()
    assert "<!-- failure rate -->" in svg
    assert "<!-- 30% -->" in svg and "<!-- 100% -->" not in svg and "<!-- 1.0 -->" not in svg
    # Rows and columns in the one order: commits in history order, spec methods as the matrix lists them.
    pivot = report.failure_pivot(counts, ["commit"], ["spec_method"], orders=report.run_orders(run))
    assert list(pivot.index) == COMMITS and list(pivot.columns) == SPECS


def test_against_warns_of_differing_fixed_settings_and_counts_matched_cells_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_sweep(tmp_path, "a", "2026-01-02T00:00:00+00:00", fixed_env="1")
    # B measured two of A's four commits: only those cells are compared, modes included.
    write_sweep(tmp_path, "b", "2026-01-01T00:00:00+00:00", fixed_env="0", commits=["v0.27.0", "v0.28.0"])
    code, out, err = run_cli(["report", "a", "--against", "b", "--runs-dir", str(tmp_path)], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:3] == [
        "run a against b (change = a − b)",
        ("  warning: fixed setting env.VLLM_ENFORCE_STRICT_TOOL_CALLING differs: 1 in a, 0 in b (every matched "
         "cell differs in it too)"),
        "  failure modes over the 12 matched cells only (12 only in a, 0 only in b left out)"]
    # Matched: v0.27.0 (no failures) and v0.28.0 (3 of 10 in each mtp cell), 120 samples a side: the same.
    assert lines[3] == "  mode in both: finish_reason: 6/120 (5.0%) → 6/120 (5.0%)"


ROOT = Path(__file__).resolve().parent.parent
DEMO_COMPARED = ["cell_id", "status", "n_samples", "n_failed", "failed_checks", "server_starts"]


def _demos_end_of_run_table(code: int, text: str, runs: Path, terminal: bool) -> None:
    """The table `sweep matrix matrices/demo.yaml` ends with: 100 columns, failing cells first, each
    block in history order, and the same rows as `sweep report` gives of that run."""
    assert code == 0, text[-3000:]
    assert "Token authentication" not in text
    table = text[text.index("run demo"):text.index("results:")]
    assert max(len(line) for line in table.splitlines()) <= 100, table
    assert "fixed: k=4" in table and "num_speculative_tokens" not in table
    rows = rows_of(table)
    assert len(rows) == 48
    failing = [r for r in rows if r[4] != "ok" or not r[5].startswith("0/")]
    assert failing and rows[:len(failing)] == failing
    for block in (failing, rows[len(failing):]):
        commits = [r[0] for r in block]
        assert commits == sorted(commits, key=COMMITS.index)  # history order, not by name
    code, report = sweep("report", "demo", "--runs-dir", str(runs), terminal=terminal)
    assert code == 0 and rows_of(report) == rows


@pytest.mark.ray
def test_the_demos_end_of_run_table_fits_100_columns_in_a_terminal_on_ray(tmp_path: Path, demo_run: RunDir) -> None:
    """`sweep matrix matrices/demo.yaml` as a newcomer runs it, in a terminal, on the embedded Ray (whose
    token notice is not shown): the same table, and the same cells as the shared demo run, which the
    in-process executor made."""
    # As a newcomer's shell has it: no RAY_AUTH_MODE (Ray then enables token authentication, and says so).
    code, text = sweep("matrix", str(ROOT / "matrices" / "demo.yaml"), "--runs-dir", str(tmp_path / "runs"),
                       "--run-id", "demo", env={"SWEEP_CACHE": str(tmp_path / "cache"), "RAY_ADDRESS": ""},
                       terminal=True, unset=("RAY_AUTH_MODE",))
    _demos_end_of_run_table(code, text, tmp_path / "runs", terminal=True)
    # Ray and the shared in-process run: the same cells, statuses, failure counts and server starts.
    here, shared = (analysis.load_cells(r)[DEMO_COMPARED].sort_values("cell_id").reset_index(drop=True)
                    for r in (RunDir(tmp_path / "runs" / "demo"), demo_run))
    assert len(shared) == 48 and shared["n_failed"].sum() > 0
    assert here.astype(str).equals(shared.astype(str)), here.compare(shared)


def test_the_demos_end_of_run_table_fits_100_columns_piped(demo_run: RunDir, demo_output: tuple[int, str]) -> None:
    """The same demo, piped and in-process: the shared demo run is made by that very command."""
    _demos_end_of_run_table(*demo_output, demo_run.root.parent, terminal=False)


def test_a_bisect_of_one_start_a_round_says_so_in_the_singular(tmp_path: Path, tiny_suite: Path) -> None:
    from conftest import crash_history

    from sweeper.drivers.bisect import BisectOptions, BisectScope, run_bisect
    from sweeper.execute.choice import choose

    crash_history(tmp_path, tiny_suite, 2, crash_from=1, after_requests=1)
    events: list[str] = []
    outcome = run_bisect(BisectScope(good="v0.27", bad="c1", matrix_path=tmp_path / "m.yaml", where=["spec_method=mtp"]),
                         BisectOptions(parallel=1, runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache"),
                         executor=choose("local"), on_event=events.append)
    assert "1 server start per round" in events
    assert outcome.summary["server_starts"] >= 1


def test_a_bisect_prices_what_it_leaves_open_with_the_matrixs_cost(
        tmp_path: Path, tiny_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing fails anywhere, so the bad endpoint passes; the report prices the scan that could look
    for a regression fixed again inside (`bump_scan`) as the matrix states a start and a request cost,
    not at a default: 1,000 s a start and 1 s a request make a scan's probe of 64 samples 1,064 s.
    `--bumps 0`: not even the scan a bisect makes before it says nothing changed. `--expect-changes 2`:
    the search's prior, recorded in the verdict."""
    from conftest import crash_history

    crash_history(tmp_path, tiny_suite, 12, crash_from=12, after_requests=1)  # no commit crashes
    matrix = tmp_path / "m.yaml"
    matrix.write_text(matrix.read_text() + "cost: {install_s: 0, start_s: 1000, request_s: 1}\n")
    code, printed, err = run_cli(["bisect", "--good", "v0.27", "--bad", "c11", "--matrix", str(matrix),
                                  "--where", "spec_method=mtp", "--executor", "local", "--parallel", "4", "--bumps", "0",
                                  "--expect-changes", "2", "--json", "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache")],
                                 capsys)
    assert code == 0, err
    verdict = json.loads(printed)
    (cell,) = verdict["cells"]
    assert verdict["quiet_scan"] is None and verdict["bump_width"] is None and verdict["expected_changes"] == 2.0
    assert "searched expecting 2 changes per mode over the range (--expect-changes)" in render(verdict)
    assert cell["bad_endpoint"] == "passes" and cell["widest_unprobed"] >= 3
    scan = cell["bump_scan"]
    assert scan["width"] == 3 and scan["server_starts"] >= 1
    assert scan["gpu_seconds"] == pytest.approx(1064.0 * scan["server_starts"])


# The full tier: a whole simulated scan (18 s); the scan itself is checked on scripted counts in the fast
# tier (`tests/test_search_power.py::test_a_bump_scan_leaves_no_stretch_of_its_width_unprobed`).
@pytest.mark.full
def test_bisect_bumps_finds_a_crash_fixed_again_inside_the_range(
        tmp_path: Path, tiny_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine dies at c4..c6 only: nothing fails at either end (without a scan the bad endpoint
    passes and that is all: `tests/test_bisect.py`). A bisect about to say nothing changed probes every
    run of three commits first, unasked, finds the crash, and names both the commit that brought it
    and the one that fixed it."""
    from conftest import crash_history

    shas = crash_history(tmp_path, tiny_suite, 10, crash_from=4, crash_until=7, after_requests=1)
    code, printed, err = run_cli(["bisect", "--good", "v0.27", "--bad", "c9", "--matrix", str(tmp_path / "m.yaml"),
                                  "--where", "spec_method=mtp", "--executor", "local", "--parallel", "4",
                                  "--json", "--runs-dir", str(tmp_path / "runs"),
                                  "--cache-dir", str(tmp_path / "cache")], capsys)
    assert code == 0, err
    verdict = json.loads(printed)
    (cell,) = verdict["cells"]
    assert verdict["bump_width"] is None and verdict["quiet_scan"] == 3 and cell["bad_endpoint"] == "passes"
    found = [(c["direction"], c["commit"]["sha"]) for c in cell["changes"] if c["found"]]
    assert found == [("regression", shas["c4"]), ("fix", shas["c7"])], cell["changes"]


def test_report_json_on_a_bisect_run_is_the_verdict_bisect_json_printed(
        tmp_path: Path, tiny_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`sweep report BISECT_RUN --json`: the object `sweep bisect --json` printed, read back without
    starting anything (no executor is named: none is needed)."""
    from conftest import crash_history

    crash_history(tmp_path, tiny_suite, 2, crash_from=1, after_requests=1)
    runs = str(tmp_path / "runs")
    code, printed, err = run_cli(["bisect", "--good", "v0.27", "--bad", "c1", "--matrix", str(tmp_path / "m.yaml"),
                                  "--where", "spec_method=mtp", "--parallel", "1", "--executor", "local", "--json",
                                  "--runs-dir", runs, "--run-id", "bis", "--cache-dir", str(tmp_path / "cache")],
                                 capsys)
    assert code == 0, err
    verdict = json.loads(printed)
    assert verdict["schema"] == "sweep-bisect/2" and verdict["final"] is True
    code, out, err = run_cli(["report", "bis", "--json", "--runs-dir", runs], capsys)
    assert (code, err) == (0, "")
    assert json.loads(out) == verdict
