"""Read results back: pandas frames and DuckDB queries over `runs/`.

Every axis value is in the `axes` map column (JSON-encoded); the loaders add one column per axis
(`env.X`, `serve.--flag`, `request.field` included) so tables can pivot on any of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from sweeper.errors import StoreError
from sweeper.store import CELL_SCHEMA, PROBE_SCHEMA, SAMPLE_SCHEMA, RunDir

_TABLES = {"samples": SAMPLE_SCHEMA, "cells": CELL_SCHEMA, "probes": PROBE_SCHEMA}


def run_dirs(runs_dir: Path) -> list[RunDir]:
    if not Path(runs_dir).is_dir():
        return []
    return sorted((RunDir(p) for p in Path(runs_dir).iterdir() if (p / "manifest.json").exists()),
                  key=lambda r: r.manifest_path.stat().st_mtime)


def latest_run(runs_dir: Path) -> RunDir:
    runs = run_dirs(runs_dir)
    if not runs:
        raise StoreError(f"no runs under {runs_dir}")
    return runs[-1]


def _files(run: RunDir, kind: str) -> list[str]:
    return sorted(str(p) for p in (run.root / kind).glob("*.parquet"))


def load_table(run: RunDir, kind: str) -> pa.Table:
    schema = _TABLES[kind]
    files = _files(run, kind)
    if not files:
        return schema.empty_table()
    # The declared schema, not inference: a column missing from one file must not vanish.
    return ds.dataset(files, schema=schema, format="parquet").to_table()


def _decode(value: str) -> Any:
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value


def with_axes(df: pd.DataFrame) -> pd.DataFrame:
    """Add one column per axis from the `axes` map (values decoded from JSON)."""
    if "axes" not in df.columns or df.empty:
        return df
    maps = [dict(m) if m is not None else {} for m in df["axes"]]
    names = list(dict.fromkeys(k for m in maps for k in m))
    df = df.copy()
    for name in names:
        if name in df.columns:
            continue
        df[name] = [_decode(m[name]) if name in m else None for m in maps]
    return df


def load_samples(run: RunDir) -> pd.DataFrame:
    return with_axes(load_table(run, "samples").to_pandas())


def load_cells(run: RunDir) -> pd.DataFrame:
    return with_axes(load_table(run, "cells").to_pandas())


def duckdb_connect(runs_dir: Path) -> Any:
    """A DuckDB connection with `samples`, `cells` and `probes` views over every run under `runs_dir`."""
    import duckdb

    con = duckdb.connect()
    for kind in _TABLES:
        pattern = str(Path(runs_dir) / "*" / kind / "*.parquet")
        if list(Path(runs_dir).glob(f"*/{kind}/*.parquet")):
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM read_parquet('{pattern}', union_by_name=true)")
    return con


def schema_of(kind: str) -> pa.Schema:
    """The declared schema of a run's `samples`, `cells` or `probes` files."""
    return _TABLES[kind]
