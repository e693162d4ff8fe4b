"""Metrics tables for the judging and reporting tests: rows as the load phase writes them
(`runs/README.md`, "The metrics table"), written to real Parquet and read back."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

FIGURES = ("request_throughput", "output_throughput", "mean_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
           "mean_itl_ms", "mean_e2el_ms", "spec_decode_acceptance_length", "spec_decode_acceptance_rate")
SE = ("request_throughput_se", "output_throughput_se", "mean_ttft_ms_se", "mean_tpot_ms_se",
      "spec_decode_acceptance_length_se")

SCHEMA = pa.schema([
    pa.field("run_id", pa.string()), pa.field("group_id", pa.string()), pa.field("cell_id", pa.string()),
    pa.field("commit", pa.string()), pa.field("spec_method", pa.string()),
    pa.field("num_speculative_tokens", pa.int32()), pa.field("async_scheduling", pa.bool_()),
    pa.field("attention_backend", pa.string()), pa.field("axes", pa.map_(pa.string(), pa.string())),
    pa.field("start", pa.int32()), pa.field("load_point", pa.string()), pa.field("concurrency", pa.int32()),
    pa.field("request_rate", pa.float64()), pa.field("completed", pa.int64()), pa.field("failed", pa.int64()),
    pa.field("duration", pa.float64()), pa.field("valid", pa.bool_()), pa.field("invalid_reason", pa.string()),
    *(pa.field(f, pa.float64()) for f in (*FIGURES, *SE)),
    pa.field("spec_decode_per_position_acceptance_rates", pa.list_(pa.float64())),
])


def row(axes: Mapping[str, Any], start: int, load_point: str = "concurrency=8", *, run_id: str = "run",
        valid: bool = True, reason: str | None = None, **figures: float | None) -> dict[str, Any]:
    """One (cell, start, load point) row; the cell id from its axes, the figures as given."""
    cell = "-".join(f"{k}={v}" for k, v in axes.items())
    out: dict[str, Any] = {
        "run_id": run_id, "group_id": cell, "cell_id": cell, "commit": str(axes.get("commit", "main")),
        "spec_method": axes.get("spec_method"), "num_speculative_tokens": axes.get("num_speculative_tokens"),
        "async_scheduling": axes.get("async_scheduling"), "attention_backend": axes.get("attention_backend"),
        "axes": [(k, json.dumps(v)) for k, v in axes.items()], "start": start, "load_point": load_point,
        "concurrency": int(load_point.split("=")[1]) if load_point.startswith("concurrency=") else None,
        "request_rate": float(load_point.split("=")[1]) if load_point.startswith("request_rate=") else None,
        "completed": 100, "failed": 0, "duration": 10.0, "valid": valid, "invalid_reason": reason,
    }
    out.update(figures)
    return out


def noisy(rng: random.Random, value: float, cv: float) -> float:
    return value * rng.lognormvariate(0.0, cv)


def write(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in SCHEMA} for r in rows], schema=SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def frame(rows: Sequence[Mapping[str, Any]], path: Path) -> pd.DataFrame:
    """The rows through a real Parquet file, as a reader gets them."""
    return pd.read_parquet(write(rows, path))
