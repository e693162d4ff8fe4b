"""`sweep runs list`, `sweep runs check` and `sweep runs repair`: the runs stored, which are
damaged, and a lost manifest rebuilt.

A run's listing (`RunSummary`) is its kind, creation time, matrix, cells, failing cells and status:
`done`; `unfinished` (groups without results, or a bisect without its final verdict); `damaged`
(what `sweep runs check` lists); `other version` (written by a sweeper of another schema version).

A run's damage is what `RunDir.scan` finds: a manifest that is lost, not JSON or not an object; a
group whose cells or samples file does not read, is of another schema version, or holds other than
the rows (and bytes) recorded when it was written; a probes file that does not read. Damaged groups
are run again by `sweep matrix MATRIX --resume RUN` (their files moved aside first, never deleted);
a manifest is rebuilt (`sweeper.store.repair`) from the matrix file and what the results recorded.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.errors import StoreError, SweepError, clip
from sweeper.store.manifest import BisectManifest, SweepManifest
from sweeper.store.run_folder import RunDir, Scan, open_run


@dataclass
class RunHealth:
    run: RunDir
    scan: Scan

    def lines(self) -> list[str]:
        if not self.scan.damage:
            extra = f", {len(self.scan.partial)} unfinished" if self.scan.partial else ""
            return [f"run {self.run.run_id}: sound ({len(self.scan.groups)} groups{extra})"]
        return [str(d) for d in self.scan.damage]


@dataclass(frozen=True)
class RunSummary:
    """One line of `sweep runs list` (and one object of its `--json`)."""

    run_id: str
    kind: str | None  # "matrix", "bisect", "triage"; None when the manifest does not read
    created: str | None  # ISO 8601, UTC
    matrix: str | None  # the matrix's name
    cells: int  # cells with results
    failing: int  # of those, cells not `ok` or with a failed sample
    status: str  # "done", "unfinished", "damaged", "other version" (a sweeper of another schema wrote it)
    uri: str

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(run: RunDir) -> RunSummary:
    from sweeper.store import frames as analysis

    try:
        manifest = run.manifest_or_none()
    except StoreError:  # written by another sweeper version: listed, not read
        return RunSummary(run.run_id, None, None, None, 0, 0, "other version", run.uri)
    scan = run.scan()
    cells = analysis.load_table(run, "cells", ["status", "n_failed"]) if scan.groups else None
    n = cells.num_rows if cells is not None else 0
    failing = 0
    if cells is not None:
        statuses, failed = cells.column("status").to_pylist(), cells.column("n_failed").to_pylist()
        failing = sum(s != "ok" or bool(f) for s, f in zip(statuses, failed, strict=True))
    if scan.damage:
        status = "damaged"
    elif isinstance(manifest, BisectManifest):
        verdict = run.read_json("bisect.json")
        status = "done" if isinstance(verdict, dict) and verdict.get("final") else "unfinished"
    elif scan.partial or (isinstance(manifest, SweepManifest) and manifest.groups is not None
                          and len(scan.groups) < manifest.groups):
        status = "unfinished"
    else:
        status = "done"
    created = run.created()
    name = manifest.matrix.get("name") if manifest is not None else None
    if not name and manifest is not None and manifest.matrix_path:
        name = Path(manifest.matrix_path).stem
    return RunSummary(run.run_id, manifest.kind if manifest else None,
                      created.isoformat(timespec="seconds") if created else None,
                      str(name) if name else None, n, failing, status, run.uri)


def listing(runs_dir: str | os.PathLike[str]) -> list[RunSummary]:
    """Every run under `runs_dir`, oldest first (by creation time), then the triage runs (their
    phases are runs inside them), each one line whose failing count is the modes it reported."""
    from sweeper.store import frames as analysis

    # Triage runs after the others: their phases are listed inside them, not here.
    return [summarize(run) for run in analysis.run_dirs(runs_dir)] + triage_listing(runs_dir)


def triage_listing(runs_dir: str | os.PathLike[str]) -> list[RunSummary]:
    """The triage runs under `runs_dir`, by name."""
    from sweeper.store.location import Location
    from sweeper.store.triage_record import RECORD, from_json

    out: list[RunSummary] = []
    base = Location.parse(runs_dir)
    if not base.is_dir():
        return out
    for entry in sorted(base.listing(), key=lambda e: e.base_name):
        if entry.base_name.startswith("."):
            continue
        run = RunDir(base.join(entry.base_name))
        data = run.read_json(RECORD)
        if data is None:
            continue
        try:
            record = from_json(data, f"{run.uri}/{RECORD}")
        except StoreError:
            out.append(RunSummary(run.run_id, "triage", None, None, 0, 0, "damaged", run.uri))
            continue
        out.append(RunSummary(run.run_id, "triage", record.created, Path(record.matrix_path).stem, 0,
                              len(record.modes), "done" if record.final else "unfinished", run.uri))
    return out


def check(runs_dir: str | os.PathLike[str], run_id: str | None = None) -> list[RunHealth]:
    from sweeper.store import frames as analysis

    runs = [open_run(runs_dir, run_id, create=False)] if run_id else analysis.run_dirs(runs_dir)
    if not runs:
        raise StoreError(f"no runs under {runs_dir}")
    return [RunHealth(run, run.scan()) for run in runs]


def repair(runs_dir: str | os.PathLike[str], run_id: str, matrix: Path | None = None) -> list[str]:
    """Rebuild the run's manifest when it is lost or damaged; say what else needs doing."""
    run = open_run(runs_dir, run_id, create=False)
    out = []
    problem = run.manifest_problem()
    if problem:
        out.append(_rebuild(run, runs_dir, matrix))
    elif matrix is not None:
        out.append(f"run {run_id}: manifest.json is sound; nothing rebuilt")
    groups = [d for d in run.scan(manifest=False).damage]
    if groups:
        manifest = run.manifest_or_none()
        path = matrix or Path(manifest.matrix_path if manifest and manifest.matrix_path else "MATRIX")
        out += [f"{d}: `sweep matrix {path} --resume {run_id}` runs it again" for d in groups]
    if not out:
        out.append(f"run {run_id}: nothing to repair")
    return out


def _rebuild(run: RunDir, runs_dir: str | os.PathLike[str], matrix: Path | None) -> str:
    from sweeper.drivers.sweep import make_plan, rebuild_manifest
    from sweeper.store.plan_records import recorded_design

    recorded = run.recorded_manifests()
    where = run.manifest_file
    if matrix is None:
        paths = {r.matrix_path for r in recorded if r.matrix_path}
        if not paths:
            raise StoreError(f"cannot rebuild {where}: no result file records the matrix that made the run "
                             "(it wrote no group, or was written by an older sweep); pass --matrix FILE")
        if len(paths) > 1:
            raise StoreError(f"cannot rebuild {where}: the results name {len(paths)} matrices; pass --matrix FILE")
        matrix = Path(paths.pop())
        if not matrix.is_file():
            raise StoreError(f"cannot rebuild {where}: the matrix that made the run, {clip(str(matrix), 200)}, "
                             "is gone; pass --matrix FILE with that matrix")
    bisects = [r for r in recorded if isinstance(r, BisectManifest)]
    if bisects and len(bisects) == len(recorded):
        from sweeper.install.matrix_loader import load_matrix
        from sweeper.store.repair import rebuild_bisect

        return rebuild_bisect(run, bisects[0], matrix, load_matrix)
    sweeps = [r for r in recorded if isinstance(r, SweepManifest)]
    try:
        plan = make_plan(matrix, os.fspath(runs_dir), design_spec=recorded_design(sweeps[0]) if sweeps else None)
    except SweepError as exc:
        raise StoreError(f"cannot rebuild {where}: {exc}") from None
    return rebuild_manifest(plan, run)
