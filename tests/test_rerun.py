"""`sweep matrix FILE --where AXIS=VALUE --resume RUN`: the cells picked run again into the same run,
their stored rows replaced, every other stored row and file kept as it was."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_sim_repo, run_cli

from sweeper.store import frames as analysis
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import RunDir

FLAKY: dict[str, object] = {}  # c1 changes nothing: the rows tell the runs apart, not the rates


@pytest.fixture
def matrix(tmp_path: Path, tiny_suite: Path) -> Path:
    make_sim_repo(tmp_path / "vllm", [("v0.27.0", {}), ("c1", FLAKY)])
    path = tmp_path / "m.yaml"
    path.write_text(f"""
name: re
model: Qwen/Qwen3-8B
suite: {tiny_suite}
install: {{kind: sim, repo: {tmp_path / "vllm"}}}
timeouts: {{startup_s: 30, request_s: 10}}
axes:
  commit: [v0.27.0, c1]
  spec_method: [none, mtp]
  num_speculative_tokens: [2]
  request.temperature: [0, 0.6]
""")
    return path


def _args(tmp_path: Path, matrix: Path, *extra: str) -> list[str]:
    return ["matrix", str(matrix), "--runs-dir", str(tmp_path / "runs"), "--executor", "local",
            "--cache-dir", str(tmp_path / "cache"), *extra]


def _by_cell(rows: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        out.setdefault(str(row["cell_id"]), []).append(row)
    return {k: sorted(v, key=lambda r: str(r["request_id"])) for k, v in out.items()}


def test_a_rerun_replaces_the_picked_cells_rows_and_keeps_the_rest(
        tmp_path: Path, matrix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(_args(tmp_path, matrix, "--run-id", "r"), capsys)
    assert code == 0, err
    run = RunDir(tmp_path / "runs" / "r")
    files = {p.relative_to(run.root): p.read_bytes() for p in run.root.rglob("*.parquet")}
    before = _by_cell(analysis.load_table(run, "samples").to_pylist())
    cells_before = {r["cell_id"]: r for r in analysis.load_cells(run).to_dict("records")}
    assert len(before) == 8 and len(files) == 8  # 4 servers, 2 cells each (temperature is per request)
    picked = {c for c in cells_before if "-mtp2-temperature=0-" in c}
    assert len(picked) == 2

    code, out, err = run_cli(_args(tmp_path, matrix, "--where", "spec_method=mtp", "--where",
                                   "request.temperature=0", "--resume", "r"), capsys)
    assert code == 0, err
    assert "re-ran the cells of --where spec_method=mtp request.temperature=0 on 2 servers" in out
    after = _by_cell(analysis.load_table(run, "samples").to_pylist())
    cells_after = analysis.load_cells(run)
    # One row set per cell: no cell twice, none lost, as many samples per cell as before.
    assert sorted(cells_after["cell_id"]) == sorted(cells_before)
    assert {c: len(v) for c, v in after.items()} == {c: len(v) for c, v in before.items()}
    for cell, rows in after.items():
        ids_before = {r["request_id"] for r in before[cell]}
        if cell in picked:  # new requests, on a new server start
            assert not ids_before & {r["request_id"] for r in rows}, cell
            assert min(r["started_at"] for r in rows) > max(r["started_at"] for r in before[cell])
        else:
            assert rows == before[cell], cell
    # The servers of spec_method none were not touched at all; the two re-run groups' files were replaced,
    # their old files kept under replaced/.
    now = {p.relative_to(run.root): p.read_bytes() for p in run.root.glob("[sc]*/*.parquet")}
    changed = {p for p, data in now.items() if files[p] != data}
    assert len(changed) == 4 and all("mtp" in str(p) for p in changed)
    kept = {Path(*p.relative_to(run.root / "replaced").parts[1:]): p.read_bytes()
            for p in (run.root / "replaced").rglob("*.parquet")}
    assert kept == {p: files[p] for p in changed}
    for path in changed:
        assert pq.read_metadata(run.root / path).num_rows == pq.read_metadata(tmp_path / "runs" / "r" / path).num_rows
    # Each re-run group's log holds both server starts.
    for gid in {str(p.stem) for p in changed}:
        log = run.read_log(gid) or ""
        assert "===== sweep: re-run of " in log and log.count("Starting vLLM API server") == 2, log[-2000:]
    assert run.scan().damage == []
    manifest = run.read_manifest()
    assert isinstance(manifest, SweepManifest)
    assert manifest.phases[-1].kind == "rerun" and manifest.phases[-1].cells == 2
    assert manifest.phases[-1].reason == "--where spec_method=mtp request.temperature=0"


def test_a_bad_axis_or_value_is_one_line_naming_what_exists(
        tmp_path: Path, matrix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(_args(tmp_path, matrix, "--run-id", "r"), capsys)
    assert code == 0, err
    code, out, err = run_cli(_args(tmp_path, matrix, "--where", "spec_methd=mtp", "--resume", "r"), capsys)
    assert (code, out) == (1, "")
    assert err == (f"error: --where: spec_methd is not an axis of {matrix}; axes: commit, spec_method, "
                   "num_speculative_tokens, request.temperature\n")
    code, out, err = run_cli(_args(tmp_path, matrix, "--where", "spec_method=eagle", "--resume", "r"), capsys)
    assert (code, out, err) == (1, "", "error: --where: no cell has spec_method=eagle; its values: none, mtp\n")
    code, out, err = run_cli(_args(tmp_path, matrix, "--where", "spec_method=mtp"), capsys)
    assert (code, out, err) == (1, "", "error: --where: re-runs cells of a stored run: add --resume RUN_ID\n")
    code, out, err = run_cli(_args(tmp_path, matrix, "--where", "spec_method=mtp", "--dry-run", "--resume", "r"),
                             capsys)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "re-run in r: 4 cells on 2 servers (--where spec_method=mtp)"
    # A group without results (its cells file lost) runs whole: its other cell was never stored either.
    run = RunDir(tmp_path / "runs" / "r")
    gid = next(p.stem for p in (run.root / "cells").glob("v0.27.0-mtp2-*.parquet"))
    (run.root / "cells" / f"{gid}.parquet").unlink()
    code, out, err = run_cli(_args(tmp_path, matrix, "--where", "request.temperature=0", "--dry-run", "--resume", "r"),
                             capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "re-run in r: 5 cells on 4 servers (--where request.temperature=0)"
    assert f"server {gid} (no results yet: the whole group):" in lines
