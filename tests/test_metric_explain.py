"""`--explain` on a metric: the smallest setting conjunction that moves it, with its effect and interval."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from sweeper.judge.metric_explain import explain_lines, explain_metric
from tests.metricframes import frame, noisy, row


def _planted(tmp_path: Path, starts: int = 8, seed: int = 11) -> pd.DataFrame:
    """TPOT +15 % only with mtp and async scheduling off; per-start noise 2 %."""
    rng = random.Random(seed)
    rows = []
    for spec in ("none", "ngram", "mtp"):
        for sync in (True, False):
            for backend in ("FLASH_ATTN", "TRITON_ATTN"):
                axes = {"commit": "main", "spec_method": spec, "async_scheduling": sync, "attention_backend": backend}
                for s in range(starts):
                    slow = 1.15 if spec == "mtp" and not sync else 1.0
                    rows.append(row(axes, s, mean_tpot_ms=noisy(rng, 20.0 * slow, 0.02)))
    return frame(rows, tmp_path / "metrics.parquet")


def test_the_planted_conjunction_is_named_with_its_effect(tmp_path: Path) -> None:
    found = explain_metric(_planted(tmp_path), "mean_tpot_ms")
    assert found.terms == (("async_scheduling", "false"), ("spec_method", "mtp"))
    assert found.low is not None and found.high is not None and found.low < 0.15 < found.high
    assert found.p_adjusted is not None and found.p_adjusted < 0.05
    assert found.starts_inside == 16 and found.tried > 10
    assert "async_scheduling=false ∧ spec_method=mtp: +1" in found.line()


def test_nothing_is_claimed_where_nothing_moves_it(tmp_path: Path) -> None:
    rng = random.Random(2)
    rows = [row({"commit": "main", "spec_method": spec, "async_scheduling": sync}, s,
                mean_tpot_ms=noisy(rng, 20.0, 0.03)) for spec in ("none", "mtp") for sync in (True, False)
            for s in range(4)]
    found = explain_metric(frame(rows, tmp_path / "m.parquet"), "mean_tpot_ms")
    assert found.terms == () and "no setting conjunction moves it" in found.line()


def test_effective_values_stand_in_for_requested_ones(tmp_path: Path) -> None:
    # ngram asked for async scheduling and ran without it (vLLM turns it off silently); TPOT rises 15 %
    # wherever async scheduling is effectively off: those ngram starts are inside.
    rng = random.Random(4)
    rows = []
    for spec in ("none", "ngram", "mtp"):
        for sync in (True, False):
            axes = {"commit": "main", "spec_method": spec, "async_scheduling": sync}
            for s in range(4):
                slow = 1.15 if spec == "ngram" or not sync else 1.0
                rows.append(row(axes, s, mean_tpot_ms=noisy(rng, 20.0 * slow, 0.02)))
    metrics = frame(rows, tmp_path / "m.parquet")
    cells = pd.DataFrame([{"cell_id": c, "effective_async_scheduling": False, "effective_differs": ["async_scheduling"]}
                          for c in metrics["cell_id"].unique() if "ngram" in c and "async_scheduling=True" in c])
    found = explain_metric(metrics, "mean_tpot_ms", cells=cells)
    assert found.terms == (("async_scheduling", "false"),)
    assert (found.starts_inside, found.starts_outside) == (16, 8)
    assert len(explain_lines(metrics, "mean_tpot_ms", cells=cells)) == 1
