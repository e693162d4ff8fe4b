"""The metric bisect's report: `bisect.json` of a `sweep bisect --metric` run (its schema below), the
terminal text, and the line printed after each round. A reader: it builds and prints data, it never
starts anything (`sweeper.drivers.metric_bisect` runs the probes).

`bisect.json`, schema "sweep-metric-bisect/1":

    schema          "sweep-metric-bisect/1"
    run_id, final (false while rounds are still to come), updated, sweeper
    question        {metric, unit, load_point, min_effect (relative: 0.03 is 3 %), higher_is_better,
                     direction: "higher is better" | "lower is better", confidence}
    range           {good, bad: sha; commits: number of commits after good}
    cells[]         one entry per bisected cell:
      cell            {axis: value} without the commit; `label` its one-line form; `settings_key`
      verdict         "changes" | "no_change" | "drift" | "undecided"
      changes         [CHANGE] of min_effect or more, oldest first (`found`: located and settled)
      small_changes   [CHANGE] located but credibly smaller than min_effect
      drifts          [{first, last: COMMIT; from, to: the metric's values; effect: to / from - 1}]
      no_change       {larger_than: X (relative), confidence} | null: no change larger than X anywhere
      undecided       {more_starts: N} | null: about N more starts would decide what is open
      p_no_change     P(no change of min_effect or more anywhere)
      spread          the between-start spread the model learned (relative)
      done, rounds, starts (told to this cell's search: probes and reused starts), invalid_starts
      skipped         [[sha, reason]]: commits that could not be started (install, server)
      probed          [{position, sha, starts, mean}]: what each probed commit showed (geometric mean)
    rounds, server_starts (probes of this run), invalid_starts, gpu_seconds   for the whole bisect
    reused_starts   [{run_id, group_id, start, commit}]: stored starts of other runs told before any probe
    budget          (with `--budget` only) {gpu_hours, spent_gpu_hours, exhausted}
    CHANGE  {kind: "regression" | "improvement", commit: COMMIT, candidates: [sha], last_before: sha,
             located, found, confidence, before, after (the metric's levels either side),
             effect, effect_low, effect_high (after / before - 1, median and 95 % interval),
             p_material, starts_before, starts_after}
    COMMIT  {sha, short, subject, pr, date}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.bisect.metric_search import MetricChange, MetricReport

SCHEMA = "sweep-metric-bisect/1"
SCHEMA_PREFIX = "sweep-metric-bisect/"


def is_metric_bisect(summary: Any) -> bool:
    """Whether a bisect.json is a metric bisect's (any version of its schema)."""
    return isinstance(summary, Mapping) and str(summary.get("schema", "")).startswith(SCHEMA_PREFIX)


@dataclass(frozen=True)
class Question:
    """What a metric bisect asks: which commit moved `metric` at `load_point` by `min_effect` or more."""

    metric: str
    unit: str
    load_point: str
    min_effect: float
    higher_is_better: bool
    confidence: float

    def record(self) -> dict[str, Any]:
        return {"metric": self.metric, "unit": self.unit, "load_point": self.load_point,
                "min_effect": self.min_effect, "higher_is_better": self.higher_is_better,
                "direction": "higher is better" if self.higher_is_better else "lower is better",
                "confidence": self.confidence}


@dataclass(frozen=True)
class CellReport:
    """One bisected cell's search result and what the driver counted of it."""

    settings: Mapping[str, Any]
    label: str
    settings_key: str
    report: MetricReport
    probed: Sequence[Mapping[str, Any]]  # [{position, sha, starts, mean}]
    invalid_starts: int


def _change(c: MetricChange, info: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return {"kind": str(c.kind), "commit": info(c.commit), "candidates": list(c.candidates),
            "last_before": c.before_commit, "located": c.located, "found": c.found,
            "confidence": _num(c.confidence), "before": _num(c.value_before), "after": _num(c.value_after),
            "effect": _num(c.effect), "effect_low": _num(c.effect_low), "effect_high": _num(c.effect_high),
            "p_material": _num(c.p_material), "starts_before": c.starts_before, "starts_after": c.starts_after}


def _num(x: float) -> float | None:
    """JSON has no NaN or infinity: such a figure is null."""
    return float(x) if math.isfinite(x) else None


def describe(question: Question, cells: Sequence[CellReport], commits: Sequence[str],
             info: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """The report of a metric bisect as JSON-able data (schema in the module docstring); `info` names a
    commit ({sha, short, subject, pr, date})."""
    out = []
    for c in cells:
        r = c.report
        no_change = None
        if r.bound is not None and not any(ch.found for ch in r.changes):
            no_change = {"larger_than": r.bound, "confidence": _num(r.bound_confidence)}
        out.append({
            "cell": dict(c.settings), "label": c.label, "settings_key": c.settings_key, "verdict": str(r.verdict),
            "changes": [_change(ch, info) for ch in r.changes],
            "small_changes": [_change(ch, info) for ch in r.small_changes],
            "drifts": [{"first": info(d.first), "last": info(d.last), "from": _num(d.value_from),
                        "to": _num(d.value_to), "effect": _num(d.effect)} for d in r.drifts],
            "no_change": no_change,
            "undecided": {"more_starts": r.to_decide_starts} if str(r.verdict) == "undecided" else None,
            "p_no_change": _num(r.no_change), "spread": _num(r.spread), "done": r.done, "rounds": r.rounds,
            "starts": r.starts, "invalid_starts": c.invalid_starts,
            "skipped": [[sha, why] for sha, why in r.skipped], "probed": list(c.probed)})
    return {"schema": SCHEMA, "question": question.record(),
            "range": {"good": commits[0], "bad": commits[-1], "commits": len(commits) - 1}, "cells": out}


# ---- text ---------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:+.1f} %"


def _value(x: float | None, unit: str) -> str:
    if x is None:
        return "?"
    return f"{x:.4g} {unit}" if unit not in ("%",) else f"{x:.4g} %"


def _commit(c: Mapping[str, Any]) -> str:
    pr = f" (#{c['pr']})" if c.get("pr") else ""
    subject = str(c.get("subject") or "")
    return f"{c.get('short') or str(c.get('sha'))[:10]} {subject!r}{pr}" if subject else f"{c.get('short')}{pr}"


def change_line(ch: Mapping[str, Any], unit: str) -> str:
    """`regression at 1a2b3c4d5e 'subject' (#123): 10.1 ms → 11.4 ms (+12.6 %, 95 % interval +10.2 % to
    +15.0 %), confidence 0.998`"""
    where = _commit(ch["commit"]) if ch.get("located") else \
        f"one of {len(ch['candidates'])} commits up to {_commit(ch['commit'])}"
    return (f"{ch['kind']} at {where}: {_value(ch['before'], unit)} → {_value(ch['after'], unit)} "
            f"({_pct(ch['effect'])}, 95 % interval {_pct(ch['effect_low'])} to {_pct(ch['effect_high'])}), "
            f"confidence {ch['confidence']:.3f}" + ("" if ch.get("found") else " (not settled)"))


def cell_lines(cell: Mapping[str, Any], question: Mapping[str, Any]) -> list[str]:
    """What one cell's search concluded, one line per finding."""
    unit = str(question.get("unit") or "")
    lines = [change_line(ch, unit) for ch in cell.get("changes", [])]
    for d in cell.get("drifts", []):
        lines.append(f"drift from {_commit(d['first'])} to {_commit(d['last'])}: {_value(d['from'], unit)} → "
                     f"{_value(d['to'], unit)} ({_pct(d['effect'])}); no single commit made it")
    settled = any(ch.get("found") for ch in cell.get("changes", []))
    if not settled:
        nc = cell.get("no_change")
        if nc:
            lines.append(f"no change larger than {100 * nc['larger_than']:g} % (confidence {nc['confidence']:.3f})")
        more = (cell.get("undecided") or {}).get("more_starts")
        measured = sum(1 for p in cell.get("probed", []) if p.get("starts"))
        if cell.get("undecided") and cell.get("done") and measured < 2:
            lines.append(f"undecided: {measured} commit(s) of the range could be measured; a change needs two")
        elif cell.get("undecided"):
            lines.append(f"undecided: about {more} more starts would decide it")
    for ch in cell.get("small_changes", []):
        lines.append("smaller than the minimum effect: " + change_line(ch, unit))
    for sha, why in cell.get("skipped", []):
        lines.append(f"untestable: {str(sha)[:10]} ({why})")
    if cell.get("invalid_starts"):
        lines.append(f"{cell['invalid_starts']} start(s) gave no valid figures (not evidence)")
    return lines


def render(summary: Mapping[str, Any]) -> str:
    """The verdict as text: the question, then per cell its findings, then what it cost."""
    q = summary.get("question", {})
    rng = summary.get("range", {})
    cells = summary.get("cells", [])
    head = (f"metric bisect of {q.get('metric')} ({q.get('direction')}) at {q.get('load_point')}, "
            f"minimum effect {100 * float(q.get('min_effect') or 0):g} %, confidence {q.get('confidence')}: "
            f"{rng.get('commits')} commits {str(rng.get('good'))[:10]}..{str(rng.get('bad'))[:10]}")
    lines = [head]
    for cell in cells:
        if len(cells) > 1 or cell.get("label"):
            lines.append(f"{cell.get('label')}:")
        lines += [f"  {line}" for line in cell_lines(cell, q)]
    reused = summary.get("reused_starts") or []
    runs = sorted({r["run_id"] for r in reused})
    lines.append(f"{summary.get('rounds', 0)} round(s), {summary.get('server_starts', 0)} server start(s)"
                 + (f" (+{len(reused)} stored, reused from {', '.join(runs)})" if reused else "")
                 + f", {float(summary.get('gpu_seconds') or 0):.0f} GPU-s")
    budget = summary.get("budget")
    if budget and budget.get("exhausted"):
        lines.append(f"budget spent: {budget['spent_gpu_hours']:.3f} of {budget['gpu_hours']:g} GPU-h; "
                     "what is open stays undecided (`--resume` with a larger --budget goes on)")
    return "\n".join(lines)


def round_line(round_no: int, positions: Sequence[int], n_commits: int, *, starts: int, reused_starts: int,
               gpu_seconds: float, invalid: Sequence[str], best: str | None) -> str:
    """`round 3: 4 starts at positions 2, 5, 8, 10 of 40; 14 starts so far (+4 stored, reused), 31 GPU-s;
    1 start invalid, not evidence: REASON; best so far: regression at 1a2b3c4d5e +12.1 % (P 0.93)`"""
    n = len(positions)
    line = (f"round {round_no}: {n} start{'' if n == 1 else 's'} at position{'' if n == 1 else 's'} "
            f"{', '.join(str(p) for p in sorted(positions))} of {n_commits}; {starts} start{'' if starts == 1 else 's'} "
            "so far" + (f" (+{reused_starts} stored, reused)" if reused_starts else "") + f", {gpu_seconds:.0f} GPU-s")
    if invalid:
        line += (f"; {len(invalid)} start{' was' if len(invalid) == 1 else 's were'} invalid, not evidence: "
                 + " | ".join(sorted(set(invalid))))
    if best:
        line += f"; best so far: {best}"
    return line


def best_so_far(report: MetricReport) -> str | None:
    """The most credible change of a search's report, in a few words (None: none more likely than not)."""
    if not report.changes:
        return None
    c = max(report.changes, key=lambda ch: ch.confidence)
    return f"{c.kind} at {c.commit[:10]} {c.effect:+.1%} (P {c.confidence:.2f})"
