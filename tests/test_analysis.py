"""Reading results back: pandas loaders with projection and filters, DuckDB aggregates, on real
Parquet written through the store."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pandas as pd
import pyarrow.compute as pc
import pytest

from sweeper.errors import SweepError
from sweeper.reports import tables as report
from sweeper.spec.matrix import canonical
from sweeper.store import frames as analysis
from sweeper.store.manifest import SweepManifest
from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, table

# Axis values of every JSON type a matrix can hold; "0" and 0 must stay apart.
COMMITS = ["v1", "v2"]
SPECS = [("none", None), ("mtp", 4)]
RUNNER = ["0", "1"]
TEMPERATURE = [0, 0.5]
STRICT = [True, None]  # None: the axis is absent from some cells


def write_run(root: Path, per_cell: int = 7, seed: int = 0) -> RunDir:
    rng = random.Random(seed)
    run = RunDir(root / "r")
    run.write_manifest(SweepManifest(run_id="r", matrix={"axes": {"commit": COMMITS}}, commits={}))
    for commit, (spec, nst), runner in itertools.product(COMMITS, SPECS, RUNNER):
        group = f"g-{commit}-{spec}-{runner}"
        samples, cells = [], []
        for temperature, strict in itertools.product(TEMPERATURE, STRICT):
            values = {"commit": commit, "spec_method": spec, "num_speculative_tokens": nst,
                      "env.VLLM_USE_V2_MODEL_RUNNER": runner, "request.temperature": temperature,
                      "serve.--max-num-seqs": 8}
            if strict is not None:
                values["serve.--strict"] = strict
            cell_id = f"{group}-{temperature}-{strict}"
            common = {"run_id": "r", "group_id": group, "cell_id": cell_id, "server_key": group, "commit": commit,
                      "spec_method": spec, "num_speculative_tokens": nst,
                      "axes": [(k, canonical(v)) for k, v in values.items() if v is not None or k != "num_speculative_tokens"]}
            # mtp on v2 fails often; everything else rarely.
            rate = 0.6 if (commit, spec) == ("v2", "mtp") else 0.05
            passed = [rng.random() >= rate for _ in range(per_cell)]
            for i, ok in enumerate(passed):
                samples.append({**common, "case_id": f"case{i % 3}", "repeat": i, "request_id": f"{cell_id}-{i}",
                                "passed": ok, "failed_checks": [] if ok else ["json_schema"]})
            cells.append({**common, "status": "ok", "n_samples": per_cell, "n_failed": passed.count(False)})
        run.write_group(group, table(samples, SAMPLE_SCHEMA), table(cells, CELL_SCHEMA))
    return run


def test_axes_become_typed_columns_and_projection_and_filters_reach_the_reader(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    samples = analysis.load_samples(run)
    assert len(samples) == 2 * 2 * 2 * 2 * 2 * 7
    assert set(samples["env.VLLM_USE_V2_MODEL_RUNNER"]) == {"0", "1"}  # strings stay strings
    assert set(samples["request.temperature"]) == {0, 0.5}
    assert samples["request.temperature"].dtype == "float64"  # as pandas infers it from the values
    assert samples["serve.--max-num-seqs"].dtype == "int64" and set(samples["serve.--max-num-seqs"]) == {8}
    assert set(samples["serve.--strict"].map(repr)) == {"True", "None"}  # absent where the cell lacks it
    # The legacy path (any frame with an `axes` column) gives the same columns.
    legacy = analysis.with_axes(analysis.load_table(run, "samples").to_pandas())
    for name in ("env.VLLM_USE_V2_MODEL_RUNNER", "request.temperature", "serve.--strict"):
        assert legacy[name].map(repr).tolist() == samples[name].map(repr).tolist()

    one = samples["cell_id"].iloc[0]
    few = analysis.load_samples(run, columns=["cell_id", "passed", "axes"], filter=pc.field("cell_id") == one)
    assert set(few["cell_id"]) == {one} and len(few) == 7
    assert set(few.columns) == {"cell_id", "passed", "axes", "commit", "spec_method", "num_speculative_tokens",
                                "env.VLLM_USE_V2_MODEL_RUNNER", "request.temperature", "serve.--strict",
                                "serve.--max-num-seqs"}
    assert list(analysis.load_samples(run, columns=["passed"]).columns) == ["passed"]
    with pytest.raises(SweepError, match="no column 'nope'"):
        analysis.load_samples(run, columns=["nope"])
    cells = analysis.load_cells(run, filter=pc.field("commit") == "v2")
    assert len(cells) == 16 and set(cells["commit"]) == {"v2"}


@pytest.mark.parametrize("by", [["commit", "spec_method"], ["request.temperature"], ["serve.--strict", "case_id"],
                                ["env.VLLM_USE_V2_MODEL_RUNNER", "num_speculative_tokens"], []])
def test_duckdb_counts_match_pandas_over_the_samples(tmp_path: Path, by: list[str]) -> None:
    run = write_run(tmp_path)
    samples = analysis.load_samples(run)
    counts = analysis.failure_counts(run, by)
    key = lambda df: df[by].map(repr).apply(tuple, axis=1) if by else pd.Series([()] * len(df))
    expect = samples.assign(k=key(samples)).groupby("k")["passed"].agg(n="size", n_failed=lambda s: int((~s).sum()))
    got = counts.assign(k=key(counts)).set_index("k")[["n", "n_failed"]]
    assert got.sort_index().to_dict() == expect.sort_index().to_dict()
    # The cells table a report has read already gives the same counts (and one lacking a column too).
    for cells in (analysis.load_table(run, "cells", report.TABLE_COLUMNS), analysis.load_table(run, "cells", ["run_id"])):
        again = analysis.failure_counts(run, by, cells=cells)
        assert again.assign(k=key(again)).set_index("k")[["n", "n_failed"]].sort_index().to_dict() == \
            got.sort_index().to_dict()


def test_filters_on_axes_and_unknown_axes(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    samples = analysis.load_samples(run)
    counts = analysis.failure_counts(run, ["commit"], where={"request.temperature": 0.5, "spec_method": "mtp"})
    sub = samples[(samples["request.temperature"] == 0.5) & (samples.spec_method == "mtp")]
    assert dict(zip(counts.commit, counts.n, strict=True)) == sub.groupby("commit").size().to_dict()
    assert analysis.failure_counts(run, ["commit"], where={"env.VLLM_USE_V2_MODEL_RUNNER": 0}).empty  # "0" is not 0
    with pytest.raises(SweepError, match=r"no axis 'env.NOPE'"):
        analysis.failure_counts(run, ["env.NOPE"])


def test_the_heatmap_from_counts_is_the_heatmap_from_samples(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    samples = analysis.load_samples(run)
    for rows, cols in [(["commit"], ["spec_method"]), (["commit", "request.temperature"], ["serve.--strict"]),
                       (["spec_method"], [])]:
        from_samples = report.failure_pivot(samples, rows, cols, commit_order=["v2", "v1"])
        from_counts = report.failure_pivot(analysis.failure_counts(run, [*rows, *cols]), rows, cols,
                                           commit_order=["v2", "v1"])
        pd.testing.assert_frame_equal(from_samples, from_counts)
    path = report.heatmap(analysis.failure_counts(run, ["commit", "spec_method"]), ["commit"], ["spec_method"],
                          tmp_path / "h.png")
    assert path.stat().st_size > 1000


def test_a_run_without_samples(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "empty")
    run.write_manifest(SweepManifest(run_id="empty"))
    assert analysis.load_samples(run).empty
    assert analysis.failure_counts(run, ["commit"]).empty


def test_counts_stay_right_when_a_cell_is_written_twice_or_has_no_row(tmp_path: Path) -> None:
    """Per-cell counting needs one cell row per cell: a cell stored twice (two probes of one
    cell) or samples without a row fall back to reading each sample's own axes."""
    run = write_run(tmp_path)
    first = analysis.load_table(run, "samples").slice(0, 5).to_pylist()
    cell = analysis.load_table(run, "cells").slice(0, 1).to_pylist()
    again = [{**s, "group_id": "again", "request_id": s["request_id"] + "-again", "passed": False} for s in first]
    run.write_group("again", table(again, SAMPLE_SCHEMA), table([{**cell[0], "group_id": "again"}], CELL_SCHEMA))
    samples = analysis.load_samples(run)
    for by in (["commit", "request.temperature"], ["serve.--strict"]):
        assert by_key(analysis.failure_counts(run, by), by) == by_key(samples, by)
    other = write_run(tmp_path / "other")
    orphan = [{**s, "cell_id": "no-row", "request_id": s["request_id"] + "-orphan"} for s in first]
    other.write_group("orphan", table(orphan, SAMPLE_SCHEMA), table([], CELL_SCHEMA))
    samples = analysis.load_samples(other)
    assert by_key(analysis.failure_counts(other, ["commit"]), ["commit"]) == by_key(samples, ["commit"])


def by_key(df: pd.DataFrame, by: list[str]) -> dict[tuple[str, ...], tuple[int, int]]:
    """(n, n_failed) per combination of `by` (values by repr), from counts or from samples."""
    keys = df[by].map(repr).apply(tuple, axis=1)
    if "n" in df.columns:
        return {k: (int(n), int(f)) for k, n, f in zip(keys, df["n"], df["n_failed"], strict=True)}
    out: dict[tuple[str, ...], tuple[int, int]] = {}
    for k, passed in zip(keys, df["passed"], strict=True):
        n, f = out.get(k, (0, 0))
        out[k] = (n + 1, f + (not passed))
    return out
