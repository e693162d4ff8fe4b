"""`expect:` bounds judged on the metrics table: a start outside a bound is a failure of a named mode. Pure.

**How a metric failure reaches everything that shows failures.** Failure modes flow from the
samples table: each sample's case and `failed_checks` make its signature, `sweeper.judge.modes`
names the modes, and explain, the report's tables, the HTML, `--issue` and the triage all read them
from there (`sweeper.judge.explain.classify`). The least invasive honest way in is to add evidence in
that same shape rather than a second path through every consumer: `evidence` turns each valid
(cell, start, load point) row of the metrics table and each expectation into one evidence row, whose
case is the bound at that load point (`expect:mean_tpot_ms<=40 @ concurrency=8`) and whose
`failed_checks` is `[mode]` when the start is outside the bound, `[]` when inside. Nothing is
invented: there is one row per start that was measured, passes count as much as failures, an
invalid start (its figures unusable) and a relative bound without a baseline give no row, and the
unit is the server start (each row its own `group_id`, so explain's per-start dispersion sees
starts). The mode's name is the bound, so two bounds are two modes, and the case set of a mode is
its own bound's rows only (a passing start of another bound never dilutes its rate). What readers
must do is append these rows to the samples they classify (`sweeper.reports.metrics.with_expectations`).

A relative bound (`max_change` against a baseline commit) compares each start of a cell at another
commit with the mean over the valid starts of the baseline's cell of the same settings (every axis
but the commit) at the same load point: a start worse by more than `max_change` in the metric's bad
direction fails. The baseline's own starts are not judged by it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sweeper.judge import metric_starts as ms
from sweeper.judge.axis_levels import COMMIT
from sweeper.judge.explain import Explanation
from sweeper.spec.expect import MODE_PREFIX, Expectation

EVIDENCE_COLUMNS = ("run_id", "group_id", "cell_id", "commit", "commit_sha", "axes", "case_id", "repeat",
                    "request_id", "passed", "failed_checks", "check_details", "metric", "value", "bound",
                    "load_point", "start")
# The part of an evidence row shaped like a samples row: what a reader appends to its samples.
SAMPLE_COLUMNS = EVIDENCE_COLUMNS[:EVIDENCE_COLUMNS.index("check_details") + 1]


def case_of(e: Expectation, load_point: str) -> str:
    """The evidence case of a bound at a load point."""
    return f"{e.mode} @ {load_point}" if load_point else e.mode


def outside(e: Expectation, value: float, baseline: float | None) -> bool | None:
    """Whether `value` breaks the bound (None: cannot tell, no baseline)."""
    if e.max_change is None:
        return (e.low is not None and value < e.low) or (e.high is not None and value > e.high)
    if baseline is None:
        return None
    if e.higher_is_better:
        return value < baseline * (1 - e.max_change)
    return value > baseline * (1 + e.max_change)


def _baselines(rows: Sequence[Mapping[str, Any]], e: Expectation) -> dict[tuple[ms.Settings, str], float]:
    per: dict[tuple[ms.Settings, str], list[float]] = {}
    for r in rows:
        if str(r.get(COMMIT)) != e.against or not ms.is_valid(r):
            continue
        value = ms.number(r.get(e.metric))
        if value is not None:
            per.setdefault((ms.settings(r), str(r.get("load_point") or "")), []).append(value)
    return {k: float(np.mean(v)) for k, v in per.items()}


def evidence(metrics: pd.DataFrame, expectations: Sequence[Expectation]) -> pd.DataFrame:
    """One evidence row per valid (cell, start, load point) row and bound (see the module docstring)."""
    rows = ms.records(metrics)
    out: list[dict[str, Any]] = []
    for e in expectations:
        base = _baselines(rows, e) if e.max_change is not None else {}
        for r in rows:
            if not ms.is_valid(r) or (e.against is not None and str(r.get(COMMIT)) == e.against):
                continue
            value = ms.number(r.get(e.metric))
            if value is None:
                continue  # not measured here (no speculative decoding for an acceptance bound)
            point = str(r.get("load_point") or "")
            baseline = base.get((ms.settings(r), point)) if e.max_change is not None else None
            broke = outside(e, value, baseline)
            if broke is None:
                continue
            start = r.get("start")
            group = f"{r.get('group_id') or r.get('cell_id')}#start{start}"
            detail = f"{e.metric} = {value:.6g}" + (f" (baseline {e.against}: {baseline:.6g})" if baseline else "")
            out.append({
                "run_id": r.get("run_id"), "group_id": group, "cell_id": r.get("cell_id"),
                "commit": r.get(COMMIT), "commit_sha": r.get("commit_sha"), "axes": r.get("axes"),
                "case_id": case_of(e, point), "repeat": int(start) if start is not None and _is_int(start) else 0,
                "request_id": f"{group}/{point}/{e.metric}", "passed": not broke,
                "failed_checks": [e.mode] if broke else [], "check_details": [(e.mode, detail)] if broke else [],
                "metric": e.metric, "value": value, "bound": e.mode, "load_point": point, "start": start,
            })
    return pd.DataFrame(out, columns=list(EVIDENCE_COLUMNS))


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) or (isinstance(value, float) and math.isfinite(value)
                                                    and value.is_integer())


def failures(evidence_rows: pd.DataFrame) -> dict[str, dict[str, tuple[int, int]]]:
    """Per cell: mode -> (starts outside, starts judged), over every load point."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for r in ms.records(evidence_rows):
        cell = out.setdefault(str(r["cell_id"]), {})
        k, n = cell.get(str(r["bound"]), (0, 0))
        cell[str(r["bound"])] = (k + (not r["passed"]), n + 1)
    return out


# What an expect mode counts: each evidence row is one server start at one load point judged by one
# bound, not a request; explain and the reports say so (`with_unit`).
UNIT = "server starts × load points"


def is_expect_mode(mode: str) -> bool:
    """Whether a failure mode is an `expect:` bound's (its name is the bound: `Expectation.mode`)."""
    return mode.startswith(MODE_PREFIX)


def is_evidence(samples: pd.DataFrame) -> pd.Series:
    """Which rows of a samples table are expectation evidence (their case is a bound at a load point)."""
    if samples.empty or "case_id" not in samples.columns:
        return pd.Series(False, index=samples.index, dtype=bool)
    return samples["case_id"].astype(str).str.startswith(MODE_PREFIX)


def with_unit(explanation: Explanation) -> Explanation:
    """`explanation` with each expect mode counted in what it is made of (`UNIT`), not in samples."""
    modes = tuple(dataclasses.replace(m, unit=UNIT) if is_expect_mode(m.mode) and m.unit == "samples" else m
                  for m in explanation.modes)
    return dataclasses.replace(explanation, modes=modes)
