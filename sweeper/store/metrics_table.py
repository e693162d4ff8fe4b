"""The metrics table: one row per (cell, server start, load point) of a bench (`runs/README.md`).

Its schema is declared once here from the metric names (`sweeper.judge.metric_names`): the identity
of the row (the cell's axis columns as the cells table has them), the load point, the outcome
(`valid`, `invalid_reason`), then every figure, count and standard error. The run folder writes it
next to a group's samples and cells (`sweeper.store.run_folder.RunDir.write_group`); `read_metrics`
is the pandas loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from sweeper.judge.metric_names import COUNTS, LATENCIES, METRICS, PER_POSITION, PERCENTILES

if TYPE_CHECKING:
    import pandas as pd


class _Run(Protocol):
    """What `read_metrics` needs of a run folder (`sweeper.store.run_folder.RunDir`)."""

    @property
    def fs(self) -> Any: ...

    def files(self, kind: str) -> list[str]: ...

# The metrics table's own version (its file's `sweeper.table` metadata); the run's schema version is
# the store's (`schema_version`, as every table of the run).
TABLE = "sweep-metrics/1"

_INTS = {"completed", "failed", "total_input_tokens", "total_output_tokens", "max_concurrent_requests",
         "spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens"}


def _figure_fields() -> list[pa.Field]:
    fields = [pa.field(name, pa.int64() if name in _INTS else pa.float64()) for name in COUNTS]
    for name in ("request_throughput", "output_throughput", "total_token_throughput"):
        fields += [pa.field(name, pa.float64()), pa.field(f"{name}_se", pa.float64())]
    fields.append(pa.field("max_output_tokens_per_s", pa.float64()))
    for x in LATENCIES:
        fields += [pa.field(f"mean_{x}_ms", pa.float64()), pa.field(f"median_{x}_ms", pa.float64()),
                   pa.field(f"std_{x}_ms", pa.float64()),
                   *(pa.field(f"p{p}_{x}_ms", pa.float64()) for p in PERCENTILES),
                   pa.field(f"mean_{x}_ms_se", pa.float64())]
    for name in ("spec_decode_acceptance_rate", "spec_decode_acceptance_length"):
        fields += [pa.field(name, pa.float64()), pa.field(f"{name}_se", pa.float64())]
    fields.append(pa.field(PER_POSITION.name, pa.list_(pa.float64())))
    return fields


METRICS_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("cell_id", pa.string()),
    pa.field("server_key", pa.string()),
    pa.field("settings_key", pa.string()),
    pa.field("commit", pa.string()),
    pa.field("commit_sha", pa.string()),
    pa.field("spec_method", pa.string()),
    pa.field("num_speculative_tokens", pa.int32()),
    pa.field("async_scheduling", pa.bool_()),
    pa.field("attention_backend", pa.string()),
    pa.field("axes", pa.map_(pa.string(), pa.string())),
    pa.field("vllm_version", pa.string()),
    # The server start (0-based, of this server key in this run) and its seconds to healthy.
    pa.field("start", pa.int32()),
    pa.field("startup_s", pa.float64()),
    # The load point and the dataset.
    pa.field("load_point", pa.string()),
    pa.field("concurrency", pa.int32()),
    pa.field("request_rate", pa.float64()),  # inf: all at once
    pa.field("burstiness", pa.float64()),
    pa.field("dataset", pa.string()),
    pa.field("endpoint", pa.string()),
    pa.field("input_len", pa.int32()),
    pa.field("output_len", pa.int32()),
    pa.field("num_prompts", pa.int32()),
    pa.field("num_warmups", pa.int32()),
    pa.field("warmups_failed", pa.int32()),
    pa.field("seed", pa.int64()),
    pa.field("temperature", pa.float64()),
    pa.field("started_at", pa.timestamp("ms", tz="UTC")),
    # Whether the figures may be used; why not.
    pa.field("valid", pa.bool_()),
    pa.field("invalid_reason", pa.string()),
    *_figure_fields(),
])

# Every figure a reader may judge is a column; so is its standard error.
assert all(name in METRICS_SCHEMA.names for name in METRICS), "a metric without a column"
assert all(m.se in METRICS_SCHEMA.names for m in METRICS.values() if m.se), "an SE without a column"


def read_metrics(run: _Run) -> pd.DataFrame:
    """Every sound metrics file of a run as one frame (empty, with the declared columns, when none)."""
    import pandas as pd
    import pyarrow.parquet as pq

    files = run.files("metrics")
    if not files:
        return METRICS_SCHEMA.empty_table().to_pandas()
    tables = [pq.read_table(path, filesystem=run.fs, schema=METRICS_SCHEMA) for path in files]
    return pd.concat([t.to_pandas() for t in tables], ignore_index=True)
