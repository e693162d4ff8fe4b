"""`sweep report`'s table on a run of many cells: the cells that fail most, in the usual order (failing
first, then by value), a caption saying how many are left out, and every cell with `--all`."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from sweeper.spec.matrix import canonical
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, table

CELLS = 250


def write_run(runs: Path) -> None:
    """One group of 250 cells (a `request.n` axis): cell i fails i % 50 of 50 samples (each sample row
    stands for its cell; the table reads the cells), cell 7 crashed before failing any."""
    run = RunDir(runs / "many")
    run.write_manifest(SweepManifest(run_id="many", matrix={"axes": {}}))
    cells, samples = [], []
    for i in range(CELLS):
        common = {"run_id": "many", "group_id": "g", "cell_id": f"c{i:03d}", "server_key": "g", "commit": "v1",
                  "spec_method": "none", "axes": [("commit", canonical("v1")), ("request.n", canonical(i))]}
        cells.append({**common, "status": "crashed" if i == 7 else "ok", "n_samples": 50,
                      "n_failed": 0 if i == 7 else i % 50})
        samples.append({**common, "case_id": "a", "repeat": 0, "passed": True})
    run.write_group("g", table(samples, SAMPLE_SCHEMA), table(cells, CELL_SCHEMA))


def shown(out: str) -> list[int]:
    """The `request.n` values of the table's rows, in order."""
    lines = out.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if "━" in line) + 1:]
    return [int(line.split("│")[0]) for line in body if "│" in line and line.split("│")[0].strip()]


def usual(values: list[int]) -> list[int]:
    """Failing cells first (all but those failing none of 50, i % 50 == 0; the crash fails), then by
    value: numbers by size."""
    return sorted(values, key=lambda i: (i % 50 == 0 and i != 7, i))


def test_the_worst_cells_in_order_and_every_cell_with_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path)
    code, out, err = run_cli(["report", "many", "--runs-dir", str(tmp_path)], capsys)
    assert (code, err) == (0, "")
    rows = shown(out)
    assert len(rows) == 200 and rows == usual(rows)
    # Left out: the 50 with the fewest failures (0–9 failed of 50, five of each), never the crash.
    assert set(range(CELLS)) - set(rows) == {i for i in range(CELLS) if i % 50 < 10 and i != 7} | {210}
    assert 7 in rows
    assert "the 200 of 250 cells that fail most" in " ".join(out.split())
    assert "`sweep report --all` shows every cell" in " ".join(out.split())

    code, out, err = run_cli(["report", "many", "--runs-dir", str(tmp_path), "--all"], capsys)
    assert (code, err) == (0, "")
    assert shown(out) == usual(list(range(CELLS))) and "fail most" not in out
