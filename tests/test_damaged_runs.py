"""Damaged runs: a truncated samples or cells file, a manifest that is random bytes, `[]` or gone.

One real run (real Ray, real simulator servers, real Parquet) is made once; each case damages a copy
of it. In every case `sweep report` warns and names the damage (and still reports what is sound),
`sweep runs check` lists it, `sweep matrix --resume` repairs it without losing or duplicating a row,
and `sweep runs repair` rebuilds a lost manifest or says exactly why it cannot.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_sim_repo, run_cli

from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

COMMITS = ["c0", "c1"]
ROWS = len(COMMITS) * 2 * 2 * 3  # commits x spec methods x cases x repeats


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(matrix file, runs folder with run `r`): 2 commits x 2 spec methods = 4 server groups."""
    from conftest import SUITE

    from sweeper.drivers.sweep import run_matrix
    from sweeper.execute.choice import choose

    tmp = tmp_path_factory.mktemp("made")
    (tmp / "tiny.yaml").write_text(SUITE)
    make_sim_repo(tmp / "vllm", [(c, {}) for c in COMMITS])
    path = tmp / "m.yaml"
    path.write_text(f"name: t\nmodel: m\nsuite: {tmp / 'tiny.yaml'}\ninstall: {{kind: sim, repo: {tmp / 'vllm'}}}\n"
                    "concurrency: 2\ntimeouts: {startup_s: 60, request_s: 20}\n"
                    f"axes:\n  commit: {json.dumps(COMMITS)}\n  spec_method: [none, mtp]\n"
                    "  num_speculative_tokens: [2]\n")
    outcome = run_matrix(path, runs_dir=tmp / "runs", run_id="r", executor=choose("local"))
    assert len(outcome.ran) == 4
    return path, tmp / "runs"


def copy_run(made: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path, RunDir]:
    path, runs = made
    shutil.copytree(runs, tmp_path / "runs", symlinks=True)
    return path, tmp_path / "runs", RunDir(tmp_path / "runs" / "r")


def first_group(run: RunDir) -> str:
    return min(p.stem for p in (run.root / "cells").glob("*.parquet"))


def truncate(kind: str) -> Callable[[RunDir], str]:
    def damage(run: RunDir) -> str:
        group = first_group(run)
        path = run.root / kind / f"{group}.parquet"
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return f"group {group}"
    return damage


def rewrite_short(run: RunDir) -> str:
    """A sound Parquet file holding fewer rows than were written (only the recorded count tells)."""
    group = first_group(run)
    path = run.root / "samples" / f"{group}.parquet"
    tbl = pq.read_table(path)
    pq.write_table(tbl.slice(0, tbl.num_rows - 1).replace_schema_metadata({b"schema_version": b"1"}), path)
    return f"group {group}"


def manifest_bytes(data: bytes | None) -> Callable[[RunDir], str]:
    def damage(run: RunDir) -> str:
        if data is None:
            (run.root / "manifest.json").unlink()
        else:
            (run.root / "manifest.json").write_bytes(data)
        return "manifest.json"
    return damage


DAMAGE = {
    "truncated-samples": truncate("samples"),
    "truncated-cells": truncate("cells"),
    "samples-short-of-rows": rewrite_short,
    "manifest-random-bytes": manifest_bytes(os.urandom(64) + b"\xff\xfe"),
    "manifest-list": manifest_bytes(b"[]"),
    "manifest-missing": manifest_bytes(None),
}


def assert_one_line_each(err: str) -> None:
    assert "Traceback" not in err and "╭" not in err
    for line in err.splitlines():
        if line.startswith("t: servers "):  # the progress bar
            continue
        assert line.startswith(("warning: ", "note: ", "error: ")), line


def assert_all_rows_once(run: RunDir) -> None:
    samples = analysis.load_samples(run, columns=["cell_id", "case_id", "repeat", "passed"])
    assert len(samples) == ROWS
    assert not samples[["cell_id", "case_id", "repeat"]].duplicated().any()
    assert len(analysis.load_cells(run, columns=["cell_id"])) == len(COMMITS) * 2


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", list(DAMAGE))
def test_report_warns_check_lists_resume_repairs(case: str, made: tuple[Path, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path, runs, run = copy_run(made, tmp_path)
    before = sorted((run.root / "logs").glob("*.log"))
    part = DAMAGE[case](run)

    # report: a warning naming the damaged part, and the rest of the run (the heatmap too).
    code, out, err = run_cli(["report", "r", "--runs-dir", str(runs), "--heatmap", str(tmp_path / "h.png")], capsys)
    assert code == 0, err
    assert_one_line_each(err)
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"run r: {part}: " in warnings[0], err
    assert out == f"heatmap: {tmp_path / 'h.png'}\n" and (tmp_path / "h.png").stat().st_size > 1000
    code, out, table_err = run_cli(["report", "r", "--runs-dir", str(runs)], capsys)
    assert (code, table_err) == (0, err) and "run r" in out  # the table, with the same warning
    if part.startswith("group"):
        assert "runs it again" in warnings[0]
        assert len(analysis.load_samples(run, columns=["cell_id"])) == ROWS - 2 * 3  # one cell: 2 cases x 3 repeats
    else:
        assert "sweep runs repair r" in warnings[0]

    # runs check: lists it, exit 1.
    code, out, err = run_cli(["runs", "check", "--runs-dir", str(runs)], capsys)
    assert code == 1 and err == ""
    assert out.startswith(f"run r: {part}: ")

    # resume: the damaged group (only) runs again; every row exactly once.
    code, out, err = run_cli(["matrix", str(path), "--runs-dir", str(runs), "--resume", "r", "--executor", "local"], capsys)
    assert code == 0, err
    assert_one_line_each(err)
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and f"run r: {part}" in notes[0], err
    assert ("3 server groups already had results" if part.startswith("group")
            else "4 server groups already had results") in out
    assert_all_rows_once(run)
    assert run.manifest_problem() is None
    # Nothing stored is lost: the damaged files are kept aside.
    kept = [p for p in (run.root / "damaged").rglob("*") if p.is_file()]
    if case != "manifest-missing":
        assert kept and all(p.stat().st_size > 0 for p in kept)
    assert len(sorted((run.root / "logs").glob("*.log"))) == len(before)
    code, out, _ = run_cli(["runs", "check", "r", "--runs-dir", str(runs)], capsys)
    assert (code, out) == (0, "run r: sound (4 groups)\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["manifest-random-bytes", "manifest-list", "manifest-missing"])
def test_runs_repair_rebuilds_the_manifest(case: str, made: tuple[Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, runs, run = copy_run(made, tmp_path)
    original = json.loads((run.root / "manifest.json").read_text())
    DAMAGE[case](run)
    code, out, err = run_cli(["runs", "repair", "r", "--runs-dir", str(runs)], capsys)
    assert code == 0, err
    assert out.startswith(f"run r: manifest.json rebuilt from {path}, checked against 4 recorded manifests "
                          "and the rows of 4 cells")
    rebuilt = json.loads((run.root / "manifest.json").read_text())
    for key in ("run_id", "kind", "matrix", "matrix_digest", "matrix_path", "suite_digest", "suite_path", "commits",
                "cells", "groups", "created", "host", "schema_version"):
        assert rebuilt[key] == original[key], key
    assert rebuilt["repaired"]["matrix_path"] == str(path)
    code, out, err = run_cli(["report", "r", "--runs-dir", str(runs)], capsys)
    assert (code, err) == (0, "")
    code, out, _ = run_cli(["runs", "check", "r", "--runs-dir", str(runs)], capsys)
    assert (code, out) == (0, "run r: sound (4 groups)\n")


@pytest.mark.timeout(120)
def test_runs_repair_says_why_it_cannot(made: tuple[Path, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path, runs, run = copy_run(made, tmp_path)
    (run.root / "manifest.json").write_bytes(b"\0garbage")
    original = path.read_text()

    def repair(*extra: str) -> str:
        code, out, err = run_cli(["runs", "repair", "r", "--runs-dir", str(runs), *extra], capsys)
        assert code == 1 and out == ""
        assert err.count("\n") == 1 and err.startswith("error: cannot rebuild ") and "Traceback" not in err
        assert (run.root / "manifest.json").read_bytes() == b"\0garbage"  # left as it was
        return err

    # The matrix changed since the run: its digest differs from what the results recorded.
    path.write_text(original.replace("concurrency: 2", "concurrency: 3"))
    assert "made from another matrix" in repair()
    # Another matrix that does not make these cells.
    other = tmp_path / "other.yaml"
    other.write_text(original.replace("spec_method: [none, mtp]", "spec_method: [none]"))
    assert "made from another matrix" in repair("--matrix", str(other))
    # The matrix is gone.
    path.unlink()
    assert "is gone; pass --matrix FILE" in repair()
    path.write_text(original)
    # No result file left to say which matrix made the run.
    for p in (run.root / "cells").glob("*.parquet"):
        p.unlink()
    assert "no result file records the matrix" in repair()
    # Resume with another matrix refuses too, and changes nothing.
    code, _, err = run_cli(["matrix", str(other), "--runs-dir", str(runs), "--resume", "r", "--executor", "local"], capsys)
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1


def test_runs_check_on_a_folder_without_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["runs", "check", "--runs-dir", str(tmp_path)], capsys)
    assert (code, out) == (1, "") and err == f"error: no runs under {tmp_path}\n"
    code, out, err = run_cli(["runs", "check", "nope", "--runs-dir", str(tmp_path)], capsys)
    assert (code, out) == (1, "") and err == f"error: no run 'nope' under {tmp_path}\n"
