"""The explanation as JSON (`sweep report --explain --json`): one object per failure mode with its
conjunction, the evidence on both sides, the test and its adjusted p-value, the aliases and the
commits. Pure. The schema is documented with the run's files (runs/README.md) and `SCHEMA_VERSION`
changes with any change to its shape.
"""

from __future__ import annotations

from typing import Any

from sweeper.judge.explain import TEST as TEST_NAME
from sweeper.judge.explain import Count, Evidence, Explanation, ModeExplanation, Term, display_axis

SCHEMA_VERSION = 3


def _term(t: Term) -> dict[str, Any]:
    return {"axis": t.axis, "name": display_axis(t.axis), "value": t.value, "effective": t.effective,
            "requested": list(t.requested)}


def _count(c: Count) -> dict[str, int]:
    return {"failed": c.failed, "n": c.n}


def _side(c: Count, e: Evidence | None) -> dict[str, Any]:
    out: dict[str, Any] = {**_count(c), "rate": c.failed / c.n if c.n else None}
    if e is not None:
        out.update(starts=e.starts, effective_failed=e.failed, effective_n=e.n, low=e.low, high=e.high)
    return out


def mode_json(m: ModeExplanation, number: int) -> dict[str, Any]:
    return {
        "number": number,
        "mode": m.mode,
        "unit": m.unit,
        "verdict": m.verdict.value,
        "conjunction": [_term(t) for t in m.terms],
        "text": m.conjunction,
        "inside": _side(m.inside, m.inside_evidence),
        "outside": _side(m.outside, m.outside_evidence),
        "test": {"name": TEST_NAME, "p_value": m.p_value, "p_adjusted": m.p_adjusted, "tried": m.tried},
        "dispersion": {"rho": m.rho, "rho_high": m.rho_high, "starts": m.starts, "worth": m.worth,
                       "replay_rho": m.replay_rho},
        "without": [{"term": _term(w.term), **_count(w.count)} for w in m.without],
        "aliases": [[_term(t) for t in alt] for alt in m.alternatives],
        "aliased_refinements": [[_term(t) for t in alt] for alt in m.refinements],
        "unsure_parts": [{"term": _term(t), **_count(c)} for t, c in m.unsure_parts],
        "unneeded_terms": [_term(t) for t in m.unneeded],
        "effective_notes": list(m.effective_notes),
        "scope": {"commits": list(m.commits),
                  "clean_commits": [{"commit": c, **_count(n)} for c, n in m.clean_commits]},
        "cases": list(m.cases),
        "failing_cells": [{"cell_id": c, **_count(n)} for c, n in m.failing_cells],
        "failures": m.failures,
        "cells_in_scope": m.cells_in_scope,
        "status_details": [{"text": t, "starts": n} for t, n in m.details],
    }


def to_json(e: Explanation) -> dict[str, Any]:
    """The whole explanation as a JSON-ready object."""
    return {"schema_version": SCHEMA_VERSION, "alpha": e.alpha, "max_terms": e.max_terms,
            "n_samples": e.n_samples, "labels_from_suite": e.labels_from_suite,
            "modes": [mode_json(m, i) for i, m in enumerate(e.modes, 1)]}
