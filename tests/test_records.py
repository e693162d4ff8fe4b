"""Run manifests as typed records: both versions read, the store writes the same keys as before, and
a manifest that fits no version is damage, named in one line.

`data/manifests/v1-*.json` are manifests as the sweeper wrote them before the records (version 1:
no `manifest_version`), paths made neutral.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import SUITE, make_sim_repo, run_cli

from sweeper.errors import StoreError
from sweeper.reports import tables as report
from sweeper.store.manifest import (
    VERSION,
    BisectManifest,
    CostRecord,
    DesignRecord,
    Host,
    Repair,
    Retry,
    SweepManifest,
    from_json,
    to_json,
)
from sweeper.store.run_folder import (
    CELL_SCHEMA,
    SAMPLE_SCHEMA,
    SCHEMA_VERSION,
    DamagedManifest,
    RunDir,
    open_run,
    table,
)

DATA = Path(__file__).parent / "data" / "manifests"


def v1(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((DATA / f"v1-{name}.json").read_text())
    return data


def put(run: RunDir, data: object) -> None:
    run.root.mkdir(parents=True, exist_ok=True)
    run.manifest_path.write_text(json.dumps(data))


def test_a_version_1_sweep_manifest_reads(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    put(run, v1("sweep"))
    m = run.read_manifest()
    assert isinstance(m, SweepManifest) and m.kind == "matrix"
    assert m.run_id == "r" and m.suite == "tiny" and (m.cells, m.groups) == (3, 3)
    assert m.commits == {"main": "2573dac8fae13a9876adb7250397cd0cae1410ab",
                         "v0.27.0": "0a9470d658c8fef16281f822cb5c8da805cb5349",
                         "v0.28.0": "dbe5343a2777cf9ac3e239a1d560d687af5d1c46"}
    assert m.suite_path == ("/srv/sweep/tiny.yaml",) and m.host == Host("vm", "0.1.0")
    assert m.retried == (Retry("g-main-none", 1, "node died", "2026-12-01T22:47:04.306139+00:00"),)
    assert m.commit_order is None  # version 1 did not record it: readers keep the matrix's order
    assert report.commit_order(run) == ["main", "v0.27.0", "v0.28.0"]


def test_a_version_1_bisect_manifest_reads(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "b")
    put(run, v1("bisect"))
    m = run.read_manifest()
    assert isinstance(m, BisectManifest) and m.kind == "bisect"
    assert (m.good, m.bad, m.settings_keys) == ("v0.27.0", "main", ("s-mtp4-3f2a9c01",))
    assert m.commits is not None and len(m.commits) == 3 and m.commits[0] == m.good_sha
    assert m.cells == ({"async_scheduling": None, "attention_backend": None, "num_speculative_tokens": 4,
                        "spec_method": "mtp"},)
    assert m.repaired == Repair("2026-12-01T23:01:40.512003+00:00", "/srv/sweep/m.yaml")
    assert report.commit_order(run) == list(m.commits)


@pytest.mark.parametrize("name", ["sweep", "bisect"])
def test_the_store_writes_the_keys_version_1_had(name: str, tmp_path: Path) -> None:
    """Rewritten by this sweeper, a manifest keeps every key and value (an older sweeper still reads
    it) and gains its version; read back, it is the same record."""
    run = RunDir(tmp_path / name)
    put(run, v1(name))
    m = run.read_manifest()
    run.write_manifest(m)
    written = json.loads(run.manifest_path.read_text())
    old = v1(name)
    # Stamped with the schema version it is written under (one that reads the old run's files too).
    expected = {**old, "manifest_version": VERSION, "schema_version": SCHEMA_VERSION,
                **({"commit_order": None} if name == "sweep" else {})}
    assert written == expected
    assert run.read_manifest() == m
    assert from_json(to_json(m)) == m


def test_the_store_stamps_when_where_and_which_sweeper(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    run.write_manifest(SweepManifest(run_id="r"))
    m = run.read_manifest()
    assert m.created and m.sweeper and m.host and m.host.hostname
    # A stamp already there is kept (a repaired manifest keeps when the run was made).
    run.write_manifest(dataclasses.replace(m, created="2020-01-01T00:00:00+00:00"))
    assert run.read_manifest().created == "2020-01-01T00:00:00+00:00"


def test_retries_are_recorded_by_the_store(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    run.write_manifest(SweepManifest(run_id="r"))
    run.record_retry("g1", 1, "node died")
    run.record_retry("g1", 2, "node died again")
    m = run.read_manifest()
    assert isinstance(m, SweepManifest)
    assert [(r.group_id, r.attempt, r.error) for r in m.retried] == [("g1", 1, "node died"), ("g1", 2, "node died again")]
    assert [r["attempt"] for r in json.loads(run.manifest_path.read_text())["retried"]] == [1, 2]


DAMAGE = {
    "commits-a-string": ({"commits": "main"}, "'commits' is a JSON string where an object of refs to shas belongs"),
    "cells-an-object": ({"cells": {"n": 3}}, "'cells' is a JSON object where a whole number belongs"),
    "unknown-kind": ({"kind": "triage"}, "'kind' is 'triage', expected one of matrix, bisect"),
    "unknown-key": ({"colour": "red"}, "unknown key 'colour' in a matrix manifest"),
    "no-run-id": ({"run_id": None}, "no 'run_id'"),
    "created-a-number": ({"created": 5}, "'created' is a JSON number where a string belongs"),
    "shas-numbers": ({"commits": {"main": 1}}, "'commits' is a JSON object where an object of refs to shas belongs"),
    "retry-without-group": ({"retried": [{"attempt": 1, "error": "x", "at": "t"}]}, "'retried' has no 'group_id'"),
    "host-a-list": ({"host": ["vm"]}, "'host' is a JSON array where an object belongs"),
    "version-a-string": ({"manifest_version": "2"}, "'manifest_version' is '2', expected a whole number from 1"),
    "design-strength-a-string": ({"design": {"kind": "covering", "strength": "3", "seed": 0, "servers": 2,
                                            "cells": 2, "digest": "d"}},
                                 "'design.strength' is a JSON string where a whole number belongs"),
    "design-without-digest": ({"design": {"kind": "covering", "strength": 3, "seed": 0, "servers": 2, "cells": 2}},
                              "'design' has no 'digest'"),
    "cost-a-string": ({"cost": {"install_s": "90", "start_s": 1, "request_s": 1, "source": "x"}},
                      "'cost.install_s' is a JSON string where a number belongs"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_manifest_that_fits_no_version_is_damage(case: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    change, why = DAMAGE[case]
    runs = tmp_path / "runs"
    run = RunDir(runs / "r")
    put(run, {**v1("sweep"), **change})
    with pytest.raises(DamagedManifest) as caught:
        run.read_manifest()
    assert str(caught.value) == (f"{run.manifest_path}: damaged manifest, {why}; "
                                 "`sweep runs repair r` rebuilds it")
    assert run.manifest_problem() == str(caught.value)
    assert run.manifest_or_none() is None
    code, out, _ = run_cli(["runs", "check", "r", "--runs-dir", str(runs)], capsys)
    assert (code, out) == (1, f"run r: manifest.json: {caught.value}\n")


def test_a_manifest_from_a_newer_sweeper_is_refused_not_damaged(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    run = RunDir(runs / "r")
    put(run, {**v1("sweep"), "manifest_version": VERSION + 1, "novelty": 1})
    with pytest.raises(StoreError) as caught:
        run.read_manifest()
    assert not isinstance(caught.value, DamagedManifest)
    assert str(caught.value) == (f"{run.manifest_path}: manifest version {VERSION + 1}, this sweep reads up to "
                                 f"{VERSION}; use the sweeper version that wrote it")
    assert run.manifest_problem() is None
    code, out, err = run_cli(["report", "r", "--runs-dir", str(runs)], capsys)
    assert (code, out, err) == (1, "", f"error: {caught.value}\n")


def test_the_cells_files_record_the_manifest_but_the_matrix(tmp_path: Path) -> None:
    run = open_run(tmp_path, "r", create=True)
    big = {f"ref{i}": "f" * 40 for i in range(2000)}  # over the footer's limit on one value
    run.write_manifest(SweepManifest(run_id="r", matrix={"axes": {"commit": ["a"]}}, matrix_digest="d",
                                     commits=big, suite_digest="s"))
    row = {"run_id": "r", "group_id": "g", "cell_id": "c", "server_key": "g", "commit": "a", "case_id": "x",
           "repeat": 0, "passed": True}
    run.write_group("g", table([row], SAMPLE_SCHEMA), table([{k: v for k, v in row.items() if k not in
                                                              ("case_id", "repeat", "passed")}], CELL_SCHEMA))
    [recorded] = run.recorded_manifests()
    assert isinstance(recorded, SweepManifest)
    assert (recorded.run_id, recorded.matrix_digest, recorded.suite_digest) == ("r", "d", "s")
    assert recorded.matrix == {} and recorded.commits is None  # not kept: the matrix, and a value too large


def test_a_sweep_records_its_commits_in_history_order(tmp_path: Path) -> None:
    """The plan learns the refs' order from the repository, so a reader needs no git."""
    from sweeper.drivers.sweep import make_plan
    from sweeper.store.plan_records import sweep_manifest

    (tmp_path / "tiny.yaml").write_text(SUITE)
    make_sim_repo(tmp_path / "vllm", [("v0.27.0", {}), ("v0.28.0", {}), ("main", {})])
    path = tmp_path / "m.yaml"
    path.write_text(f"name: t\nmodel: m\nsuite: {tmp_path / 'tiny.yaml'}\n"
                    f"install: {{kind: sim, repo: {tmp_path / 'vllm'}}}\n"
                    "axes:\n  commit: [main, v0.27.0, v0.28.0]\n  spec_method: [none]\n")
    plan = make_plan(path, tmp_path / "runs")
    assert plan.commit_order == ("v0.27.0", "v0.28.0", "main")
    run = open_run(tmp_path / "runs", "r", create=True)
    run.write_manifest(sweep_manifest(plan, "r"))
    (tmp_path / "vllm").rename(tmp_path / "gone")  # the repository need not be there when reading
    assert report.commit_order(run, ["v0.29.0"]) == ["v0.27.0", "v0.28.0", "main", "v0.29.0"]


def test_a_sweep_records_its_design_and_cost_profile(tmp_path: Path) -> None:
    """Version 3 adds both, as objects; a manifest without them (every older one) ran the full
    product and writes neither key."""
    design = DesignRecord(kind="covering", strength=3, seed=7, servers=26, cells=26, digest="0123456789abcdef")
    cost = CostRecord(install_s=90.0, start_s=240.0, request_s=2.0, source="wheels defaults")
    m = SweepManifest(run_id="r", design=design, cost=cost)
    data = to_json(m)
    assert data["design"] == {"kind": "covering", "strength": 3, "seed": 7, "servers": 26, "cells": 26,
                              "digest": "0123456789abcdef"}
    assert data["cost"] == {"install_s": 90.0, "start_s": 240.0, "request_s": 2.0, "source": "wheels defaults"}
    assert from_json(json.loads(json.dumps(data))) == m
    assert from_json({**data, "cost": {**data["cost"], "start_s": 240}}).cost == cost  # a whole number reads
    old = from_json(v1("sweep"))
    assert old.design is None and old.cost is None  # type: ignore[union-attr]
    assert "design" not in to_json(old) and "cost" not in to_json(old)
