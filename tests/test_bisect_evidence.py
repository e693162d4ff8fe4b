"""Stored rows as server starts, the one place a bisect reads them: the label sets of each start,
the starts that make a commit untestable, and one run read back from its Parquet files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sweeper.drivers.bisect_evidence import ServerStart, Target, run_starts, server_starts
from sweeper.install.matrix_loader import load_matrix
from sweeper.judge.modes import START_CASE
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, table

LABELS = {("json", "log_absent"): "log_absent(FSM)"}
FSM_TAIL = frozenset({"log_absent(FSM)", "no_whitespace_tail"})


def cell(key: str, sha: str, run: str, group: str, status: str, *, detail: str | None = None,
         signature: str | None = None) -> dict[str, Any]:
    return {"settings_key": key, "commit_sha": sha, "run_id": run, "group_id": group, "status": status,
            "status_detail": detail, "failure_signature": signature}


def sample(key: str, sha: str, run: str, group: str, case: str, failed: list[str]) -> dict[str, Any]:
    return {"settings_key": key, "commit_sha": sha, "run_id": run, "group_id": group, "case_id": case,
            "failed_checks": failed}


CELLS = [
    cell("k1", "s2", "r", "g2", "ok"),
    cell("k2", "s1", "other", "g9", "server_failed", detail=None),  # refused for no reason of the cell's
    cell("k1", "s1", "r", "g1", "crashed", signature="TypeError in vllm/x.py:f"),
    cell("k1", "s3", "r", "g3", "install_failed", detail="no wheel for s3"),
    cell("k1", "s4", "r", "g4", "server_failed", signature="refused: --bad-flag"),
]
SAMPLES = [
    sample("k1", "s2", "r", "g2", "json", ["log_absent", "no_whitespace_tail"]),
    sample("k1", "s1", "r", "g1", "json", []),
    sample("k1", "s2", "r", "g2", "json", []),
    # Without an answer every other check fails too: the crash is the symptom.
    sample("k1", "s1", "r", "g1", "json", ["http_ok", "json_schema", "no_whitespace_tail"]),
    sample("k1", "s5", "r", "g5", "json", ["json_schema"]),  # no cell row: no start
]


def test_rows_become_one_start_per_cell_row_in_a_fixed_order() -> None:
    starts = server_starts(CELLS, SAMPLES, LABELS)
    assert [(s.settings_key, s.commit_sha, s.group_id) for s in starts] == [
        ("k1", "s1", "g1"), ("k1", "s2", "g2"), ("k1", "s3", "g3"), ("k1", "s4", "g4"), ("k2", "s1", "g9")]
    crashed, ok, not_installed, refused, failed = starts
    assert crashed.sets == [("json", frozenset()), ("json", frozenset({"crash: TypeError in vllm/x.py:f"}))]
    assert ok.sets == [("json", FSM_TAIL), ("json", frozenset())]
    assert refused.sets == [(START_CASE, frozenset({"refused: --bad-flag"}))]
    # Starts that say nothing about the cell, and why.
    assert not not_installed.sets and not_installed.skip == "install_failed: no wheel for s3"
    assert not failed.sets and failed.skip == "server_failed: "
    assert server_starts(reversed(CELLS), reversed(SAMPLES), LABELS) == [
        ServerStart(s.settings_key, s.commit_sha, s.run_id, s.group_id, s.status, s.detail, s.sets[::-1])
        for s in starts]


def test_a_targets_evidence_is_its_starts_and_its_untestable_commits(tmp_path: Path, tiny_suite: Path) -> None:
    (tmp_path / "m.yaml").write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: x}}\n"
                                     "axes:\n  commit: [a]\n  spec_method: [mtp]\n  num_speculative_tokens: [2]\n")
    target = Target(load_matrix(tmp_path / "m.yaml").cells[0])
    assert target.settings == {"spec_method": "mtp", "num_speculative_tokens": 2}
    assert target.label == "spec_method=mtp num_speculative_tokens=2"
    # s1 again, started by this bisect: the other run's start is reused evidence.
    starts = server_starts([*CELLS, cell("k1", "s1", "this", "p0001-s1", "ok")],
                           [*SAMPLES, sample("k1", "s1", "this", "p0001-s1", "json", [])], LABELS)
    for start in starts:
        if start.settings_key == "k1":
            target.add(start, reused=start.run_id != "this")
    assert sorted(target.evidence) == ["s1", "s2", "s3", "s4"]
    assert [(st.key, st.reused) for st in target.evidence["s1"].starts] == [(("r", "g1"), True),
                                                                           (("this", "p0001-s1"), False)]
    assert target.evidence["s3"].starts == [] and target.evidence["s3"].skip == "install_failed: no wheel for s3"
    assert target.evidence["s4"].skip is None and len(target.evidence["s4"].starts) == 1


def test_one_runs_starts_read_back_from_its_parquet_files(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "sweep")
    run.write_manifest(SweepManifest(run_id="sweep"))
    for group in ("g1", "g2", "g3", "g4"):
        cells = [{**c, "run_id": "sweep"} for c in CELLS if c["group_id"] == group]
        rows = [{**r, "run_id": "sweep"} for r in SAMPLES if r["group_id"] == group]
        run.write_group(group, table(rows, SAMPLE_SCHEMA), table(cells, CELL_SCHEMA))
    starts = run_starts(run, {"k1"}, LABELS)
    assert starts == [ServerStart(s.settings_key, s.commit_sha, "sweep", s.group_id, s.status, s.detail, s.sets)
                      for s in server_starts(CELLS, SAMPLES, LABELS) if s.settings_key == "k1"]
    assert run_starts(run, {"k2"}, LABELS) == []
