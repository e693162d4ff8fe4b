"""Calibration, coverage and cost of `sweeper.bisect.Search` on independently generated histories.

    .venv/bin/python benchmarks/bisect_calibration.py --histories 500 --json /tmp/bisect-new.json
    .venv/bin/python benchmarks/bisect_calibration.py --old /tmp/sweep-old --json /tmp/bisect-old.json
    .venv/bin/python benchmarks/bisect_calibration.py --compare /tmp/bisect-old.json ...

Histories come from `benchmarks/histories.py`, which shares no code and no parameter choices
with the search. Each family gets `--histories` histories, the same ones at every K; one
probe is one server start whose per-mode rates vary with the family's ICC.

A reported change is right when a true change of the same mode and direction has its
commit among the change's candidates. Printed as markdown:

- calibration: among changes reported at confidence >= c (0.9, 0.99), the fraction right,
  with a Wilson 95 % interval, flagged when the interval lies below c;
- coverage: the fraction of true changes reported right at confidence >= 0.99, by family,
  by change role and by effect size (the smaller ratio of the rates on either side);
- cost: mean probes (server starts), rounds and samples, and with `--compare` the same
  figures of an earlier run (e.g. the single-mode search, `--old`) and the searches' computing time
  against it;
- the rounds of a single step 0.01 -> 0.1 over N = 200 at K = 4;
- a few wrong or missed histories per family, with what was reported.

`--src PATH` imports the search from another checkout, e.g. a worktree of the commit being
measured (one with the `SearchOptions` / `ask` / `tell` API). `--old PATH` drives the single-mode search of another checkout (the API before failure
modes: `record(commit, failures, samples)`, one culprit per result) on the single-mode
families, counting a failure of any mode as a failure; its culprit counts as a reported
regression of whichever mode.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from histories import DRIFT, FAMILIES, SINGLE_MODE, History, fixed_step

STEP_LINE = "step 0.01→0.1, N=200"
ROUND_GUARD = 10_000  # a search still asking after this many rounds is counted as stuck
# GPU-seconds of one server start and one request: the preinstalled install kind's stated profile
# (sweeper/install/preinstalled.py), on one GPU; installs are left out (one per commit either way).
START_S, REQUEST_S = 240.0, 2.0
_OLD: str | None = None
_OPTIONS: dict = {}  # SearchOptions fields other than their defaults (--search)
_DEADLINE: float | None = None  # seconds a search may compute before it is recorded as unfinished (--deadline)


def _init(old: str | None, src: str | None, options: dict | None = None, deadline: float | None = None) -> None:
    global _OLD, _OPTIONS, _DEADLINE
    _OLD = old
    _OPTIONS = dict(options or {})
    _DEADLINE = deadline
    path = old or src
    if path:
        sys.path.insert(0, path)
        import sweeper

        where = Path(sweeper.__file__).resolve()
        if not where.is_relative_to(Path(path).resolve()):
            raise SystemExit(f"{path}: imported sweeper from {where}")


def make_history(family: str, i: int, seed: int) -> History:
    if family == STEP_LINE:
        rng = np.random.default_rng([seed, 99, i])
        return fixed_step(200, int(rng.integers(1, 201)), 0.01, 0.1)
    fam = list(FAMILIES).index(family)
    return FAMILIES[family](np.random.default_rng([seed, fam, i]))


def _value(x: object) -> str:
    return str(getattr(x, "value", x))


def _run_new(h: History, k: int, rng: np.random.Generator, confidence: float,
             max_samples: int | None) -> dict:
    from sweeper.bisect import Search, SearchOptions

    s = Search(h.commits, SearchOptions(confidence=confidence, max_samples=max_samples, **_OPTIONS))
    index = {c: i for i, c in enumerate(h.commits)}
    loops, too_many = 0, 0
    t0 = time.perf_counter()
    while not s.done:
        reqs = s.ask(k)
        if not reqs:
            break
        loops += 1
        if loops > ROUND_GUARD:
            return {"error": "stuck"}
        if _DEADLINE is not None and time.perf_counter() - t0 > _DEADLINE:
            # Counted apart: a part of a long run ends when its slowest search does.
            return {"error": f"unfinished: still searching after {_DEADLINE:.0f} s", "unfinished_rounds": s.rounds}
        too_many += len(reqs) > k
        for r in reqs:
            i = index[r.commit]
            if i in h.untestable:
                s.tell_skip(r.commit, "untestable")
            else:
                s.tell(r.commit, r.samples, h.probe(rng, i, r.samples))
    rep = s.result()
    changes = [{"mode": c.mode, "direction": _value(c.direction), "candidates": list(c.candidates),
                "confidence": float(c.confidence), "located": bool(c.located)} for c in rep.changes]
    # A mode's P(no change) is a claim too: "nothing changed" where something did is a miss
    # the search vouched for, unlike a mode it never saw fail.
    modes = [{"mode": m.mode, "no_change": float(m.no_change)} for m in rep.modes]
    drifts = [{"mode": m.mode, "first": d.first, "last": d.last}
              for m in rep.modes for d in getattr(m, "drifts", ())]
    # The commits that got a server start: what tells a change missed between two probes (`_miss_causes`).
    probed = sorted({index[o.commit] for o in s.observations if o.skip_reason is None and o.samples})
    # What a scan at width 3 would add to these probes, before anything it finds asks for more.
    quote = getattr(rep, "scan_quote", None)
    return {"changes": changes, "drifts": drifts, "probed": probed, "scan_quote_s": float(quote[2]) if quote else 0.0,
            "to_decide_s": float(getattr(rep, "to_decide_s", 0.0) or 0.0), "rounds": rep.rounds, "probes": rep.probes, "samples": rep.samples,
            "verdict": _value(rep.bad_endpoint), "done": bool(rep.done), "modes": modes, "over_k": too_many}


def _run_old(h: History, k: int, rng: np.random.Generator, confidence: float,
             max_samples: int | None) -> dict:
    from sweeper.bisect import Search

    # The search of another checkout, with the API from before failure modes.
    s: Any = Search(h.commits, confidence=confidence, max_samples=max_samples)
    index = {c: i for i, c in enumerate(h.commits)}
    loops = 0
    while not s.done:
        reqs = s.next_probes(k)
        if not reqs:
            break
        loops += 1
        if loops > ROUND_GUARD:
            return {"error": "stuck"}
        for r in reqs:
            i = index[r.commit]
            if i in h.untestable:
                s.record_skip(r.commit, "untestable")
            else:
                # Today's simulator honours the early stop, so its cost figures do too.
                failures, samples = h.probe_any(rng, i, r.samples, r.stop_after_failures)
                s.record(r.commit, failures, samples)
    res = s.result()
    kind = res.kind.name
    changes = []
    if kind in ("CULPRIT", "UNDECIDED") and res.culprit is not None:
        changes.append({"mode": None, "direction": "regression", "candidates": list(res.candidates),
                        "confidence": float(res.confidence), "located": kind == "CULPRIT"})
    issue = res.endpoint_issue.name if res.endpoint_issue is not None else None
    return {"changes": changes, "rounds": res.rounds, "probes": res.probes, "samples": res.samples,
            "verdict": kind if issue is None else f"{kind}/{issue}", "over_k": 0}


def run_one(task: tuple[str, int, int, int, float, int | None]) -> dict:
    family, i, k, seed, confidence, max_samples = task
    h = make_history(family, i, seed)
    rng = np.random.default_rng([seed, 7, list(FAMILIES).index(family) if family in FAMILIES else 99, i, k])
    t0 = time.perf_counter()
    try:
        out = (_run_old if _OLD else _run_new)(h, k, rng, confidence, max_samples)
    except Exception:  # noqa: BLE001 -- one broken search should not lose the whole run
        out = {"error": traceback.format_exc(limit=3)}
    out.update(family=family, i=i, k=k, secs=time.perf_counter() - t0, params=h.params,
               truth=[[c.mode, c.index, c.direction] for c in h.truth],
               untestable=len(h.untestable), n=h.n)
    return out


# ---- scoring -----------------------------------------------------------------------------


def _is_right(change: dict, truth: list) -> bool:
    cands = set(change["candidates"])
    return any((change["mode"] is None or change["mode"] == mode) and change["direction"] == d
               and f"c{j}" in cands for mode, j, d in truth)


def _covered(t: list, changes: list[dict], c: float = 0.99) -> bool:
    return any(ch["confidence"] >= c and _is_right(ch, [t]) for ch in changes)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _calib(rows: list[dict], c: float) -> tuple[str, str]:
    picked = [ch for r in rows for ch in r["changes"] if ch["confidence"] >= c]
    if not picked:
        return "0", "-"
    good = sum(_is_right(ch, r["truth"]) for r in rows for ch in r["changes"] if ch["confidence"] >= c)
    lo, hi = wilson(good, len(picked))
    flag = " **below**" if hi < c else ""
    return str(len(picked)), f"{good / len(picked):.1%} [{lo:.1%}, {hi:.1%}]{flag}"


def _coverage(rows: list[dict]) -> tuple[int, int]:
    total = sum(len(r["truth"]) for r in rows)
    hit = sum(_covered(t, r["changes"]) for r in rows for t in r["truth"])
    return hit, total


def _cov_str(hit: int, total: int, target: float | None = None) -> str:
    if total == 0:
        return "-"
    flag = " **<95%**" if target is not None and hit / total < target else ""
    return f"{hit / total:.1%} ({hit}/{total}){flag}"


def _role(t: list, truth: list) -> str:
    """'A regression', 'A fix', 'B regression': modes lettered by first change."""
    letters: dict[str, str] = {}
    for mode, _, _ in truth:
        letters.setdefault(mode, "AB"[len(letters)] if len(letters) < 2 else "?")
    return f"{letters[t[0]]} {t[2]}"


def _ratio_bin(r: float) -> str:
    for hi, name in ((1.5, "1.3–1.5×"), (2, "1.5–2×"), (4, "2–4×"), (10, "4–10×")):
        if r < hi:
            return name
    return "≥10× or from 0"


def _cost(rows: list[dict]) -> tuple[float, float, float]:
    return (float(np.mean([r["probes"] for r in rows])), float(np.mean([r["rounds"] for r in rows])),
            float(np.mean([r["samples"] for r in rows])))


def _fmt_change(ch: dict) -> str:
    cands = ch["candidates"]
    shown = ",".join(cands) if len(cands) <= 4 else f"{cands[0]}..{cands[-1]} ({len(cands)})"
    return f"{ch['mode']} {ch['direction']} at [{shown}] conf {ch['confidence']:.4f}" + \
        ("" if ch["located"] else " (not located)")


def _fmt_params(p: dict) -> str:
    def f(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, (list, tuple)):
            return "(" + ", ".join(f(x) for x in v) + ")"
        return str(v)
    return ", ".join(f"{k}={f(v)}" for k, v in p.items())


def gpu_s(r: dict) -> float:
    return START_S * r["probes"] + REQUEST_S * r["samples"]


def _drift_flagged(r: dict) -> bool:
    """A drift reported over commits that overlap the true ramp (any drift, outside DRIFT families)."""
    if r["family"] not in DRIFT:
        return bool(r.get("drifts"))
    a, w = int(r["params"]["a"]), int(r["params"]["width"])
    return any(int(d["first"][1:]) <= a + w and int(d["last"][1:]) >= a - 1 for d in r.get("drifts", []))


def _bar(by: dict, families: list[str], ks: tuple[int, ...]) -> None:
    """The figures the issue of small changes, bumps and drift is judged by, per family and K."""
    print("\n### Power, drift and GPU cost\n")
    print("| family | K | runs | right ≥0.99 [95% CI] | coverage ≥0.99 | drift flagged | regression claims ≥0.99 "
          "per run | undecided | median GPU-h per run | median GPU-s per change found |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fam in families:
        for k in ks:
            rows = by.get((fam, k), [])
            if not rows:
                continue
            _, r99 = _calib(rows, 0.99)
            cov = "–" if fam in DRIFT else _cov_str(*_coverage(rows))
            flagged = np.mean([_drift_flagged(r) for r in rows])
            claims = np.mean([sum(ch["confidence"] >= 0.99 and ch["direction"] == "regression"
                                  for ch in r["changes"]) for r in rows])
            undecided = np.mean([not r.get("done", True) for r in rows])
            per_found = [gpu_s(r) / f for r in rows
                         if (f := sum(_covered(t, r["changes"]) for t in r["truth"]))]
            med = f"{np.median(per_found):,.0f}" if per_found and fam not in DRIFT else "–"
            print(f"| {fam} | {k} | {len(rows)} | {r99} | {cov} | {flagged:.1%} | {claims:.2f} | {undecided:.1%} | "
                  f"{np.median([gpu_s(r) for r in rows]) / 3600:.1f} | {med} |")
    if "short bump" in families:
        for k in ks:
            rows = [r for r in by.get(("short bump", k), []) if int(r["params"]["width"]) >= 3]
            both = [all(_covered(t, r["changes"]) for t in r["truth"]) for r in rows]
            if rows:
                print(f"\nshort bumps of width ≥ 3, K={k}: both changes found in {np.mean(both):.1%} ({sum(both)}/{len(rows)})")
    for k in ks:
        rows = by.get(("small step", k), [])
        for name, lo, hi in (("1.3–1.5×", 1.3, 1.5), ("1.5–2×", 1.5, 2.0)):
            pick = [r for r in rows if lo <= float(r["params"]["ratio"]) < hi]
            if pick:
                print(f"\nsmall steps of {name}, K={k}: found in {_cov_str(*_coverage(pick))}")
    for fam in ("rise and fix",):
        for k in ks:
            rows = by.get((fam, k), [])
            both = [all(_covered(t, r["changes"]) for t in r["truth"] if t[0] == r["truth"][0][0]) for r in rows]
            if rows:
                print(f"\n{fam}, K={k}: rise and its fix both found in {np.mean(both):.1%} ({sum(both)}/{len(rows)})")


def _miss_cause(t: list, r: dict) -> str:
    """Why a true change was missed: 'no probe inside' where a rate it bounds lies between two other
    true changes of its mode (a bump, a dip, the middle of three changes) and no commit of that rate
    got a start, so no split could have seen it; 'mode never seen' where its mode never failed in any
    probe; 'probed, not located' otherwise."""
    mode, j, _ = t
    if mode not in {m["mode"] for m in r.get("modes", [])}:
        return "mode never seen"
    at = sorted(x for m, x, _ in r["truth"] if m == mode)
    k = at.index(j)
    probed = set(r["probed"])
    # The rates on either side of the change: [at[k-1], j) and [j, at[k+1]); an outer one holds an end.
    inner = [(at[k - 1], j)] if k > 0 else []
    inner += [(j, at[k + 1])] if k + 1 < len(at) else []
    if any(not any(lo <= x < hi for x in probed) for lo, hi in inner):
        return "no probe inside"
    return "probed, not located"


def _miss_causes(by: dict, families: list[str], ks: tuple[int, ...]) -> None:
    """The missed changes of the families with several changes in a mode, by `_miss_cause`."""
    picked = [f for f in families if f in ("three changes", "rise and fix", "rise and partial fix", "short bump",
                                            "one-commit blip")]
    if not any("probed" in r for f in picked for k in ks for r in by.get((f, k), [])):
        return  # runs recorded before the probed commits were
    print("\n### Missed changes by cause (families with several changes in a mode)\n")
    print("\"No probe inside\": a rate the change bounds lies between two other changes of its mode and no "
          "commit of it got a start. Only a probe there (a scan) can find such a change.\n")
    print("The last column prices what finds them: the scan at width 3 (`--bumps 3`) the report quotes, "
          "its starts alone, before anything they find asks for more; mean GPU-hours per history.\n")
    print("| family | K | changes | missed | no probe inside | mode never seen | probed, not located "
          "| mean GPU-h per history: the search, + the scan |")
    print("|---|---|---|---|---|---|---|---|")
    for fam in picked:
        for k in ks:
            rows = [r for r in by.get((fam, k), []) if "probed" in r]
            causes = [_miss_cause(t, r) for r in rows for t in r["truth"] if not _covered(t, r["changes"])]
            total = sum(len(r["truth"]) for r in rows)
            if rows:
                cells = " | ".join(str(causes.count(c)) for c in ("no probe inside", "mode never seen",
                                                                  "probed, not located"))
                search_h = float(np.mean([gpu_s(r) for r in rows])) / 3600
                scan_h = float(np.mean([r.get("scan_quote_s", 0.0) for r in rows])) / 3600
                print(f"| {fam} | {k} | {total} | {len(causes)} | {cells} | {search_h:.2f} + {scan_h:.2f} "
                      f"({(search_h + scan_h) / search_h:.2f}x) |")


def _per_found(r: dict) -> float | None:
    """GPU-seconds of a search per true change it found at ≥ 0.99 (None: it found none)."""
    found = sum(_covered(t, r["changes"]) for t in r["truth"])
    return gpu_s(r) / found if found else None


def _pairs(by: dict, cby: dict, fam: str, k: int) -> list[tuple[dict, dict]]:
    """(earlier, now) records of the histories of (fam, k) that both runs searched."""
    now = {r["i"]: r for r in by.get((fam, k), [])}
    return [(o, now[o["i"]]) for o in cby.get((fam, k), []) if o["i"] in now]


def _paired_cost(by: dict, cby: dict, families: list[str], ks: tuple[int, ...]) -> None:
    """GPU-seconds per change found, now against the earlier run, on the histories where the earlier
    run found a change (the issue's bar: the median now at most 1.5x the earlier one there)."""
    print("\n### GPU-seconds per change found, where the earlier run found one (paired histories)\n")
    print("The last two columns are over every history both runs searched, found or not: what a bisect "
          "costs on average, and how many searches are the same (probes and samples alike).\n")
    print("| family | K | histories | earlier median | now median | ratio | now found none there "
          "| mean GPU-h per history: earlier → now | the same search |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fam in families:
        for k in ks:
            both = _pairs(by, cby, fam, k)
            pairs = [(_per_found(o), _per_found(n)) for o, n in both if _per_found(o) is not None]
            if not both:
                continue
            mean_before = float(np.mean([gpu_s(o) for o, _ in both])) / 3600
            mean_after = float(np.mean([gpu_s(n) for _, n in both])) / 3600
            same = sum((o["probes"], o["samples"]) == (n["probes"], n["samples"]) for o, n in both)
            means = f"{mean_before:.2f} → {mean_after:.2f} ({mean_after / mean_before:.2f}x) | {same} of {len(both)}"
            if not pairs:
                print(f"| {fam} | {k} | 0 | – | – | – | – | {means} |")
                continue
            before = float(np.median([b for b, _ in pairs]))
            # A history the earlier run found a change in and this one found none costs "infinitely".
            found = [a for _, a in pairs if a is not None]
            after = float(np.median([math.inf if a is None else a for _, a in pairs]))
            print(f"| {fam} | {k} | {len(pairs)} | {before:,.0f} | {after:,.0f} | {after / before:.2f}x | "
                  f"{len(pairs) - len(found)} | {means} |")


def _paired_computing(by: dict, cby: dict, families: list[str], ks: tuple[int, ...]) -> None:
    """The search's own computing time (seconds of one process per search), now against the earlier
    run, on the histories both searched: a ratio only where the two ran on one machine under one load
    (side by side, or one after the other on an idle machine)."""
    print("\n### Computing time of the searches, paired histories (one process's seconds per search)\n")
    print("| family | K | histories | earlier total s | now total s | earlier / now | median of per-search ratios |")
    print("|---|---|---|---|---|---|---|")
    for fam in families:
        for k in ks:
            both = [(o["secs"], n["secs"]) for o, n in _pairs(by, cby, fam, k)]
            if not both:
                continue
            before, after = sum(b for b, _ in both), sum(a for _, a in both)
            ratio = float(np.median([b / a for b, a in both if a > 0]))
            print(f"| {fam} | {k} | {len(both)} | {before:,.0f} | {after:,.0f} | {before / after:.2f}x | {ratio:.2f}x |")


def report(results: list[dict], args: argparse.Namespace, elapsed: float, compare: list[dict] | None) -> None:
    ok = [r for r in results if "error" not in r]
    errors = [r for r in results if "error" in r]
    by = defaultdict(list)
    for r in ok:
        by[(r["family"], r["k"])].append(r)
    families = [f for f in FAMILIES if any(f == fam for fam, _ in by)]
    what = f"old search at {args.old}" if args.old else f"sweeper.bisect.Search from {args.src or 'the install'}"
    ran = (f"{len(results)} searches read from {args.from_json}" if args.from_json
           else f"{len(results)} searches in {elapsed:.0f} s on {args.workers} processes")
    histories = (f"histories {args.only}" if args.only else f"histories {args.first}-{args.first + args.histories - 1}"
                 if args.first else f"{args.histories} histories")
    print(f"{what}: {histories} per family, K in {args.ks}, confidence {args.confidence}, "
          f"max_samples {args.max_samples}, seed {args.seed}; {ran}\n")
    unfinished = [r for r in errors if "unfinished_rounds" in r]
    errors = [r for r in errors if "unfinished_rounds" not in r]
    if unfinished:
        # Left out of every figure below: each is named so that a reader can count it as missed.
        print(f"**{len(unfinished)} searches unfinished at the deadline** (left out below): " + ", ".join(
            f"{r['family']} #{r['i']} (K={r['k']}, N={r['n']}, {r['unfinished_rounds']} rounds)"
            for r in unfinished) + "\n")
    if errors:
        print(f"**{len(errors)} searches failed**; first: family {errors[0]['family']} #{errors[0]['i']} "
              f"K={errors[0]['k']}:\n```\n{errors[0]['error']}\n```\n")
    over_k = sum(r.get("over_k", 0) for r in ok)
    if over_k:
        print(f"**{over_k} rounds asked for more than K probes**\n")

    print("### Calibration and cost\n")
    print("| family | K | runs | n ≥0.9 | right ≥0.9 [95% CI] | n ≥0.99 | right ≥0.99 [95% CI] "
          "| coverage ≥0.99 | probes | rounds | samples |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    multi = {"two steps", "rise and fix", "rise and partial fix", "two modes"}
    for fam in families:
        for k in args.ks:
            rows = by.get((fam, k), [])
            if not rows:
                continue
            n9, r9 = _calib(rows, 0.9)
            n99, r99 = _calib(rows, 0.99)
            hit, total = _coverage(rows)
            probes, rounds, samples = _cost(rows)
            print(f"| {fam} | {k} | {len(rows)} | {n9} | {r9} | {n99} | {r99} | "
                  f"{_cov_str(hit, total, 0.95 if fam in multi else None)} | "
                  f"{probes:.1f} | {rounds:.1f} | {samples:,.0f} |")
        if len(args.ks) > 1:
            # Calibration pooled over K: the same histories, independent probe draws.
            rows = [r for k in args.ks for r in by.get((fam, k), [])]
            n9, r9 = _calib(rows, 0.9)
            n99, r99 = _calib(rows, 0.99)
            print(f"| {fam} | all | {len(rows)} | {n9} | {r9} | {n99} | {r99} | "
                  f"{_cov_str(*_coverage(rows), 0.95 if fam in multi else None)} | | | |")

    if any("modes" in r for r in ok):
        print("\n### \"No change\" claims: modes the search saw fail and reported with P(no change) ≥ c\n")
        print("| family | n ≥0.9 | right ≥0.9 [95% CI] | n ≥0.99 | right ≥0.99 [95% CI] | modes never seen failing |")
        print("|---|---|---|---|---|---|")
        for fam in families:
            rows = [r for k in args.ks for r in by.get((fam, k), []) if "modes" in r]
            cells = []
            for c in (0.9, 0.99):
                claims = [not any(t[0] == m["mode"] for t in r["truth"])
                          for r in rows for m in r["modes"] if m["no_change"] >= c]
                lo, hi = wilson(sum(claims), len(claims))
                flag = " **below**" if claims and hi < c else ""
                cells += [str(len(claims)), f"{np.mean(claims):.1%} [{lo:.1%}, {hi:.1%}]{flag}" if claims else "-"]
            unseen = sum(1 for r in rows for m in {t[0] for t in r["truth"]}
                         if m not in {x["mode"] for x in r["modes"]})
            print(f"| {fam} | {' | '.join(cells)} | {unseen} |")

    if "no change" in families:
        print("\n`no change`: runs with no change reported at ≥ 0.9 — " + ", ".join(
            f"K={k}: {np.mean([not any(c['confidence'] >= 0.9 for c in r['changes']) for r in by[('no change', k)]]):.1%}"
            for k in args.ks if by.get(("no change", k))))

    print("\n### Coverage by change (all K)\n")
    print("| family | change | coverage ≥0.99 |")
    print("|---|---|---|")
    for fam in families:
        roles: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for k in args.ks:
            for r in by.get((fam, k), []):
                for t in r["truth"]:
                    key = _role(t, r["truth"])
                    roles[key][0] += _covered(t, r["changes"])
                    roles[key][1] += 1
        for key, (hit, total) in sorted(roles.items()):
            print(f"| {fam} | {key} | {_cov_str(hit, total)} |")

    print("\n### Coverage by effect size (smallest rate ratio in the history, all families, all K)\n")
    bins: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in ok:
        if "ratio" in r["params"]:
            hit, total = _coverage([r])
            b = bins[_ratio_bin(float(r["params"]["ratio"]))]
            b[0] += hit
            b[1] += total
    print("| ratio | coverage ≥0.99 |")
    print("|---|---|")
    for name in ("1.3–1.5×", "1.5–2×", "2–4×", "4–10×", "≥10× or from 0"):
        if name in bins:
            print(f"| {name} | {_cov_str(*bins[name])} |")

    _bar(by, families, args.ks)
    _miss_causes(by, families, args.ks)

    step = by.get((STEP_LINE, 4), [])
    if step:
        right = np.mean([any(ch["confidence"] >= 0.99 and _is_right(ch, r["truth"]) for ch in r["changes"])
                         for r in step])
        probes, rounds, samples = _cost(step)
        print(f"\n**Single step 0.01 → 0.1, N = 200, K = 4** ({len(step)} histories, culprit uniform): "
              f"mean rounds {rounds:.1f} (max {max(r['rounds'] for r in step)}), probes {probes:.1f}, "
              f"samples {samples:,.0f}, right at ≥ 0.99 {right:.1%}")

    if compare:
        # Paired: only the histories (same seed, family, index, K) this run also searched.
        ran = {(r["family"], r["i"], r["k"]) for r in ok}
        cby = defaultdict(list)
        for r in compare:
            if "error" not in r and (r["family"], r["i"], r["k"]) in ran:
                cby[(r["family"], r["k"])].append(r)
        print("\n### Cost and right answers next to the earlier run (`--compare`)\n")
        print("| family | K | earlier right ≥0.99 / coverage | now coverage | earlier probes / rounds / samples "
              "| now probes / rounds / samples |")
        print("|---|---|---|---|---|---|")
        for fam in [*families, STEP_LINE]:
            for k in args.ks:
                rows, old = by.get((fam, k), []), cby.get((fam, k), [])
                if not rows or not old:
                    continue
                o = _cost(old)
                n_ = _cost(rows)
                _, r99 = _calib(old, 0.99)
                print(f"| {fam} | {k} | {r99.split(' [')[0]} / {_cov_str(*_coverage(old))} | "
                      f"{_cov_str(*_coverage(rows))} | {o[0]:.1f} / {o[1]:.1f} / {o[2]:,.0f} | "
                      f"{n_[0]:.1f} / {n_[1]:.1f} / {n_[2]:,.0f} |")
        _paired_cost(by, cby, [*families, STEP_LINE], args.ks)
        _paired_computing(by, cby, [*families, STEP_LINE], args.ks)

    if args.old:
        print("\n### Verdicts of the old search (all K)\n")
        for fam in families:
            counts: dict[str, int] = defaultdict(int)
            for k in args.ks:
                for r in by.get((fam, k), []):
                    counts[r["verdict"]] += 1
            print(f"- {fam}: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items(), key=lambda x: -x[1])))

    if args.examples:
        print("\n### Examples: wrong at ≥ 0.99, or a true change missed (K = 4 where run)\n")
        k_ex = 4 if 4 in args.ks else args.ks[0]
        for fam in families:
            rows = by.get((fam, k_ex), [])
            wrong = [r for r in rows if any(ch["confidence"] >= 0.99 and not _is_right(ch, r["truth"])
                                            for ch in r["changes"])]
            missed = [r for r in rows if r not in wrong and any(not _covered(t, r["changes"]) for t in r["truth"])]
            for label, pick in (("wrong", wrong), ("missed", missed)):
                for r in pick[: args.examples]:
                    truth = "; ".join(f"{m} {d} at c{j}" for m, j, d in r["truth"]) or "none"
                    said = "; ".join(_fmt_change(ch) for ch in r["changes"]) or "nothing"
                    print(f"- {fam} #{r['i']} ({label}, {len(pick)} of {len(rows)}): {_fmt_params(r['params'])}, "
                          f"{r['untestable']} untestable. Truth: {truth}. Reported: {said}. "
                          f"{r['probes']} probes, {r['rounds']} rounds, {r['samples']:,} samples.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=500, help="histories per family")
    ap.add_argument("--first", type=int, default=0,
                    help="the first history's number: a long run split in parts (their --json files concatenated "
                         "and read back with --from-json) draws the same histories as one run")
    ap.add_argument("--only", default=None, metavar="I,J,...",
                    help="these history numbers only (instead of --first/--histories): e.g. the searches an "
                         "option can change, the others being the same draws and the same search")
    ap.add_argument("--ks", default="1,4,8", help="probes per round, comma-separated")
    ap.add_argument("--families", default=None, help="comma-separated subset of: " + ", ".join(FAMILIES).replace("%", "%%"))
    ap.add_argument("--step-line", type=int, default=200, help="histories for the 0.01->0.1 N=200 K=4 line")
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--old", default=None, help="checkout with the single-mode Search (single-mode families)")
    ap.add_argument("--src", default=None, help="import the search from this checkout (e.g. a worktree of "
                    "the commit being measured) instead of the installed one")
    ap.add_argument("--json", default=None, help="write every search's result here")
    ap.add_argument("--compare", default=None, help="a --json file of an earlier run to set the cost next to")
    ap.add_argument("--from-json", default=None, metavar="JSON",
                    help="report a --json file of an earlier run (with its arguments) instead of searching again")
    ap.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                    help="record a search still computing after this long as unfinished (listed with the failed ones)")
    ap.add_argument("--examples", type=int, default=3, help="wrong/missed histories shown per family")
    ap.add_argument("--search", action="append", default=[], metavar="KEY=VALUE",
                    help="a field of sweeper.bisect.SearchOptions other than its default (repeatable), e.g. "
                    "max_starts_per_commit=12 or explore=0.02")
    args = ap.parse_args()
    options = {}
    for item in args.search:
        key, _, value = item.partition("=")
        options[key] = json.loads(value)
    args.ks = tuple(int(x) for x in args.ks.split(","))
    families = [f.strip() for f in args.families.split(",")] if args.families else list(FAMILIES)
    if unknown := [f for f in families if f not in FAMILIES]:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    if args.old:
        families = [f for f in families if f in SINGLE_MODE]
    numbers = ([int(x) for x in args.only.split(",")] if args.only
               else list(range(args.first, args.first + args.histories)))
    tasks = [(fam, i, k, args.seed, args.confidence, args.max_samples)
             for fam in families for i in numbers for k in args.ks]
    if args.step_line and 4 in args.ks:
        tasks += [(STEP_LINE, i, 4, args.seed, args.confidence, args.max_samples) for i in range(args.step_line)]
    # Interleave families so progress and any slow family show early.
    order = np.random.default_rng(0).permutation(len(tasks))
    tasks = [tasks[j] for j in order]

    compare = json.loads(Path(args.compare).read_text()) if args.compare else None
    if args.from_json:
        results = [r for r in json.loads(Path(args.from_json).read_text()) if r["family"] in families or
                   r["family"] == STEP_LINE]
        report(results, args, 0.0, compare)
        return
    start = time.perf_counter()
    results = []
    with mp.Pool(args.workers, initializer=_init, initargs=(args.old, args.src, options, args.deadline)) as pool:
        for n, r in enumerate(pool.imap_unordered(run_one, tasks, chunksize=4), 1):
            results.append(r)
            if n % max(1, len(tasks) // 20) == 0:
                print(f"{n}/{len(tasks)} searches, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    elapsed = time.perf_counter() - start
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    report(results, args, elapsed, compare)


if __name__ == "__main__":
    main()
