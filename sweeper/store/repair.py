"""Rebuild a run's lost or damaged manifest from what its results recorded.

A sweep's is made again from its matrix (the caller plans it: `fresh`), once the manifest copies in
the cells files' footers and the result rows themselves say they were made from it. A bisect's is
its recorded copy with the matrix read again. The damaged manifest is kept aside, never deleted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from sweeper.errors import StoreError, clip
from sweeper.spec.matrix import Matrix, canonical
from sweeper.store.location import Location
from sweeper.store.manifest import BisectManifest, Repair, SweepManifest
from sweeper.store.run_folder import MANIFEST, SAMPLE_SCHEMA, Damage, RunDir, check_parquet, now_utc


def rebuild_sweep(run: RunDir, fresh: SweepManifest, cell_ids: Collection[str]) -> str:
    """Write `run`'s lost or damaged manifest.json anew as `fresh` (what its matrix makes now, whose
    cells are `cell_ids`), once the results say they were made from it: the manifest each cells file
    recorded (matrix and suite digests, resolved commits), and the cells' own ids, suite digests and
    commit shas. Raises StoreError saying what disagrees."""
    from sweeper.store import frames as analysis

    where = run.manifest_file
    recorded = run.recorded_manifests()
    matrix_path = fresh.matrix_path
    shas: Mapping[str, str | None] = fresh.commits or {}
    why = []
    for rec in recorded:
        if not isinstance(rec, SweepManifest):
            why.append(f"the results are of a {clip(rec.kind)} run, not a sweep")
            continue
        if rec.matrix_digest not in (None, fresh.matrix_digest):
            why.append(f"the results were made from another matrix (digest {clip(rec.matrix_digest)}; "
                       f"{matrix_path} now has {fresh.matrix_digest}): pass the matrix as it was")
        if rec.suite_digest not in (None, fresh.suite_digest):
            why.append("the results were made with another suite (its digest differs)")
        if rec.commits is not None and rec.commits != shas:
            why.append(f"the results' commits {canonical(rec.commits)[:200]} differ from what the refs "
                       "resolve to now")
    # Every result row that reads: the cells of sound groups, the samples of every group (those
    # of a group cut short between its two writes too).
    columns = ["cell_id", "suite_digest", "commit", "commit_sha"]
    facts: list[dict[str, Any]] = analysis.load_table(run, "cells", columns).to_pylist()
    samples = [*run.files("samples"), *(run.samples_path(g).path for g in run.scan(probes=False,
                                                                                    manifest=False).partial)]
    readable = [f for f in samples if not check_parquet(Location(run.fs, f, f, run.local),
                                                        run.fs.get_file_info(f)).problem]
    if readable:
        rows = ds.dataset(readable, schema=SAMPLE_SCHEMA, filesystem=run.fs).to_table(columns=columns)
        facts += rows.group_by(columns).aggregate([]).to_pylist()
    known = set(cell_ids)
    for row in facts:
        if row["cell_id"] not in known:
            why.append(f"the results hold cell {clip(row['cell_id'])}, which {matrix_path} does not make")
        elif row["suite_digest"] not in (None, fresh.suite_digest):
            why.append(f"cell {clip(row['cell_id'])} was run with another suite (its digest differs)")
        elif row["commit_sha"] and shas.get(row["commit"]) not in (None, row["commit_sha"]):
            why.append(f"cell {clip(row['cell_id'])} ran commit {row['commit_sha'][:12]}, "
                       f"but {clip(row['commit'])} resolves to {str(shas.get(row['commit']))[:12]} now")
    if why:
        raise StoreError(f"cannot rebuild {where}: {why[0]}")
    first = recorded[0] if recorded else None
    n_cells = len({row["cell_id"] for row in facts})
    rebuilt = dataclasses.replace(
        fresh, run_id=run.run_id,
        created=first.created if first and first.created else fresh.created,
        host=first.host if first and first.host else fresh.host,
        sweeper=first.sweeper if first and first.sweeper else fresh.sweeper,
        repaired=Repair(now_utc().isoformat(), str(matrix_path),
                        f"{len(recorded)} recorded manifests, {n_cells} cells"))
    kept = _keep_damaged(run)
    run.write_manifest(rebuilt)
    return (f"run {run.run_id}: manifest.json rebuilt from {matrix_path}, checked against "
            f"{len(recorded)} recorded manifests and the rows of {n_cells} cells{kept}")


def rebuild_bisect(run: RunDir, recorded: BisectManifest, matrix_path: Path,
                   load_matrix: Callable[[Path], Matrix]) -> str:
    """A bisect's manifest: everything it recorded, with the matrix read again (by the caller's loader:
    the store asks no install kind)."""
    needed = ("good_sha", "bad_sha", "commits", "settings_keys", "cells", "suite_digest")
    missing = sorted(name for name in needed if getattr(recorded, name) is None)
    if missing:
        raise StoreError(f"cannot rebuild {run.manifest_file}: the results do not record {', '.join(missing)}")
    matrix = load_matrix(matrix_path)
    rebuilt = dataclasses.replace(recorded, matrix=matrix.raw, matrix_path=str(matrix.path),
                                  repaired=Repair(now_utc().isoformat(), str(matrix.path)))
    _keep_damaged(run)
    run.write_manifest(rebuilt)
    return f"run {run.run_id}: manifest.json rebuilt from the results and {matrix.path}"


def _keep_damaged(run: RunDir) -> str:
    """The damaged manifest moved aside; where it went, as the tail of a message."""
    if not run.manifest_file.exists():
        return ""
    moved = run.move_aside([Damage(run.run_id, MANIFEST, "damaged", (MANIFEST,))])
    return f"; the damaged one is kept as {moved[0].split(' -> ')[1]}" if moved else ""
