"""The results on disk: `runs/<run_id>/` with a manifest, Parquet samples and cells, and logs.

One declared schema per table (with `schema_version` in the Parquet metadata), written one file per
finished server group with an atomic rename, so a crash never leaves a half file and a resumed run
knows exactly which groups are done: a group is done when its cells file exists (written last).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sweeper import __version__, files
from sweeper.errors import StoreError

SCHEMA_VERSION = 1
_META = {b"schema_version": str(SCHEMA_VERSION).encode(), b"producer": f"sweeper {__version__}".encode()}

_AXES = [
    pa.field("settings_key", pa.string()),
    pa.field("commit", pa.string()),
    pa.field("commit_sha", pa.string()),
    pa.field("spec_method", pa.string()),
    pa.field("num_speculative_tokens", pa.int32()),
    pa.field("async_scheduling", pa.bool_()),
    pa.field("attention_backend", pa.string()),
    # Every axis value of the cell (generic env./serve./request. ones too), JSON-encoded values.
    pa.field("axes", pa.map_(pa.string(), pa.string())),
]

SAMPLE_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("cell_id", pa.string()),
    pa.field("server_key", pa.string()),
    *_AXES,
    pa.field("vllm_version", pa.string()),
    pa.field("suite", pa.string()),
    pa.field("suite_digest", pa.string()),
    pa.field("case_id", pa.string()),
    pa.field("repeat", pa.int32()),
    pa.field("request_id", pa.string()),
    pa.field("passed", pa.bool_()),
    pa.field("failed_checks", pa.list_(pa.string())),
    pa.field("check_details", pa.map_(pa.string(), pa.string())),
    pa.field("finish_reason", pa.string()),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("completion_tokens", pa.int32()),
    pa.field("reasoning_tokens", pa.int32()),
    pa.field("latency_s", pa.float64()),
    pa.field("ttft_s", pa.float64()),
    pa.field("http_status", pa.int32()),
    pa.field("error", pa.string()),
    pa.field("content_tail", pa.string()),
    pa.field("log_errors", pa.list_(pa.string())),
    pa.field("started_at", pa.timestamp("ms", tz="UTC")),
], metadata=_META)

CELL_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("cell_id", pa.string()),
    pa.field("server_key", pa.string()),
    *_AXES,
    pa.field("suite", pa.string()),
    pa.field("suite_digest", pa.string()),
    pa.field("status", pa.string()),
    pa.field("status_detail", pa.string()),
    # What a crash or a refused start says about the settings (`sweeper.vllm.crash`): a crash's
    # exception type + innermost vLLM frame, or `refused: <vLLM's reason>` when the refusal names a
    # setting; null when the cell ran, or when a start failure says nothing about the settings.
    pa.field("failure_signature", pa.string()),
    pa.field("log_tail", pa.string()),
    pa.field("n_samples", pa.int32()),
    pa.field("n_failed", pa.int32()),
    pa.field("failure_rate", pa.float64()),
    pa.field("ci_low", pa.float64()),
    pa.field("ci_high", pa.float64()),
    pa.field("failed_checks", pa.map_(pa.string(), pa.int32())),
    pa.field("startup_s", pa.float64()),
    pa.field("duration_s", pa.float64()),
    pa.field("gpu_seconds", pa.float64()),
    pa.field("server_starts", pa.int32()),
    pa.field("node", pa.string()),
    # What actually ran, next to what was asked for.
    pa.field("effective_model_runner", pa.string()),
    pa.field("effective_async_scheduling", pa.bool_()),
    pa.field("effective_attention_backend", pa.string()),
    pa.field("effective_spec_method", pa.string()),
    pa.field("effective_num_speculative_tokens", pa.int32()),
    pa.field("effective_structured_backend", pa.string()),
    pa.field("effective_differs", pa.list_(pa.string())),
    # Environment fingerprint.
    pa.field("vllm_version", pa.string()),
    pa.field("torch_version", pa.string()),
    pa.field("cuda_version", pa.string()),
    pa.field("gpu_name", pa.string()),
    pa.field("gpu_driver", pa.string()),
    pa.field("cpu_model", pa.string()),
    pa.field("hostname", pa.string()),
    # Spec-decode figures from the /metrics difference across the server group's replay: the same on
    # every cell row of the group (its cells' requests share the server and are interleaved).
    pa.field("spec_drafts", pa.float64()),
    pa.field("spec_draft_tokens", pa.float64()),
    pa.field("spec_accepted_tokens", pa.float64()),
    pa.field("spec_acceptance_rate", pa.float64()),
    pa.field("spec_mean_acceptance_length", pa.float64()),
    pa.field("spec_accepted_per_position", pa.list_(pa.float64())),  # acceptance at draft position 0, 1, ...
    pa.field("ttft_p50_s", pa.float64()),
    pa.field("latency_p50_s", pa.float64()),
], metadata=_META)

PROBE_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("probe", pa.int32()),
    pa.field("round", pa.int32()),
    pa.field("commit_sha", pa.string()),
    pa.field("position", pa.int32()),
    pa.field("settings_key", pa.string()),
    pa.field("cell_id", pa.string()),
    pa.field("status", pa.string()),
    pa.field("n_samples", pa.int32()),
    pa.field("n_failed", pa.int32()),
    # Failures per failure mode (sweeper.bisect.modes) among this probe's samples of this cell.
    pa.field("mode_failures", pa.map_(pa.string(), pa.int32())),
    pa.field("reused", pa.bool_()),
    pa.field("group_id", pa.string()),
    pa.field("gpu_seconds", pa.float64()),
], metadata=_META)

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def new_run_id(name: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:40] or "run"
    return f"{stamp}-{slug}"


def table(rows: Iterable[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows -> a table of exactly `schema` (missing keys are null; unknown keys are a bug)."""
    rows = list(rows)
    names = set(schema.names)
    for row in rows:
        extra = set(row) - names
        if extra:
            raise ValueError(f"columns not in the schema: {sorted(extra)}")
    cols = {name: [row.get(name) for row in rows] for name in schema.names}
    return pa.Table.from_pydict(cols, schema=schema)


def write_atomic(tbl: pa.Table, path: Path) -> None:
    with files.replacing(path) as tmp:
        pq.write_table(tbl, tmp)


def write_json_atomic(data: Any, path: Path) -> None:
    files.write_json(path, data)


@dataclass(frozen=True)
class RunDir:
    """One run's folder."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def samples_path(self, group_id: str) -> Path:
        return self.root / "samples" / f"{group_id}.parquet"

    def cells_path(self, group_id: str) -> Path:
        return self.root / "cells" / f"{group_id}.parquet"

    def done_groups(self) -> set[str]:
        """Groups whose results are complete (the cells file is written after the samples file)."""
        cells = self.root / "cells"
        if not cells.is_dir():
            return set()
        return {p.stem for p in cells.glob("*.parquet") if (self.root / "samples" / p.name).exists()}

    def write_group(self, group_id: str, samples: pa.Table, cells: pa.Table) -> None:
        _check_schema(samples, SAMPLE_SCHEMA, "samples")
        _check_schema(cells, CELL_SCHEMA, "cells")
        write_atomic(samples, self.samples_path(group_id))
        write_atomic(cells, self.cells_path(group_id))

    def read_manifest(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.manifest_path.read_text())
        except FileNotFoundError:
            raise StoreError(f"{self.root}: not a run (no manifest.json)") from None
        except json.JSONDecodeError as exc:
            raise StoreError(f"{self.manifest_path}: unreadable manifest: {exc}") from None
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.manifest_path}: results of schema version {version}, this sweep reads "
                             f"{SCHEMA_VERSION}; use the sweeper version that wrote them")
        return data

    def write_manifest(self, data: Mapping[str, Any]) -> None:
        write_json_atomic({**data, "schema_version": SCHEMA_VERSION}, self.manifest_path)


def _check_schema(tbl: pa.Table, schema: pa.Schema, what: str) -> None:
    if not tbl.schema.equals(schema, check_metadata=False):
        raise ValueError(f"{what} table does not match the declared schema")


def open_run(runs_dir: Path, run_id: str, *, create: bool) -> RunDir:
    if not RUN_ID_RE.match(run_id):
        raise StoreError(f"invalid run id {run_id!r}: expected letters, digits, '.', '_' or '-'")
    root = Path(runs_dir) / run_id
    if create:
        if root.exists() and any(root.iterdir()):
            raise StoreError(f"{root} already exists: pick another --run-id, or --resume {run_id}")
        root.mkdir(parents=True, exist_ok=True)
    elif not root.is_dir():
        raise StoreError(f"no run {run_id!r} under {runs_dir}")
    return RunDir(root)


def host_info() -> dict[str, str]:
    return {"hostname": socket.gethostname(), "sweeper": __version__}


def now_utc() -> datetime:
    return datetime.now(UTC)
