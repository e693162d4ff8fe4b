"""A bisect's stored evidence is read through the runs folder's catalogue: the Parquet files it opens
do not grow with unrelated runs, runs the catalogue lacks are still found, and files moved aside
leave it. Real runs written through the store, read through a pyarrow filesystem that counts what
is opened."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from countingfs import Counting

from sweeper.bisect.select import select_cells
from sweeper.drivers.bisect_evidence import Target, load_evidence
from sweeper.install.matrix_loader import load_matrix
from sweeper.judge import modes as fm
from sweeper.spec.suite import Suite, load_suite
from sweeper.store import frames as analysis
from sweeper.store.catalogue import CATALOGUE
from sweeper.store.location import Location
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, Damage, RunDir, table

SHAS = [f"{i:040x}" for i in range(1, 5)]


def counted(runs: Path) -> tuple[Location, Counting]:
    """The runs folder seen through a counting filesystem (pyarrow's own readers, a filesystem URI's path)."""
    handler = Counting()
    return Location(pafs.PyFileSystem(handler), str(runs), str(runs), False), handler


@pytest.fixture
def bisected(tmp_path: Path, tiny_suite: Path) -> tuple[list[Target], Suite, Path]:
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {tmp_path / 'vllm'}}}\n"
                      "axes:\n  commit: [a, b]\n  spec_method: [none, mtp]\n  num_speculative_tokens: [2]\n")
    targets = [Target(c) for c in select_cells(load_matrix(matrix), [])]
    return targets, load_suite(tiny_suite), tmp_path / "runs"


def write_run(runs: Path, run_id: str, settings: list[str], shas: list[str], digest: str, fail_every: int = 3) -> None:
    """A run through the store: one group per (settings, commit), two samples per case."""
    run = RunDir(runs / run_id)
    run.write_manifest(SweepManifest(run_id=run_id))
    for s, key in enumerate(settings):
        for c, sha in enumerate(shas):
            group = f"g{s}-{c}"
            common = {"run_id": run_id, "group_id": group, "cell_id": f"{group}-cell", "server_key": group,
                      "settings_key": key, "commit": sha[-4:], "commit_sha": sha, "suite_digest": digest}
            samples = [{**common, "case_id": case, "repeat": r, "passed": (i + c) % fail_every != 0,
                        "failed_checks": [] if (i + c) % fail_every else ["json_schema"]}
                       for i, (case, r) in enumerate((case, r) for case in ("invoice", "event") for r in range(2))]
            n_failed = sum(not row["passed"] for row in samples)
            cells = [{**common, "status": "ok", "n_samples": len(samples), "n_failed": n_failed}]
            run.write_group(group, table(samples, SAMPLE_SCHEMA), table(cells, CELL_SCHEMA))


def evidence(runs: Location | Path, targets: list[Target], suite: Suite) -> dict[str, Any]:
    """`load_evidence` into fresh targets, as plain data."""
    fresh = [Target(t.cell) for t in targets]
    load_evidence(runs, fresh, suite, set(SHAS), fm.check_labels(suite), "this-bisect")
    return {t.settings_key: {sha: ([(st.key, sorted((c, sorted(labels)) for c, labels in st.sets), st.reused)
                                    for st in ev.starts], ev.skip) for sha, ev in sorted(t.evidence.items())}
            for t in fresh}


def files_of(runs: Path, *run_ids: str) -> set[str]:
    return {str(p) for r in run_ids for kind in ("samples", "cells") for p in (runs / r / kind).glob("*.parquet")}


def test_evidence_read_opens_the_same_files_with_fifty_unrelated_runs(
        bisected: tuple[list[Target], Suite, Path]) -> None:
    targets, suite, runs = bisected
    keys = [t.settings_key for t in targets]
    write_run(runs, "matching", keys, SHAS[:2], suite.digest)
    loc, fs = counted(runs)
    before = evidence(loc, targets, suite)
    assert {sha for per in before.values() for sha in per} == set(SHAS[:2])
    assert all(len(starts) == 1 and len(starts[0][1]) == 4 for per in before.values() for starts, _ in per.values())
    assert fs.parquet() == files_of(runs, "matching")

    for i in range(50):  # other settings, other commits: 200 Parquet files; and the same cells under another suite
        write_run(runs, f"other-{i:02d}", [f"elsewhere-{i}", keys[0]], [f"{i + 100:040x}"], suite.digest)
    write_run(runs, "another-suite", keys, SHAS[:2], "another suite")
    loc, fs = counted(runs)
    assert evidence(loc, targets, suite) == before
    assert fs.parquet() == files_of(runs, "matching")

    # The same folder read the way it was before the catalogue: every file of every run is opened.
    loc, fs = counted(runs)
    analysis.read_runs(loc, "samples", ["run_id"])
    assert len(fs.parquet()) > 100


def test_runs_the_catalogue_lacks_are_found(bisected: tuple[list[Target], Suite, Path]) -> None:
    targets, suite, runs = bisected
    keys = [t.settings_key for t in targets]
    write_run(runs, "old", keys[:1], SHAS[:1], suite.digest)
    write_run(runs, "new", keys, SHAS[1:3], suite.digest)
    write_run(runs, "other", ["elsewhere"], SHAS, suite.digest)
    everything = evidence(runs, targets, suite)
    assert {(k, sha) for k, per in everything.items() for sha in per} == \
        {(keys[0], SHAS[0]), *((k, sha) for k in keys for sha in SHAS[1:3])}

    # A run written before catalogues existed; a catalogue that lacks a group (written, then the
    # driver killed before its catalogue was); an unrelated file copied in.
    (runs / "old" / CATALOGUE).unlink()
    path = runs / "new" / CATALOGUE
    stored = json.loads(path.read_text())
    stored["files"] = [f for f in stored["files"] if f["name"] != "g1-1"]
    path.write_text(json.dumps(stored))
    shutil.copy(runs / "other" / "samples" / "g0-0.parquet", runs / "new" / "samples" / "g9-9.parquet")
    loc, fs = counted(runs)
    assert evidence(loc, targets, suite) == everything
    unknown = {str(runs / "new" / k / "g1-1.parquet") for k in ("samples", "cells")}
    copied = str(runs / "new" / "samples" / "g9-9.parquet")
    assert fs.parquet() == files_of(runs, "old", "new")  # what matches, and what had to be indexed
    assert {(f["kind"], f["name"]) for f in json.loads((runs / "old" / CATALOGUE).read_text())["files"]} == \
        {("samples", "g0-0"), ("cells", "g0-0")}
    # Written back: the next read opens only what matches.
    loc, fs = counted(runs)
    assert evidence(loc, targets, suite) == everything
    assert fs.parquet() == files_of(runs, "old", "new") - {copied} and unknown <= fs.parquet()

    # A file replaced under its catalogue's feet (a run copied over another): indexed again.
    write_run(runs.parent / "elsewhere", "other", keys[:1], SHAS[3:], suite.digest)
    for kind in ("samples", "cells"):
        shutil.copy(runs.parent / "elsewhere" / "other" / kind / "g0-0.parquet", runs / "other" / kind / "g0-0.parquet")
    assert [st[0] for st in evidence(runs, targets, suite)[keys[0]][SHAS[3]][0]] == [("other", "g0-0")]

    # A damaged catalogue is rebuilt.
    (runs / "new" / CATALOGUE).write_text("{not json")
    assert evidence(runs, targets, suite)[keys[1]] == everything[keys[1]]


def test_files_moved_aside_leave_the_catalogue(bisected: tuple[list[Target], Suite, Path]) -> None:
    targets, suite, runs = bisected
    keys = [t.settings_key for t in targets]
    write_run(runs, "r", keys, SHAS[:2], suite.digest)
    samples = runs / "r" / "samples" / "g1-0.parquet"
    samples.write_bytes(samples.read_bytes()[:100])  # truncated: the group is damaged
    found = evidence(runs, targets, suite)
    assert set(found[keys[1]]) == {SHAS[1]} and set(found[keys[0]]) == set(SHAS[:2])

    run = RunDir(runs / "r")
    run.catalogue()  # held, as by a driver that resumes the run
    damage = run.scan().damage
    assert [d.group_id for d in damage] == ["g1-0"]
    run.move_aside(damage)
    listed = {(f["kind"], f["name"]) for f in json.loads((runs / "r" / CATALOGUE).read_text())["files"]}
    assert ("samples", "g1-0") not in listed and ("cells", "g1-0") not in listed and ("cells", "g1-1") in listed
    assert evidence(runs, targets, suite) == found

    # The group run again (a resume) is found again.
    write_run(runs, "again", keys[1:], SHAS[:1], suite.digest)
    assert set(evidence(runs, targets, suite)[keys[1]]) == set(SHAS[:2])
    run.move_aside([Damage("r", "group g0-0", "test", ("samples/g0-0.parquet", "cells/g0-0.parquet"), "g0-0")])
    assert os.path.exists(runs / "r" / CATALOGUE)
    assert set(evidence(runs, targets, suite)[keys[0]]) == {SHAS[1]}


def test_a_probe_table_is_catalogued(tmp_path: Path) -> None:
    from sweeper.store.run_folder import PROBE_SCHEMA

    run = RunDir(tmp_path / "runs" / "b")
    run.write_table("probes/p1.parquet", table([{"run_id": "b", "probe": 1, "settings_key": "s", "commit_sha": "x"}],
                                               PROBE_SCHEMA))
    files = json.loads((tmp_path / "runs" / "b" / CATALOGUE).read_text())["files"]
    assert [(f["kind"], f["name"], f["keys"]) for f in files] == [("probes", "p1", [["s", None, "x"]])]
