"""Read results back: pandas frames and DuckDB queries over `runs/`.

Every axis value is in the `axes` map column (JSON-encoded); the loaders add one column per axis
(`env.X`, `serve.--flag`, `request.field` included) so tables can pivot on any of them. Values are
decoded once per distinct value, not per row. Loaders take a projection (`columns`) and a filter,
pushed down to the Parquet reader; aggregates over many samples (`failure_counts`) run in DuckDB and
bring only the aggregate into pandas.

`runs/` is a folder or a pyarrow filesystem URI (`s3://bucket/runs`); only files that check out
(`RunDir.scan`) are read: a damaged group is left out, and `sweep report` says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from sweeper.errors import StoreError, SweepError, one_line
from sweeper.spec.matrix import canonical
from sweeper.store.catalogue import Wanted
from sweeper.store.location import Location
from sweeper.store.run_folder import CELL_SCHEMA, KINDS, MANIFEST, PROBE_SCHEMA, SAMPLE_SCHEMA, RunDir

_TABLES = {"samples": SAMPLE_SCHEMA, "cells": CELL_SCHEMA, "probes": PROBE_SCHEMA}


def run_dirs(runs_dir: str | os.PathLike[str] | Location, kind: str | None = None) -> list[RunDir]:
    """The runs under `runs_dir` (a folder or a filesystem URI), oldest first by creation time (the
    manifest's `created`: a bisect resumed or a manifest rewritten does not make a run newer):
    folders with a manifest, or with results whose manifest is lost. `kind` ("matrix", "bisect"):
    only runs whose manifest says so."""
    base = Location.parse(runs_dir)
    found = []
    for entry in base.listing():
        if entry.type != pafs.FileType.Directory or entry.base_name.startswith("."):
            continue
        run = RunDir(base.join(entry.base_name))
        inside = {i.base_name for i in run.location.listing()}
        if MANIFEST not in inside and "cells" not in inside and "samples" not in inside:
            continue
        if kind is not None and run_kind(run) != kind:
            continue
        when = run.created()
        found.append((when.timestamp() if when else 0.0, run))
    return [run for _, run in sorted(found, key=lambda f: (f[0], f[1].run_id))]


def run_kind(run: RunDir) -> str | None:
    """"matrix" or "bisect" as the run's manifest says; None when it does not read."""
    try:
        return run.read_manifest().kind
    except SweepError:
        return None


def latest_run(runs_dir: str | os.PathLike[str] | Location, kind: str | None = None) -> RunDir:
    """The run created last (of `kind` when given)."""
    runs = run_dirs(runs_dir, kind)
    if not runs:
        what = {"matrix": "sweep runs", "bisect": "bisect runs"}.get(kind or "", "runs")
        raise StoreError(f"no {what} under {Location.parse(runs_dir)}")
    return runs[-1]


def _files(run: RunDir, kind: str) -> list[str]:
    return run.files(kind)


def load_table(run: RunDir, kind: str, columns: Sequence[str] | None = None,
               filter: pc.Expression | None = None) -> pa.Table:
    """One run's `samples`, `cells` or `probes` as Arrow; only `columns` (default all) of the rows
    that pass `filter` (a pyarrow expression, e.g. `pc.field("cell_id") == "x"`) are read."""
    schema = _TABLES[kind]
    if columns is not None:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise SweepError(f"no column {unknown[0]!r} in {kind}; columns: {', '.join(schema.names)}")
    files = _files(run, kind)
    if not files:
        empty = schema.empty_table()
        return empty.select(list(columns)) if columns is not None else empty
    # The declared schema, not inference: a column missing from one file must not vanish.
    return _read_files(files, run.fs, kind, columns, filter, where=f"run {run.run_id}")


def _read_files(files: Sequence[str], fs: pafs.FileSystem, kind: str, columns: Sequence[str] | None,
                filter: pc.Expression | None, *, where: str) -> pa.Table:
    try:
        # The paths as they are: no discovery (a stat of each file), the declared schema for all.
        dataset = ds.FileSystemDataset.from_paths(list(files), schema=_TABLES[kind], format=ds.ParquetFileFormat(),
                                                  filesystem=fs)
        return dataset.to_table(columns=list(columns) if columns is not None else None, filter=filter)
    except (OSError, pa.ArrowException) as exc:
        # The footers checked out, but a page did not: damage deeper than the footer.
        raise StoreError(f"{where}: {kind} files are unreadable ({one_line(str(exc))[:200]}); "
                         "`sweep runs check` lists the damage") from None


def read_runs(runs_dir: str | os.PathLike[str] | Location, kind: str, columns: Sequence[str],
              filter: pc.Expression | None = None) -> pa.Table:
    """`columns` of the rows passing `filter` over the sound files of every run under `runs_dir`."""
    runs = run_dirs(runs_dir)
    files = [f for run in runs for f in run.files(kind)]
    if not files:
        return _TABLES[kind].empty_table().select(list(columns))
    return _read_files(files, runs[0].fs, kind, columns, filter, where=str(Location.parse(runs_dir)))


def read_matching(runs_dir: str | os.PathLike[str] | Location, wanted: Wanted, columns: Mapping[str, Sequence[str]],
                  filter: pc.Expression | None = None) -> dict[str, pa.Table]:
    """Per kind in `columns` (samples, cells, probes): those columns of the rows passing `filter`, read
    only from the files whose catalogue entries hold a `wanted` experiment (`sweeper.store.catalogue`), in
    every run under `runs_dir`. Runs that hold none cost a listing, not a file read. A group is read
    only when both its files check out, as everywhere else."""
    runs = run_dirs(runs_dir)
    found: dict[str, list[str]] = {kind: [] for kind in columns}
    for run in runs:
        names = run.matching(wanted, columns)
        groups = {n for kind in columns if kind != "probes" for n in names[kind]}
        scan = run.scan(groups=bool(groups), probes=bool(names.get("probes")), manifest=False,
                        only=groups | set(names.get("probes", ())))
        for kind in columns:
            if kind == "probes":
                found[kind] += sorted(scan.probes)
            else:
                found[kind] += [paths[KINDS.index(kind)] for _, paths in sorted(scan.groups.items())]
    out = {}
    for kind, cols in columns.items():
        files = found[kind]
        out[kind] = (_read_files(files, runs[0].fs, kind, cols, filter, where=str(Location.parse(runs_dir))) if files
                     else _TABLES[kind].empty_table().select(list(cols)))
    return out


def _decode(value: str) -> Any:
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value


def _decoded(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """JSON-encoded strings (nulls allowed) as an object array, each distinct value decoded once."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    encoded = values.dictionary_encode()
    table = np.empty(len(encoded.dictionary) + 1, dtype=object)  # the last slot (None) is for nulls
    for i, raw in enumerate(encoded.dictionary.to_pylist()):
        table[i] = _decode(raw)  # one by one: a slice assignment would make [0, 0.5] floats
    indices = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy(zero_copy_only=False)
    picked: np.ndarray = table[indices]
    return picked


def axis_names(tbl: pa.Table) -> list[str]:
    """The axes named in a table's `axes` map column, in first-seen order."""
    if "axes" not in tbl.column_names or tbl.num_rows == 0:
        return []
    keys = [chunk.keys for chunk in tbl.column("axes").chunks if len(chunk)]
    if not keys:
        return []
    return [k for k in pa.chunked_array(keys).unique().to_pylist() if k is not None]


def with_axes(df: pd.DataFrame) -> pd.DataFrame:
    """Add one column per axis from the `axes` map (values decoded from JSON, once per distinct value)."""
    if "axes" not in df.columns or df.empty:
        return df
    maps = [dict(m) if m is not None else {} for m in df["axes"]]
    names = [n for n in dict.fromkeys(k for m in maps for k in m) if n not in df.columns]
    cache: dict[str, Any] = {}

    def decode(raw: str) -> Any:
        if raw not in cache:
            cache[raw] = _decode(raw)
        return cache[raw]

    new = {name: [decode(m[name]) if name in m else None for m in maps] for name in names}
    return pd.concat([df, pd.DataFrame(new, index=df.index)], axis=1) if new else df


def _axis_series(values: pa.ChunkedArray) -> pd.Series:
    """An axis column as pandas would infer it from its decoded values (0 and 0.5 make a float
    column, "0"/"1" a string one), inferred from the distinct values and then taken per row."""
    values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    encoded = values.dictionary_encode()
    distinct = [_decode(v) for v in encoded.dictionary.to_pylist()]
    if encoded.indices.null_count:
        distinct.append(None)
    small = pd.Series(distinct) if distinct else pd.Series([], dtype=object)
    indices = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy(zero_copy_only=False)
    return small.take(indices).reset_index(drop=True)


def _frame(tbl: pa.Table, *, consume: bool = True) -> pd.DataFrame:
    """`tbl` as pandas with one column per axis. `consume`: the table is the loader's own and is freed
    as it is converted (no second copy of the samples in memory); it must not be used after."""
    names = axis_names(tbl) if "axes" in tbl.column_names else []
    new = {}
    for name in names:
        if name not in tbl.column_names:
            looked = [pc.map_lookup(c, pa.scalar(name, pa.string()), "first") for c in tbl.column("axes").chunks]
            new[name] = _axis_series(pa.chunked_array(looked, type=pa.string()))
    df = tbl.to_pandas(self_destruct=consume, split_blocks=True)
    for series in new.values():
        series.index = df.index
    return pd.concat([df, pd.DataFrame(new)], axis=1) if new else df


def load_samples(run: RunDir, columns: Sequence[str] | None = None,
                 filter: pc.Expression | None = None) -> pd.DataFrame:
    """Samples as pandas, one column per axis added (when `axes` is read). For one cell:
    `load_samples(run, filter=pc.field("cell_id") == cell_id)`; for everything, `failure_counts`."""
    return _frame(load_table(run, "samples", columns, filter))


def load_cells(run: RunDir, columns: Sequence[str] | None = None,
               filter: pc.Expression | None = None) -> pd.DataFrame:
    return _frame(load_table(run, "cells", columns, filter))


def frame(tbl: pa.Table) -> pd.DataFrame:
    """A samples or cells table (`load_table`) as `load_samples` and `load_cells` give it: one column
    per axis added. The table stays usable."""
    return _frame(tbl, consume=False)


def server_starts(cells: pd.DataFrame) -> int:
    """The servers started for these cell rows. A group's cells share its server, and each of its
    rows carries the group's count: counted once per group, never summed over cells."""
    if cells.empty:
        return 0
    return int(cells.groupby(["run_id", "group_id"])["server_starts"].max().sum())


def duckdb_connect(runs_dir: str | os.PathLike[str] | Location) -> Any:
    """A DuckDB connection with `samples`, `cells` and `probes` views over every run under `runs_dir`
    (the sound files only)."""
    import duckdb

    con = duckdb.connect()
    runs = run_dirs(runs_dir)
    for kind in _TABLES:
        files = [f for run in runs for f in run.files(kind)]
        if files and runs[0].local:
            listed = ", ".join(_sql_str(f) for f in files)
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM read_parquet([{listed}], union_by_name=true)")
        elif files:
            _register(con, kind, files, runs[0].fs)
    return con


def _register(con: Any, kind: str, files: Sequence[str], fs: pafs.FileSystem) -> None:
    """A view over files on a remote filesystem, read by pyarrow (DuckDB pushes projections and
    filters down to it)."""
    con.register(kind, ds.dataset(list(files), schema=_TABLES[kind], format="parquet", filesystem=fs))


def duckdb_run(run: RunDir, kinds: Sequence[str] = tuple(_TABLES)) -> Any:
    """A DuckDB connection with `samples`, `cells` and `probes` views (or just `kinds`) over one
    run's files; a view is missing where the run has no such file. One run is written with one
    schema, so the files are not unified by name (that reads every footer before any query)."""
    import duckdb

    con = duckdb.connect()
    for kind in kinds:
        files = _files(run, kind)
        if files and run.local:
            listed = ", ".join(_sql_str(f) for f in files)
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM read_parquet([{listed}])")
        elif files:
            _register(con, kind, files, run.fs)
    return con


# Sample columns a table can group by directly (scalars); any other name is an axis in the map.
_SCALAR_COLUMNS = frozenset(f.name for f in SAMPLE_SCHEMA if not pa.types.is_nested(f.type))


def axis_sql(name: str) -> str:
    """The SQL for an axis' value in a samples view: its own column for the core axes (and any
    scalar column, `case_id` say), else the JSON text in the `axes` map (decode after aggregating:
    `failure_counts` does)."""
    if name in _SCALAR_COLUMNS:
        return _sql_ident(name)
    return f"element_at(axes, {_sql_str(name)})[1]"


# Columns a sample shares with its cell's row (the runner writes both from the same cell): with the
# `axes` map, what is constant within a cell. (Not vllm_version: a cell row may fill it from the
# environment's fingerprint.)
_CELL_COLUMNS = frozenset({"run_id", "group_id", "cell_id", "server_key", "settings_key", "commit", "commit_sha",
                           "spec_method", "num_speculative_tokens", "async_scheduling", "attention_backend",
                           "suite", "suite_digest"})


def failure_counts(run: RunDir, by: Sequence[str], *, where: Mapping[str, Any] | None = None,
                   cells: pa.Table | None = None) -> pd.DataFrame:
    """Samples and failures per combination of the `by` axes, aggregated in DuckDB: columns `by`
    (values as `load_samples` gives them), `n` and `n_failed`. Memory is that of the result, not of
    the samples. `where`: axis -> value equality filters.

    Axes are constant within a cell, so DuckDB counts per cell (and per sample column asked for,
    `case_id` say), reading two or three columns; each cell's axis values come from the small
    cells table. Reading every sample's `axes` map instead costs about ten times as much.
    `cells`: the run's cells table when the caller has read it already (`load_table`), so that it is
    not read again (read anyway when it lacks a column needed here)."""
    names = list(dict.fromkeys(by))
    where = dict(where or {})
    if not _files(run, "samples"):
        return pd.DataFrame({**{n: [] for n in names}, "n": [], "n_failed": []})
    cell_names = [n for n in dict.fromkeys([*names, *where]) if n in _CELL_COLUMNS or n not in _SCALAR_COLUMNS]
    wanted = ["cell_id", *(n for n in cell_names if n in _CELL_COLUMNS and n != "cell_id"), "axes"]
    if cells is None or not set(wanted) <= set(cells.column_names):
        cells = load_table(run, "cells", wanted)
    cells = cells.select(wanted)
    axes = axis_names(cells)
    for name in [*names, *where]:
        if name not in _SCALAR_COLUMNS and name not in axes:
            raise SweepError(f"no axis {name!r} in these results; axes: {', '.join(axes) or 'none'}")
    ids = cells.column("cell_id")
    if len(ids.unique()) != len(ids):  # a cell written twice: per-cell keys would count it twice
        return _counts_per_sample(run, names, where)
    # The cells' axis values as stored (map values as their JSON text, so that any value groups).
    keyed = {"cell_id": ids.to_pylist()}
    for name in cell_names:
        if name in _SCALAR_COLUMNS:
            keyed[name] = cells.column(name).to_pylist()
        else:
            looked = [pc.map_lookup(c, pa.scalar(name, pa.string()), "first") for c in cells.column("axes").chunks]
            keyed[name] = pa.chunked_array(looked, type=pa.string()).to_pylist()
    per_cell = pd.DataFrame(keyed)
    for name, value in where.items():
        if name in cell_names:
            want = value if name in _SCALAR_COLUMNS or value is None else canonical(value)
            per_cell = per_cell[per_cell[name].isna() if want is None else per_cell[name].eq(want)]
    sample_names = [n for n in names if n not in cell_names]
    counts = _duckdb_counts(run, ["cell_id", *sample_names], {k: v for k, v in where.items() if k not in cell_names})
    missing = set(counts["cell_id"]) - set(ids.to_pylist())
    if missing:  # samples of a cell without a cell row: count them the slow way, from their own axes
        return _counts_per_sample(run, names, where)
    merged = counts.merge(per_cell, on="cell_id", how="inner", suffixes=("", "_cell"))
    if names:
        merged = merged.groupby(names, dropna=False, sort=False)[["n", "n_failed"]].sum().reset_index()
    else:
        merged = pd.DataFrame({"n": [int(merged["n"].sum())], "n_failed": [int(merged["n_failed"].sum())]})
    return _finish(merged, names, [n for n in cell_names if n not in _SCALAR_COLUMNS])


def _counts_per_sample(run: RunDir, names: list[str], where: Mapping[str, Any]) -> pd.DataFrame:
    """`failure_counts` reading every sample's own axis values (for runs the per-cell path cannot use)."""
    counts = _duckdb_counts(run, names, where)
    return _finish(counts, names, [n for n in names if n not in _SCALAR_COLUMNS])


def _duckdb_counts(run: RunDir, names: Sequence[str], where: Mapping[str, Any]) -> pd.DataFrame:
    """count(*) and failures per combination of `names` (map axes as their JSON text)."""
    keys = [f"{axis_sql(n)} AS k{i}" for i, n in enumerate(names)]
    conds, params = [], []
    for name, value in where.items():
        conds.append(f"{axis_sql(name)} IS NOT DISTINCT FROM ?")
        # Map values are stored as the runner wrote them: canonical JSON.
        params.append(value if name in _SCALAR_COLUMNS or value is None else canonical(value))
    sql = (f"SELECT {', '.join([*keys, 'count(*) AS n', 'count(*) FILTER (WHERE NOT passed) AS n_failed'])} "
           f"FROM samples {'WHERE ' + ' AND '.join(conds) if conds else ''} {'GROUP BY ALL' if names else ''}")
    import duckdb

    try:
        con = duckdb_run(run, ["samples"])
        try:
            rel = con.sql(sql, params=params)
            # DuckDB 2 names it to_arrow_table; 1.x arrow.
            result = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
        finally:
            con.close()
    except (duckdb.IOException, duckdb.InvalidInputException, OSError, pa.ArrowException) as exc:
        # The footers checked out, but a page did not: damage deeper than the footer.
        raise StoreError(f"run {run.run_id}: samples files are unreadable ({one_line(str(exc))[:200]}); "
                         "`sweep runs check` lists the damage") from None
    columns: dict[str, Any] = {name: result.column(f"k{i}").to_pandas() for i, name in enumerate(names)}
    columns["n"] = result.column("n").to_numpy()
    columns["n_failed"] = result.column("n_failed").to_numpy()
    return pd.DataFrame(columns)


def _finish(counts: pd.DataFrame, names: Sequence[str], json_names: Sequence[str]) -> pd.DataFrame:
    """Map axes decoded from their JSON text (once per distinct value); columns `names`, n, n_failed."""
    out = {}
    for name in names:
        column = counts[name]
        if name in json_names:
            texts = [v if isinstance(v, str) else None for v in column.tolist()]
            out[name] = _decoded(pa.array(texts, pa.string())).tolist()
        else:
            out[name] = column
    out["n"] = counts["n"].to_numpy()
    out["n_failed"] = counts["n_failed"].to_numpy()
    return pd.DataFrame(out)


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sql_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
