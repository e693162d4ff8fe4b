"""A run's `expect:` bounds judged on its metrics, for every reader of failures (reads results only).

Failure modes flow from the samples table (`sweeper.judge.expectations` says why the evidence takes
the shape of samples rows). Each reader that classifies failures appends the run's judgements to the
samples it classifies (`with_expectations`: the cells table of `sweep report`, `--explain`, the HTML,
`--issue`, the triage), and a table of cells counts them in (`cells_with_expectations`), so a start
outside a bound is a failure of its bound's mode wherever failures are shown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from sweeper.judge.metric_names import METRICS

if TYPE_CHECKING:
    from sweeper.spec.expect import Expectation
    from sweeper.store.run_folder import RunDir


def load(run: RunDir) -> pd.DataFrame:
    """The run's metrics table (empty when it measured none)."""
    from sweeper.store.metrics_table import read_metrics

    return read_metrics(run)


# A triage's bad phase keeps here what `--watch` judged of its cells against the good phase's
# (`sweeper.judge.metric_changes`): {"good", "min_effect", "metrics", "rows"}, rows in the evidence shape.
WATCHED = "watched.json"


def expectation_evidence(run: RunDir, metrics: pd.DataFrame | None = None) -> pd.DataFrame:
    """The run's `expect:` bounds judged on its metrics (`sweeper.judge.expectations.evidence`), and the
    watched metrics' changes a triage stored with it (`WATCHED`); empty when there are neither."""
    from sweeper.judge.expectations import EVIDENCE_COLUMNS, evidence

    bounds = expectations_of(run)
    parts = []
    if bounds:
        table = load(run) if metrics is None else metrics
        if not table.empty:
            parts.append(evidence(table, bounds))
    stored = run.read_json(WATCHED)
    if isinstance(stored, dict) and stored.get("rows"):
        parts.append(pd.DataFrame(stored["rows"], columns=list(EVIDENCE_COLUMNS)))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame()
    return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def expectations_of(run: RunDir) -> tuple[Expectation, ...]:
    """The `expect:` bounds of the matrix stored in the run's manifest (none without one)."""
    from sweeper.spec.expect import from_matrix

    manifest = run.manifest_or_none()
    raw = getattr(manifest, "matrix", None) or {}
    return from_matrix(raw, {n: m.higher_is_better for n, m in METRICS.items()})


def with_expectations(run: RunDir, samples: pd.DataFrame, found: pd.DataFrame | None = None) -> pd.DataFrame:
    """`samples` with the run's expectation evidence (`found`, default `expectation_evidence(run)`)
    appended; unchanged without an `expect:` section. Every failure reader classifies these rows with
    the requests' (`sweeper.judge.expectations`)."""
    from sweeper.judge.expectations import SAMPLE_COLUMNS

    found = expectation_evidence(run) if found is None else found
    if found.empty:
        return samples
    extra = found[list(SAMPLE_COLUMNS)]
    if samples.empty and not len(samples.columns):
        return extra.reset_index(drop=True)
    return pd.concat([samples, extra], ignore_index=True)


def cells_with_expectations(run: RunDir, cells: pd.DataFrame, found: pd.DataFrame | None = None) -> pd.DataFrame:
    """`cells` with each cell's expectation judgements counted in (`sweeper.judge.expectations.failures`):
    `n_samples` and `n_failed` count them beside its requests, and `failed_checks` names each bound a
    start broke with how many (start, load point)s broke it. So a cell with a start outside a bound is
    failing in every table, sorted and labelled with its mode like a cell with failed requests."""
    from sweeper.judge.expectations import failures

    found = expectation_evidence(run) if found is None else found
    if found.empty or cells.empty:
        return cells
    per_cell = failures(found)
    out = cells.copy()
    n = out["n_samples"].fillna(0).astype(int).tolist() if "n_samples" in out.columns else [0] * len(out)
    k = out["n_failed"].fillna(0).astype(int).tolist() if "n_failed" in out.columns else [0] * len(out)
    checks = out["failed_checks"].tolist() if "failed_checks" in out.columns else [None] * len(out)
    for i, cell_id in enumerate(out["cell_id"].astype(str)):
        judged = per_cell.get(cell_id)
        if not judged:
            continue
        n[i] += sum(total for _, total in judged.values())
        k[i] += sum(broke for broke, _ in judged.values())
        pairs = _pairs(checks[i]) + [(mode, broke) for mode, (broke, _) in judged.items() if broke]
        checks[i] = pairs
    out["n_samples"], out["n_failed"] = n, k
    out["failed_checks"] = pd.Series(checks, index=out.index, dtype=object)
    return out


def _pairs(value: Any) -> list[tuple[str, int]]:
    """A cells row's `failed_checks` map (a dict, or the pairs Parquet gives) as (check, count) pairs."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    items = value.items() if isinstance(value, Mapping) else value
    return [(str(name), int(count)) for name, count in items]
