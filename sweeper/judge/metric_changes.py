"""A watched metric that got worse between the good and the bad commit, as a failure mode (`sweep triage
--watch mean_tpot_ms`): no `expect:` bound needed. Pure.

A watched metric is the relative bound it amounts to, `Expectation(metric, max_change=min_effect,
against=good)`, judged as `sweeper.judge.expectations` judges every `expect:` bound: each valid start of
a cell at bad against the mean of the same cell's valid starts at good, at the same load point; a start
worse by more than the minimum effect in the metric's bad direction fails. The unit is the server start,
as for any bound, so explain's per-start dispersion weighs a start that strayed by chance against a cell
whose every start moved, and the triage's metric bisect, which models starts, decides whether and where
the change is. A cell without valid starts at good has no baseline and gives no row.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from sweeper.judge.expectations import EVIDENCE_COLUMNS, evidence
from sweeper.judge.metric_names import METRICS
from sweeper.spec.expect import Expectation


def watched(metric: str, min_effect: float, good: str) -> Expectation:
    """The relative bound a watched metric amounts to: no worse than `min_effect` against `good`."""
    return Expectation(metric, max_change=min_effect, against=good, higher_is_better=METRICS[metric].higher_is_better)


def change_evidence(bad: pd.DataFrame, good: pd.DataFrame, metrics: Sequence[str], *, min_effect: float,
                    good_ref: str) -> pd.DataFrame:
    """One evidence row per valid start at bad, load point and watched metric measured at both ends (see
    the module docstring). `good`'s rows must carry `good_ref` as their commit (the triage's good sweep)."""
    names = [m for m in metrics if m in bad.columns and m in good.columns]
    if bad.empty or good.empty or not names:
        return pd.DataFrame(columns=list(EVIDENCE_COLUMNS))
    both = pd.concat([bad, good], ignore_index=True)
    return evidence(both, [watched(m, min_effect, good_ref) for m in names])
