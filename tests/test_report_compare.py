"""`sweep report RUN_A --against RUN_B`: per-cell change with Newcombe's interval and a BH-corrected
flag, cells matched by their settings across commits; modes that appear or vanish listed first."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from sweeper.cli import app
from sweeper.reports.compare import newcombe
from sweeper.store import frames as analysis
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import RunDir, open_run

# The shared runs, made once per session (a plugin: fixtures imported per module would run per module).
pytest_plugins = ["reportruns"]


def test_newcombe_matches_the_published_intervals() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, table II, method 10.
    for (k1, n1, k2, n2), (low, high) in {(56, 70, 48, 80): (0.0524, 0.3339), (6, 7, 2, 7): (0.0582, 0.8062),
                                          (5, 56, 0, 29): (-0.0381, 0.1926)}.items():
        d, lo, hi = newcombe(k1, n1, k2, n2)
        assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)
        assert lo < d < hi


def split(run: RunDir, commit: str, runs_dir: Path, name: str) -> RunDir:
    """A run holding only one commit of `run` (the same Parquet rows, the same manifest otherwise)."""
    out = open_run(runs_dir, name, create=True)
    manifest = run.read_manifest()
    assert isinstance(manifest, SweepManifest) and manifest.commits is not None
    out.write_manifest(dataclasses.replace(manifest, commits={commit: manifest.commits[commit]}, run_id=name))
    samples, cells = analysis.load_table(run, "samples"), analysis.load_table(run, "cells")
    for group in sorted(set(pc.filter(cells, pc.equal(cells["commit"], commit))["group_id"].to_pylist())):
        out.write_group(group, pc.filter(samples, pc.equal(samples["group_id"], group)),
                        pc.filter(cells, pc.equal(cells["group_id"], group)))
    return out


def test_against_an_older_run(demo_run: RunDir, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    split(demo_run, "v0.28.0~3", runs, "before")
    split(demo_run, "main", runs, "after")
    result = CliRunner().invoke(app, ["report", "after", "--against", "before", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "run after against before (change = after − before)"
    # The same matrix on both sides: no fixed setting differs, and every cell has its partner.
    assert lines[1] == "  failure modes over the 12 matched cells only"
    # Appeared first, then vanished: the thinking budget and the silent whitespace came, the FSM bug went.
    assert lines[2:5] == [
        "  mode appeared in after: finish_reason + no_whitespace_tail: 0/972 (0.0%) → 72/972 (7.4%)",
        ("  mode appeared in after: content_nonempty + finish_reason + reasoning_tokens_at_most: 0/240 (0.0%) → "
        "40/240 (16.7%)"),
        ("  mode vanished in after: finish_reason + log_absent(Failed to advance FSM) + no_whitespace_tail: "
        "114/972 (11.7%) → 0/972 (0.0%)")]
    rows = [ln for ln in lines if ln.startswith("│")]
    assert len(rows) == 12  # the twelve settings (six servers x two temperatures), matched across the commits
    mtp_v2 = next(r for r in rows if "spec_method=mtp" in r and "VLLM_USE_V2_MODEL_RUNNER=1" in r
                  and "temperature=0 " in r)
    assert "27/101 (26.7%)" in mtp_v2 and "37/101 (36.6%)" in mtp_v2 and "+9.9 pp" in mtp_v2
    assert not any("worse" in r for r in rows)  # 27 → 37 of 101 is within chance after correction
    assert all("0/101 (0.0%)" in r and "+0.0 pp" in r for r in rows if "spec_method=mtp" not in r)


def test_a_significant_change_is_flagged(demo_run: RunDir, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    split(demo_run, "v0.27.0", runs, "old")
    split(demo_run, "main", runs, "new")
    result = CliRunner().invoke(app, ["report", "new", "--against", "old", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    rows = [ln for ln in result.output.splitlines() if ln.startswith("│")]
    flagged = [r for r in rows if "▲ worse" in r]
    assert len(flagged) == 4 and all("spec_method=mtp" in r for r in flagged)  # two temperatures each
    # Significant changes first.
    assert rows[:4] == sorted(flagged, key=lambda r: -float(r.split("pp")[0].split("│")[-1].strip().lstrip("+")))
    assert "+38.6 pp [" in flagged[0]


@pytest.mark.parametrize("args", [["--mode", "1"]])
def test_mode_needs_issue(demo_run: RunDir, args: list[str]) -> None:
    result = CliRunner().invoke(app, ["report", "demo", "--runs-dir", str(demo_run.root.parent), *args])
    assert result.exit_code != 0 and "--mode goes with --issue" in str(result.exception)


def test_flags_are_corrected_for_the_cells_compared() -> None:
    """12/50 vs 3/50 is p ≈ 0.02 on its own; among ten cells Benjamini–Hochberg does not flag it."""
    import pandas as pd

    from sweeper.reports.compare import compare

    def cells(rates: list[tuple[int, int]]) -> pd.DataFrame:
        return pd.DataFrame([{"cell_id": f"c{i}", "status": "ok", "n_failed": k, "n_samples": n,
                              "axes": [("commit", json.dumps("x")), ("request.seed", json.dumps(i))]}
                             for i, (k, n) in enumerate(rates)])
    after = cells([(12, 50)] + [(0, 50)] * 9)
    before = cells([(3, 50)] + [(0, 50)] * 9)
    one = compare(pd.DataFrame(), after.iloc[:1], pd.DataFrame(), before.iloc[:1])
    assert one.cells[0].p == pytest.approx(0.0225, abs=0.002) and one.cells[0].significant
    ten = compare(pd.DataFrame(), after, pd.DataFrame(), before)
    first = ten.cells[0]
    assert first.label == "seed=0" and first.p is not None and not first.significant
    assert first.q == pytest.approx(10 * first.p)
