"""The bisect report: `bisect.json` (its schema below) and the terminal text.

`bisect.json`, schema "sweep-bisect/2":

    schema          "sweep-bisect/2"
    range           {good, bad: sha; commits: number of commits after good}
    confidence      the target; a change is `found` when located and at least this sure
    bump_width      `--bumps`: every run of this many commits was to get a probe (null: no scan)
    quiet_scan      without `--bumps`: every run of this many commits was to get a probe before a
                    cell's bisect said nothing changed (null: `--bumps` given, or 0)
    expected_changes  `--expect-changes`: the changes per range the search's prior expected (1 by default)
    by_commit[]     one entry per commit where any change was found, newest first:
                    {commit: COMMIT, changes: [{mode, direction, confidence, cells: [label]}]}
    cells[]         one entry per bisected cell:
      cell            {axis: value} without the commit; `label` its one-line form
      bad_endpoint    "fails" | "passes" | "undecided" | "untestable"
      done            false when a limit stopped the search with something open (`open`: how many)
      failing_at_bad  [{mode, rate: RATE, started: CHANGE | null, before_good: bool}]
                      what still fails at bad, and the regression that brought it (null with
                      before_good = true when it fails at good too and no start was found)
      changes         [CHANGE], oldest first
      modes           [{mode, at_good: RATE, at_bad: RATE, no_change, rho, fails_at_good, fails_at_bad,
                        observed_at_good: {failures, samples}, observed_at_bad: {failures, samples},
                        drifts: [{first, last: sha; rate_from, rate_to; steps}], decided, to_decide_samples}]
                      at_good / at_bad: the model's segments at either end (one and the same when it
                      finds no change); observed_at_*: what the endpoints themselves showed; drifts:
                      ranges where the rate drifts rather than steps (their steps are not in
                      `changes`); decided: P(no change) or every change reached the target, else
                      to_decide_samples estimates the samples still needed
      to_decide_gpu_seconds   the modelled GPU-seconds still needed to decide every mode
      widest_unprobed the most testable commits in a row between two probed ones: a regression
                      fixed again within that many commits could lie there unseen
      bump_scan       (without `--bumps` only) {width, server_starts, gpu_seconds}: what `--bumps
                      width` would add to the probes made, before anything they find asks for more
      rounds, probes, samples, skipped: [[sha, reason]]
    rounds, server_starts, reused_samples, gpu_seconds   for the whole bisect
    budget          (with `--budget` only) {gpu_hours: the budget; spent_gpu_hours: the run's GPU-seconds
                    so far in hours; exhausted: true when a round the cost model priced past what was
                    left was not started (what is open stays undecided, each cell's
                    to_decide_gpu_seconds says what deciding would cost)}
    CHANGE  {mode, direction: "regression" | "fix", commit: COMMIT, candidates: [COMMIT],
             confidence, located, found, before: RATE, after: RATE, last_before: sha,
             posterior: [P(the mode's rate changes at commit j) for j = 0..N],
             fixed_by: sha | null (a regression undone later in the range),
             fixes: sha | null (the regression a fix undoes)}
    COMMIT  {sha, short, subject, pr, date}
    RATE    {failures, samples, starts, rate, low, high}   rate: posterior mean; low/high: 95 %
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shlex
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.bisect.search import BadEndpoint, BisectReport, Change, Direction
from sweeper.bisect.segments import SAME_WITHIN, Rate

SCHEMA = "sweep-bisect/2"


@dataclass(frozen=True)
class ReportCell:
    """A bisected cell as the report names it."""

    settings: Mapping[str, Any]  # axis -> value, the commit aside
    label: str  # the settings on one line
    settings_key: str


# What a clean bad endpoint rules out (`SearchOptions.pass_starts` clean starts of the samples that
# bound a steady rate under 1 %).
_PASSES = ("nothing fails there (no failure mode at >= 1% with the target confidence; at >= 4% if its "
           "rate varies between server starts with ICC 0.1)")


def _rate(r: Rate) -> dict[str, Any]:
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(Rate)}


def _seen(failures: int, samples: int) -> dict[str, Any]:
    return {"failures": failures, "samples": samples}


def _pairs(changes: Sequence[Change]) -> dict[int, tuple[str | None, str | None]]:
    """Per change: (fixed_by, fixes) — a regression and the next change of its mode that undoes it."""
    out: dict[int, tuple[str | None, str | None]] = {i: (None, None) for i in range(len(changes))}
    by_mode: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(changes):
        by_mode[c.mode].append(i)
    for idx in by_mode.values():
        for a, b in itertools.pairwise(idx):
            ca, cb = changes[a], changes[b]
            if ca.direction is Direction.REGRESSION and cb.direction is Direction.FIX \
                    and cb.after.rate < max(ca.before.rate * 1.5, ca.before.rate + 0.02):
                out[a] = (cb.commit, out[a][1])
                out[b] = (out[b][0], ca.commit)
    return out


def _swaps(changes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """At one commit, a fix of one mode and a regression of another in the same cells: the commit
    swaps one failure for another (the cells still fail, differently)."""
    out = []
    for fix in (c for c in changes if c["direction"] == Direction.FIX.value):
        for reg in (c for c in changes if c["direction"] == Direction.REGRESSION.value):
            cells = [lb for lb in fix["cells"] if lb in set(reg["cells"])]
            if cells:
                out.append({"fixed": fix["mode"], "brought": reg["mode"], "cells": cells})
    return out


def named_commits(reports: Iterable[BisectReport]) -> set[str]:
    """The commits `describe` names, so that its caller can look up their `COMMIT` entries."""
    out = set()
    for rep in reports:
        for c in rep.changes:
            out.add(c.commit)
            out.update(c.candidates if c.located else (c.candidates[0], c.candidates[-1]))
    return out


def describe(reports: Sequence[BisectReport], cells: Sequence[ReportCell], commits: Sequence[str],
             commit_info: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The report of a bisect as JSON-able data (schema in the module docstring): one report per
    cell, over `commits`; `commit_info` holds the `COMMIT` entry of every `named_commits` sha."""
    def info(sha: str) -> dict[str, Any]:
        return dict(commit_info[sha])

    position = {c: i for i, c in enumerate(commits)}
    rows = []
    by_commit: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for target, rep in zip(cells, reports, strict=True):
        changes = sorted(rep.changes, key=lambda c: (position[c.commit], c.mode))
        density = {m.mode: [round(p, 5) for p in m.change_density(len(commits))] for m in rep.modes}
        pairs = _pairs(changes)
        change_rows: list[dict[str, Any]] = []
        for i, c in enumerate(changes):
            row: dict[str, Any] = {"mode": c.mode, "direction": c.direction.value, "commit": info(c.commit),
                   "candidates": [info(x) for x in c.candidates] if c.located else
                   [info(c.candidates[0]), info(c.candidates[-1])],
                   "n_candidates": len(c.candidates), "confidence": c.confidence, "located": c.located,
                   "found": c.found, "before": _rate(c.before), "after": _rate(c.after), "last_before": c.last_before,
                   "fixed_by": pairs[i][0], "fixes": pairs[i][1], "posterior": density[c.mode]}
            change_rows.append(row)
            if c.found:
                by_commit[c.commit].append({"mode": c.mode, "direction": c.direction.value,
                                            "confidence": c.confidence, "cells": [target.label],
                                            "settings": [dict(target.settings)],
                                            "before": _seen(c.before.failures, c.before.samples),
                                            "after": _seen(c.after.failures, c.after.samples)})
        failing = []
        for m in rep.failing_at_bad:
            started = m.started
            failing.append({"mode": m.mode, "rate": _rate(m.at_bad),
                            "started": next((r for r in change_rows if started and r["mode"] == m.mode
                                             and r["commit"]["sha"] == started.commit), None),
                            "before_good": m.fails_at_good and started is None})
        rows.append({
            "cell": dict(target.settings), "label": target.label,
            "settings_key": target.settings_key, "bad_endpoint": rep.bad_endpoint.value, "done": rep.done,
            "open": rep.open_gaps, "failing_at_bad": failing, "changes": change_rows,
            "modes": [{"mode": m.mode, "at_good": _rate(m.at_good), "at_bad": _rate(m.at_bad), "no_change": m.no_change,
                       "rho": m.rho, "fails_at_good": m.fails_at_good, "fails_at_bad": m.fails_at_bad,
                       "observed_at_good": _seen(*m.observed[0]), "observed_at_bad": _seen(*m.observed[1]),
                       "drifts": [{"first": d.first, "last": d.last, "rate_from": d.rate_from, "rate_to": d.rate_to,
                                   "steps": d.steps} for d in m.drifts],
                       "decided": m.decided, "to_decide_samples": m.to_decide_samples}
                      for m in rep.modes],
            "to_decide_gpu_seconds": rep.to_decide_s, "widest_unprobed": rep.widest_unprobed,
            **({"bump_scan": dict(zip(("width", "server_starts", "gpu_seconds"), rep.scan_quote, strict=True))}
               if rep.scan_quote else {}),
            "rounds": rep.rounds, "probes": rep.probes, "samples": rep.samples,
            "skipped": [list(s) for s in rep.skipped]})
    merged_by_commit = []
    for sha in sorted(by_commit, key=lambda s: -position[s]):
        grouped: dict[tuple[str, str], dict[str, Any]] = {}
        for ch in by_commit[sha]:
            key = (ch["mode"], ch["direction"])
            if key in grouped:
                g = grouped[key]
                g["cells"] += ch["cells"]
                g["settings"] += ch["settings"]
                g["confidence"] = min(g["confidence"], ch["confidence"])
                for side in ("before", "after"):
                    g[side] = {k: g[side][k] + ch[side][k] for k in ("failures", "samples")}
            else:
                grouped[key] = {**ch, "cells": list(ch["cells"]), "settings": list(ch["settings"])}
        changes_here = list(grouped.values())
        merged_by_commit.append({"commit": info(sha), "changes": changes_here, "swaps": _swaps(changes_here)})
    return {"schema": SCHEMA, "range": {"good": commits[0], "bad": commits[-1], "commits": len(commits) - 1},
            "confidence": reports[0].confidence if reports else None,
            "bump_width": reports[0].bump_width if reports else None,
            "quiet_scan": reports[0].quiet_scan if reports else None,
            "expected_changes": reports[0].expected_changes if reports else None, "by_commit": merged_by_commit,
            "cells": rows}


# ---- text -----------------------------------------------------------------------------------

def _pct(p: float) -> str:
    return ">99.99%" if p > 0.9999 else f"{100 * p:.2f}%"


def _commit(c: dict[str, Any]) -> str:
    pr = f" (#{c['pr']})" if c.get("pr") and f"#{c['pr']}" not in c["subject"] else ""
    return f"{c['short']} {c['subject']}{pr}"


def _r(r: dict[str, Any]) -> str:
    return f"{100 * r['rate']:.1f}% [{100 * r['low']:.1f}–{100 * r['high']:.1f}%] ({r['failures']}/{r['samples']})"


def _change(ch: dict[str, Any]) -> str:
    where = _commit(ch["commit"]) if ch["located"] else \
        f"somewhere in {ch['n_candidates']} commits {ch['candidates'][0]['short']}..{ch['candidates'][-1]['short']}"
    sure = f"confidence {_pct(ch['confidence'])}" + ("" if ch["found"] else ", not settled")
    lines = [f"  {ch['direction']:<10} {where}",
             f"             {ch['mode']}: {_r(ch['before'])} -> {_r(ch['after'])}; {sure}"]
    if ch["located"] and ch["n_candidates"] > 1:
        lines.append("             or an untestable commit right before it: "
                     + ", ".join(c["short"] for c in ch["candidates"][:-1]))
    if ch["fixed_by"]:
        lines.append(f"             fixed later in the range by {ch['fixed_by'][:10]}")
    if ch["fixes"]:
        lines.append(f"             fixes the regression of {ch['fixes'][:10]}")
    return "\n".join(lines)


def _seen_text(seen: dict[str, Any] | None) -> str:
    if not seen or not seen.get("samples"):
        return "none seen"
    return f"{seen['failures']}/{seen['samples']} ({100 * seen['failures'] / seen['samples']:.1f}%)"


def _unseen(cell: Mapping[str, Any], scanned: int | None) -> str:
    """What the probes leave open whatever the ends show: a regression fixed again between two of them."""
    w = cell.get("widest_unprobed")
    if not w:
        return ""
    return (f"; a regression fixed again within {w} commit{'' if w == 1 else 's'} could lie between two "
            "probed ones" + ("" if scanned else f" ({_scan_hint(cell.get('bump_scan'))})"))


def _scan_hint(quote: Mapping[str, Any] | None) -> str:
    if not quote or not quote.get("server_starts"):
        return "--bumps N probes every N commits"
    w, k = quote["width"], quote["server_starts"]
    return (f"--bumps {w} probes every {w} commits: about {k} more server start{'' if k == 1 else 's'}, "
            f"{quote['gpu_seconds'] / 3600:.1f} GPU-h")


def _no_change(cell: dict[str, Any], confidence: float, scanned: int | None = None) -> str:
    """No change was located. Said flatly only when every failing mode's P(no change) reached the
    target: the search stops looking once a change is under `explore` likely, short of it, and a
    mode that varies between server starts can hide a small change below that."""
    short = [m for m in cell["modes"] if m["fails_at_bad"] and m["no_change"] < confidence]
    if not short:
        # The model's "no change" is none of at least SAME_WITHIN: a smaller step is below what it resolves.
        return (f"  no change in the range (none of {SAME_WITHIN:g}x or more in the odds of failing)"
                + _unseen(cell, scanned))
    return "  no change located in the range; " + "; ".join(
        f"P(no change) {_pct(m['no_change'])} for {m['mode']} ("
        + ", ".join([f"{_seen_text(m.get(f'observed_at_{end}'))} failed at {end}" for end in ("good", "bad")]
                    + (["its rate varies between server starts"] if (m.get("rho") or 0) > 0.02 else [])) + ")"
        for m in short) \
        + f", short of the {_pct(confidence)} target"


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"), default=str)


def compact_cells(settings: Sequence[Mapping[str, Any]]) -> str:
    """Cells on one line: the settings they share once, then what varies. When the cells are every
    combination of the varying values, `axis∈{a, b}` per axis; else each cell's varying settings."""
    if not settings:
        return "no cell"
    axes = list(dict.fromkeys(k for c in settings for k in c))
    values = {a: sorted(dict.fromkeys(_value(c.get(a, "unset")) for c in settings)) for a in axes}
    fixed = [f"{a}={vs[0]}" for a, vs in values.items() if len(vs) == 1]
    varying = [a for a, vs in values.items() if len(vs) > 1]
    n = len(settings)
    if not varying:
        return " ".join(fixed) or "(the only cell)"
    combos = {tuple(_value(c.get(a, "unset")) for a in varying) for c in settings}
    product = math.prod(len(values[a]) for a in varying)
    if len(combos) == n == product:
        parts = [f"{a}∈{{{', '.join(values[a])}}}" for a in varying]
    else:
        parts = ["{" + "; ".join(" ".join(f"{a}={v}" for a, v in zip(varying, combo, strict=True))
                                 for combo in sorted(combos)) + "}"]
    return f"{n} cells: " + " ".join([*fixed, *parts])


def _cells_of(ch: Mapping[str, Any]) -> str:
    settings = ch.get("settings")
    if settings:
        return compact_cells(settings)
    return f"{len(ch['cells'])} cell(s): " + "; ".join(ch["cells"])  # an older bisect.json


def _pooled(seen: Mapping[str, Any] | None) -> str:
    return _seen_text(dict(seen)) if seen else "?"


def _by_change(summary: Mapping[str, Any]) -> list[str]:
    """Every change found, newest commit first, each with the cells it changed listed compactly."""
    out = ["Changes by commit (newest first):"]
    for entry in summary["by_commit"]:
        out.append(f"  {_commit(entry['commit'])}")
        for ch in entry["changes"]:
            rates = f": {_pooled(ch.get('before'))} -> {_pooled(ch.get('after'))} failed" if ch.get("before") else ""
            out.append(f"    {ch['direction']} of {ch['mode']}{rates}, confidence {_pct(ch['confidence'])}")
            out.append(f"      {_cells_of(ch)}")
        for sw in entry.get("swaps") or []:
            out.append(f"    a swap, not a fix: it ends {sw['fixed']} but brings {sw['brought']} in "
                       f"{len(sw['cells'])} cell(s), which still fail")
    return out


def _still_failing(summary: Mapping[str, Any]) -> list[str]:
    """What fails at bad, by mode: its cells and the change that brought it."""
    by_mode: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = defaultdict(list)
    for cell in summary["cells"]:
        for f in cell["failing_at_bad"]:
            by_mode[f["mode"]].append((cell, f))
    if not by_mode:
        return []
    out = ["Fails at bad:"]
    for mode, found in by_mode.items():
        started = {f["started"]["commit"]["short"]: f["started"] for _, f in found if f["started"]}
        where = "; ".join(f"started at {_commit(ch['commit'])}" if ch["located"] else
                          f"started in {ch['n_candidates']} commits {ch['candidates'][0]['short']}.."
                          f"{ch['candidates'][-1]['short']}" for ch in started.values())
        if any(f["before_good"] for _, f in found):
            where = "; ".join(x for x in (where, "fails at good too: it started before the range (try --widen)") if x)
        out.append(f"  {mode}: {compact_cells([c['cell'] for c, _ in found])}")
        out.append(f"    {where or 'where it started is undecided'}")
    return out


def _search_notes(cell: Mapping[str, Any], *, budget_spent: bool = False) -> list[str]:
    """What the search could not settle in a cell: a drift instead of a change, a limit reached, a
    mode still undecided (with what deciding would cost). Said the same in both views."""
    out = [f"the rate of {m['mode']} drifts between {d['first'][:12]} and {d['last'][:12]} "
           f"({100 * d['rate_from']:.1f}% to {100 * d['rate_to']:.1f}%), not a change at one commit"
           for m in cell["modes"] for d in m.get("drifts", [])]
    if not cell["done"]:
        out.append(f"stopped at a limit with {cell['open']} open question(s): "
                   + ("raise --budget" if budget_spent else "raise --max-samples"))
    undecided = [m["mode"] for m in cell["modes"] if not m.get("decided", True)]
    if undecided and cell.get("to_decide_gpu_seconds"):
        out.append(f"undecided for {', '.join(undecided)}: about {cell['to_decide_gpu_seconds'] / 3600:.1f} "
                   "GPU-hours more would decide")
    return out


def _cell_notes(cell: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    """What the grouped view does not say about a cell: an endpoint that passes or could not be
    tested, no change located, a search stopped at a limit."""
    out = []
    state = cell["bad_endpoint"]
    if state == BadEndpoint.PASSES.value:
        out.append(f"the bad endpoint passes: {_PASSES}{_unseen(cell, summary.get('bump_width'))}")
    elif state == BadEndpoint.UNTESTABLE.value:
        out.append("the bad endpoint is untestable: " + "; ".join(r for s, r in cell["skipped"]
                                                                  if s == summary["range"]["bad"]))
    elif state == BadEndpoint.UNDECIDED.value:
        out.append("the bad endpoint showed no failure, but too few samples to say it passes")
    if not cell["changes"] and state == BadEndpoint.FAILS.value:
        out.append(_no_change(dict(cell), summary.get("confidence") or 0.99, summary.get("bump_width")).strip())
    unsettled = [ch for ch in cell["changes"] if not ch["found"]]
    for ch in unsettled:
        out.extend(line.strip() for line in _change(ch).splitlines()[:2])
    out.extend(_search_notes(cell, budget_spent=_budget_spent(summary)))
    if cell["skipped"]:
        out.append(f"{len(cell['skipped'])} untestable commit(s): "
                   + "; ".join(f"{sha[:10]} ({why})" for sha, why in cell["skipped"][:3]))
    return out


def _reused(summary: Mapping[str, Any]) -> str | None:
    starts = summary.get("reused_starts") or []
    if not starts:
        return None
    runs: dict[str, set[str]] = defaultdict(set)
    for st in starts:
        runs[st["run_id"]].add(st["commit"][:10])
    return "reused " + "; ".join(f"{sum(1 for st in starts if st['run_id'] == r)} stored server start(s) of run {r} "
                                 f"(at {', '.join(sorted(shas))})" for r, shas in runs.items()) \
        + " before probing; the endpoints get two starts each (one cannot tell a change from start-to-start variation)"


def next_steps(summary: Mapping[str, Any]) -> list[str]:
    """One `sweep report --issue` command per change found: the bug report for it."""
    run = summary.get("issue_run") or summary.get("run_id")
    if not run:
        return []
    changes: dict[str, list[str]] = defaultdict(list)  # one report per mode, naming each of its changes
    for entry in summary["by_commit"]:
        for ch in entry["changes"]:
            changes[ch["mode"]].append(f"{ch['direction']} at {entry['commit']['short']}")
    out = [f"  {shlex.join(['sweep', 'report', str(run), '--issue', '--mode', mode])}   # {', '.join(where)}"
           for mode, where in changes.items()]
    return ["Next: a bug report per change:", *out] if out else []


def render(summary: dict[str, Any]) -> str:
    """The report as plain text. Several cells: every change grouped by commit with its cells listed
    compactly, what still fails at bad, notes per cell only where there is more to say. One cell:
    what fails at bad and where it started, then every change. Both end with the next step."""
    cells = summary["cells"]
    if len(cells) <= 1:
        return _render_one(summary)
    out: list[str] = []
    if summary["by_commit"]:
        out += [*_by_change(summary), ""]
    else:
        out += ["No change found in the range in any of the cells.", ""]
    failing = _still_failing(summary)
    if failing:
        out += [*failing, ""]
    notes = [(c, _cell_notes(c, summary)) for c in cells]
    if any(n for _, n in notes):
        out.append("Per cell:")
        for cell, lines in notes:
            if lines:
                out.append(f"  {cell['label']}:")
                out.extend(f"    {line}" for line in lines)
        out.append("")
    out += _closing(summary)
    return "\n".join(out)


def _closing(summary: Mapping[str, Any]) -> list[str]:
    starts, rounds = summary.get("server_starts", 0), summary.get("rounds", 0)
    out = [(f"{summary['range']['commits']} commits after good; {starts} server start{'' if starts == 1 else 's'} in "
            f"{rounds} round{'' if rounds == 1 else 's'}, {summary.get('reused_samples', 0)} stored samples reused, "
            f"{summary.get('gpu_seconds', 0.0):.0f} GPU-seconds")]
    reused = _reused(summary)
    if reused:
        out.append(reused)
    expected = summary.get("expected_changes")
    if expected is not None and expected != 1:
        # Said because it moves every probability in the report: the prior is part of the claim.
        out.append(f"searched expecting {expected:g} changes per mode over the range (--expect-changes)")
    budget = summary.get("budget")
    if budget:
        out.append(f"budget {budget['gpu_hours']:g} GPU-h, {budget['spent_gpu_hours']:.2f} spent"
                   + ("; the next round was priced past what was left and not started: what is open stays "
                      "undecided (raise --budget, or --resume with a larger one)" if budget["exhausted"] else ""))
    return out + next_steps(summary)


def _budget_spent(summary: Mapping[str, Any]) -> bool:
    return bool((summary.get("budget") or {}).get("exhausted"))


def _render_one(summary: dict[str, Any]) -> str:
    """The report of a single cell: what fails at bad and where it started, then every change."""
    out: list[str] = []
    for cell in summary["cells"]:
        out.append(f"cell {cell['label']}:" if cell["label"] != "(the only cell)" else "the cell:")
        state = cell["bad_endpoint"]
        if state == BadEndpoint.PASSES.value:
            out.append(f"  the bad endpoint passes: {_PASSES}{_unseen(cell, summary.get('bump_width'))}")
        elif state == BadEndpoint.UNTESTABLE.value:
            out.append("  the bad endpoint is untestable: " + "; ".join(r for s, r in cell["skipped"]
                                                                       if s == summary["range"]["bad"]))
        elif state == BadEndpoint.UNDECIDED.value:
            out.append("  the bad endpoint showed no failure, but too few samples to say it passes")
        if cell["failing_at_bad"]:
            out.append("  fails at bad:")
            for f in cell["failing_at_bad"]:
                seen = next((m.get("observed_at_bad") for m in cell["modes"] if m["mode"] == f["mode"]), None)
                pooled = seen and seen["samples"] != f["rate"]["samples"]
                out.append(f"    {f['mode']}: {_r(f['rate'])}"
                           + (f" over the commits pooled with bad; at bad itself {_seen_text(seen)}" if pooled else ""))
                if f["started"]:
                    ch = f["started"]
                    where = _commit(ch["commit"]) if ch["located"] else f"in {ch['n_candidates']} commits " \
                        f"{ch['candidates'][0]['short']}..{ch['candidates'][-1]['short']}"
                    out.append(f"      started at {where} (confidence {_pct(ch['confidence'])})")
                elif f["before_good"]:
                    seen = next((m.get("observed_at_good") for m in cell["modes"] if m["mode"] == f["mode"]), None)
                    out.append("      fails at good too" + (f", {_seen_text(seen)}" if seen else "")
                               + ": it started before the range (try --widen)")
                else:
                    out.append("      where it started is undecided")
        if cell["changes"]:
            out.append("  every change in the range (oldest first):")
            out.extend(_change(ch) for ch in cell["changes"])
        elif state == BadEndpoint.FAILS.value:
            out.append(_no_change(cell, summary.get("confidence") or 0.99, summary.get("bump_width")))
        for entry in summary["by_commit"]:
            for sw in entry.get("swaps") or []:
                out.append(f"  {_commit(entry['commit'])} is a swap, not a fix: it ends {sw['fixed']} "
                           f"but brings {sw['brought']}; the cell still fails")
        out.extend(f"  {line}" for line in _search_notes(cell, budget_spent=_budget_spent(summary)))
        out.append(f"  {cell['probes']} probes, {cell['samples']} samples"
                   + (f", {len(cell['skipped'])} untestable commit(s)" if cell["skipped"] else ""))
    out += _closing(summary)
    return "\n".join(out)
