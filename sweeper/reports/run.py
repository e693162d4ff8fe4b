"""One stored run, as a library user reads it: its tables as pandas frames, a DuckDB connection over
them, its manifest and its explanation (reads results only; starts nothing).

`sweeper.open_run(...)` returns one; so do `sweeper.run_matrix`, `sweeper.bisect` and
`sweeper.triage` once their run is done.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow.compute as pc

from sweeper.errors import StoreError
from sweeper.judge.explain import Explanation
from sweeper.store import frames
from sweeper.store.location import Location
from sweeper.store.run_folder import RunDir, open_run


class Run:
    """A run folder (`runs/<run_id>/`) and what it holds. Every method reads the stored files again,
    so a run still being written is read as it stands."""

    def __init__(self, folder: RunDir) -> None:
        self.folder = folder

    @property
    def run_id(self) -> str:
        return self.folder.run_id

    @property
    def kind(self) -> str | None:
        """"matrix", "bisect" or "triage" (None: a folder without a readable manifest)."""
        return frames.run_kind(self.folder)

    def manifest(self) -> dict[str, Any]:
        """`manifest.json` as stored (its schema: runs/README.md)."""
        data = self.folder.read_json("manifest.json")
        if not isinstance(data, dict):
            raise StoreError(f"run {self.run_id}: manifest.json holds no object")
        return data

    def cells(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """One row per cell: status, failure rate and interval, effective configuration, fingerprint;
        each axis value in a column of its own."""
        return frames.load_cells(self.folder, columns)

    def samples(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None) -> pd.DataFrame:
        """One row per request sent: the cell's axis values, the answer's facts, each check's verdict
        (those `filter` keeps, e.g. `pc.field("cell_id") == cell_id`)."""
        return frames.load_samples(self.folder, columns, filter)

    def duckdb(self) -> Any:
        """A DuckDB connection with one view per table of this run (`samples`, `cells`, ...)."""
        return frames.duckdb_run(self.folder)

    def explain(self, **options: Any) -> Explanation:
        """Each failure mode's smallest conjunction of settings, read on what ran
        (`sweeper.judge.explain.explain`'s options)."""
        from sweeper.reports.tables import explain_run

        return explain_run(self.folder, **options)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, kind={self.kind!r})"


def open_stored(run_id: str | None = None, *, runs_dir: str | os.PathLike[str] | Location = "runs",
                kind: str | None = None) -> Run:
    """The run `run_id` under `runs_dir`, or the latest one (of `kind` when given)."""
    if run_id is None:
        return Run(frames.latest_run(runs_dir, kind))
    return Run(open_run(runs_dir, run_id, create=False))
