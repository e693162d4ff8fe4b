"""The metric bisect (`sweeper.bisect.metric_search`) against Chromium Pinpoint's procedure
(`benchmarks/pinpoint.py`), on the same independently generated histories (`benchmarks/metric_histories.py`).

    .venv/bin/python benchmarks/metric_bisect.py --histories 500 --seed 1

Each family gets `--histories` histories; the search (K starts a round) and Pinpoint run on the same
history with their own draws of the starts. One start is one server start: `--start-s` GPU-seconds
(240, the failure bisect's profile). Both are told `--min-effect` (3 %): the search as its minimum
effect, Pinpoint as its comparison magnitude (min_effect times the good commit's median, in the
metric's unit, divided by the IQR as Pinpoint does).

Scoring. A claim is a change reported at confidence >= 0.99 (the search; located or not) or a culprit
(Pinpoint: adjacent commits compared DIFFERENT). It is right when a true change of the same direction is
among its commits (in a drift, any commit of the ramp). A true change of at least min_effect is found
when a claim located at its commit is right about it. GPU-hours per change found: all GPU-hours spent
on the family over all changes found. Printed: one markdown table (family, n, found, claims right with
the 95 % Wilson interval, GPU-h per change found for both, the ratio), then the bars, the drift flags,
the search's verdicts, and a few wrong or missed histories.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pinpoint
from metric_histories import DRIFT, FAMILIES, MetricHistory

START_S = 240.0
ROUND_GUARD = 2000
_ARGS: dict[str, Any] = {}


def _init(args: dict[str, Any], thresholds: dict[float, np.ndarray]) -> None:
    _ARGS.update(args)
    pinpoint._THRESHOLDS.update(thresholds)


def make_history(family: str, i: int, seed: int) -> MetricHistory:
    fam = list(FAMILIES).index(family)
    return FAMILIES[family](np.random.default_rng([seed, fam, i]))


def run_search(h: MetricHistory, rng: np.random.Generator, k: int, min_effect: float,
               options: dict[str, Any]) -> dict[str, Any]:
    from sweeper.bisect.metric_search import MetricSearch, MetricSearchOptions

    s = MetricSearch(h.commits, MetricSearchOptions(min_effect=min_effect, higher_is_better=h.higher_is_better,
                                                    start_s=START_S, **options))
    loops = 0
    while not s.done:
        reqs = s.ask(k)
        if not reqs:
            break
        loops += 1
        if loops > ROUND_GUARD:
            return {"error": "stuck"}
        for r in reqs:
            for _ in range(r.starts):
                s.tell(r.commit, *h.start(rng, r.index))
    rep = s.result()
    claims = [{"candidates": [int(c[1:]) for c in ch.candidates], "kind": str(ch.kind),
               "confidence": ch.confidence, "located": ch.located, "effect": ch.effect,
               "low": ch.effect_low, "high": ch.effect_high, "small": ch.below_min_effect}
              for ch in (*rep.changes, *rep.small_changes)]
    drifts = [{"first": int(d.first[1:]), "last": int(d.last[1:])} for d in rep.drifts]
    return {"claims": claims, "drifts": drifts, "verdict": str(rep.verdict), "starts": rep.starts,
            "rounds": rep.rounds, "no_change": rep.no_change, "bound": rep.bound, "to_decide": rep.to_decide_starts,
            "spread": rep.spread}


def run_pinpoint(h: MetricHistory, rng: np.random.Generator, min_effect: float, magnitude: str) -> dict[str, Any]:
    first = [h.value(rng, 0) for _ in range(pinpoint.REPEAT_COUNT_INCREASE)]
    mag = None if magnitude == "none" else min_effect * float(np.median(first))
    job = pinpoint.PinpointJob(h.n, mag)
    job.values[0].extend(first)
    rounds = 0
    while True:
        for c, todo in sorted(job.pending().items()):
            for _ in range(todo):
                job.tell(c, h.value(rng, c))
        rounds += 1
        if rounds > ROUND_GUARD or not job.explore():
            break
    claims = []
    for a, b in job.culprits():
        up = np.median(job.values[b]) > np.median(job.values[a])
        kind = "improvement" if up == h.higher_is_better else "regression"
        claims.append({"candidates": [b], "kind": kind, "confidence": 1.0, "located": True})
    return {"claims": claims, "starts": job.attempts, "rounds": rounds}


def run_one(task: tuple[str, int]) -> dict[str, Any]:
    family, i = task
    a = _ARGS
    global START_S
    START_S = a.get("start_s", START_S)
    h = make_history(family, i, a["seed"])
    fam = list(FAMILIES).index(family)
    out: dict[str, Any] = {"family": family, "i": i, "n": h.n, "params": h.params,
                           "truth": [[j, e, d] for j, e, d in h.truth]}
    for name in ("search", "pinpoint"):
        if name == "pinpoint" and a["no_pinpoint"]:
            continue
        rng = np.random.default_rng([a["seed"], 11 + (name == "pinpoint"), fam, i])
        t0 = time.process_time()
        try:
            r = (run_search(h, rng, a["k"], a["min_effect"], a["options"]) if name == "search"
                 else run_pinpoint(h, rng, a["min_effect"], a["magnitude"]))
        except Exception:  # noqa: BLE001 -- one broken run should not lose the whole benchmark
            r = {"error": traceback.format_exc(limit=4)}
        r["secs"] = time.process_time() - t0  # CPU seconds: the wall clock counts other processes' load
        out[name] = r
    return out


# ---- scoring -------------------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def is_right(claim: dict[str, Any], truth: list[list[Any]]) -> bool:
    cands = set(claim["candidates"])
    return any(j in cands and d == claim["kind"] for j, _, d in truth)


def _claims(r: dict[str, Any], c: float = 0.99) -> list[dict[str, Any]]:
    return [ch for ch in r.get("claims", []) if ch["confidence"] >= c]


def found(r: dict[str, Any], truth: list[list[Any]], min_effect: float) -> tuple[int, int]:
    """(true changes of min_effect or more found, their number)."""
    big = [t for t in truth if abs(math.log1p(t[1])) >= math.log1p(min_effect) - 1e-9]
    hit = sum(any(ch["located"] and is_right(ch, [t]) for ch in _claims(r)) for t in big)
    return hit, len(big)


def _missed(row: dict[str, Any], min_effect: float) -> bool:
    hit, total = found(row["search"], row["truth"], min_effect)
    return hit < total


def drift_flagged(row: dict[str, Any]) -> bool:
    p = row["params"]
    if "width" not in p:
        return bool(row["search"].get("drifts"))
    a, w = int(p["a"]), int(p["width"])
    return any(d["first"] <= a + w and d["last"] >= a - 1 for d in row["search"].get("drifts", []))


def summarise(rows: list[dict[str, Any]], name: str, min_effect: float) -> dict[str, Any]:
    ok = [r for r in rows if name in r and "error" not in r[name]]
    claims = [(ch, r["truth"]) for r in ok for ch in _claims(r[name])]
    right = sum(is_right(ch, t) for ch, t in claims)
    hits = [found(r[name], r["truth"], min_effect) for r in ok]
    hit, total = sum(h for h, _ in hits), sum(t for _, t in hits)
    gpu_h = sum(r[name]["starts"] for r in ok) * _ARGS.get("start_s", START_S) / 3600
    return {"runs": len(ok), "errors": len(rows) - len(ok), "claims": len(claims), "right": right,
            "found": hit, "true": total, "gpu_h": gpu_h, "per_found": gpu_h / hit if hit else math.nan,
            "gpu_h_run": gpu_h / max(1, len(ok)), "histories_with_claim": sum(bool(_claims(r[name])) for r in ok)}


def _pct(k: int, n: int) -> str:
    return f"{k / n:.1%} ({k}/{n})" if n else "–"


def _right(s: dict[str, Any]) -> str:
    if not s["claims"]:
        return "no claims"
    lo, hi = wilson(s["right"], s["claims"])
    flag = " **below**" if hi < 0.99 else ""
    return f"{s['right'] / s['claims']:.1%} [{lo:.1%}, {hi:.1%}] of {s['claims']}{flag}"


def _per(s: dict[str, Any]) -> str:
    return f"{s['per_found']:.2f}" if s["found"] else f"– ({s['gpu_h_run']:.2f}/run)"


def report(results: list[dict[str, Any]], args: argparse.Namespace, elapsed: float) -> None:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by[r["family"]].append(r)
    families = [f for f in FAMILIES if f in by]
    print(f"metric bisect: {args.histories} histories per family, K = {args.k}, min_effect {args.min_effect:.0%}, "
          f"seed {args.seed}, {args.start_s:.0f} GPU-s a start, Pinpoint magnitude: {args.magnitude}; "
          f"{len(results)} histories in {elapsed:.0f} s on {args.workers} process(es)\n")
    print("| family | n | search: found | search: claims ≥0.99 right [95 % CI] | search: GPU-h per change found "
          "| Pinpoint: found | Pinpoint: claims right [95 % CI] | Pinpoint: GPU-h per change found | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    sums = {}
    for fam in families:
        rows = by[fam]
        s = summarise(rows, "search", args.min_effect)
        p = summarise(rows, "pinpoint", args.min_effect)
        sums[fam] = (s, p)
        ratio = f"{s['per_found'] / p['per_found']:.2f}" if s["found"] and p["found"] else "–"
        if fam in DRIFT or fam == "no change":
            ratio = f"{s['gpu_h_run'] / p['gpu_h_run']:.2f} (per run)" if p["runs"] else "–"
        print(f"| {fam} | {len(rows)} | {_pct(s['found'], s['true'])} | {_right(s)} | {_per(s)} | "
              f"{_pct(p['found'], p['true'])} | {_right(p)} | {_per(p)} | {ratio} |")

    print("\n### The bars (issue 51)\n")
    for fam in families:
        s, _ = sums[fam]
        if s["claims"]:
            lo, hi = wilson(s["right"], s["claims"])
            print(f"- {fam}: claims at ≥ 0.99 right {s['right']}/{s['claims']}, Wilson [{lo:.3f}, {hi:.3f}] "
                  f"{'holds' if hi >= 0.99 else 'FAILS'} (interval includes or lies above 0.99)")
    if "no change" in by:
        n_claim = sum(bool(_claims(r["search"])) for r in by["no change"] if "error" not in r["search"])
        print(f"- no change: histories with a claim at ≥ 0.99: {n_claim} ({'holds' if n_claim == 0 else 'FAILS'})")
    for fam, bar in (("5 % at CV 2 %", 0.95), ("3 % at CV 3 %", 0.80)):
        if fam in sums:
            s, _ = sums[fam]
            rate = s["found"] / max(1, s["true"])
            print(f"- {fam}: found at ≥ 0.99 in {rate:.1%} (bar {bar:.0%}: {'holds' if rate >= bar else 'FAILS'})")
    for fam in DRIFT:
        if fam in by:
            rows = [r for r in by[fam] if "error" not in r["search"]]
            flagged = sum(drift_flagged(r) for r in rows)
            print(f"- {fam}: drift flagged in {_pct(flagged, len(rows))} (bar 80 %: "
                  f"{'holds' if flagged >= 0.8 * len(rows) else 'FAILS'})")
    for fam in families:
        s, p = sums[fam]
        if fam in DRIFT or fam == "no change" or not (s["found"] and p["found"]):
            continue
        ratio = s["per_found"] / p["per_found"]
        s_right = s["right"] / max(1, s["claims"])
        p_right = p["right"] / max(1, p["claims"])
        print(f"- {fam}: GPU-h per change found {ratio:.2f}× Pinpoint's (bar ≤ 0.5×: {'holds' if ratio <= 0.5 else 'FAILS'}); "
              f"right {s_right:.1%} vs {p_right:.1%}, found {s['found'] / max(1, s['true']):.1%} vs "
              f"{p['found'] / max(1, p['true']):.1%}")

    print("\n### The search's verdicts, drift flags and cost\n")
    print("| family | verdicts | drift flagged | mean starts (search / Pinpoint) | mean rounds | CPU s per search / Pinpoint |")
    print("|---|---|---|---|---|---|")
    for fam in families:
        rows = [r for r in by[fam] if "error" not in r["search"]]
        verdicts = Counter(r["search"]["verdict"] for r in rows)
        flagged = sum(drift_flagged(r) for r in rows)
        pp = [r["pinpoint"]["starts"] for r in rows if "pinpoint" in r and "error" not in r["pinpoint"]]
        print(f"| {fam} | {', '.join(f'{v} {n}' for v, n in verdicts.most_common())} | {_pct(flagged, len(rows))} | "
              f"{np.mean([r['search']['starts'] for r in rows]):.1f} / {np.mean(pp) if pp else math.nan:.1f} | "
              f"{np.mean([r['search']['rounds'] for r in rows]):.1f} | {np.mean([r['search']['secs'] for r in rows]):.3f} / "
              f"{np.mean([r['pinpoint']['secs'] for r in rows if 'pinpoint' in r]) if pp else math.nan:.3f} |")

    cpu = {name: sum(r[name].get("secs", 0.0) for r in results if name in r) for name in ("search", "pinpoint")}
    print(f"\nCPU (one process's seconds, summed over histories): search {cpu['search']:.0f} s, Pinpoint "
          f"{cpu['pinpoint']:.0f} s, together {cpu['search'] + cpu['pinpoint']:.0f} s "
          f"({(cpu['search'] + cpu['pinpoint']) / 60:.1f} min on one core, without generating the thresholds)")
    errors = [(r, name) for r in results for name in ("search", "pinpoint") if name in r and "error" in r[name]]
    if errors:
        r, name = errors[0]
        print(f"\n**{len(errors)} runs failed**; first: {name} on {r['family']} #{r['i']}:\n```\n{r[name]['error']}\n```")
    if args.examples:
        print("\n### Examples: a wrong claim, or a change of min_effect or more missed (the search)\n")
        for fam in families:
            rows = [r for r in by[fam] if "error" not in r["search"]]
            wrong = [r for r in rows if any(not is_right(ch, r["truth"]) for ch in _claims(r["search"]))]
            missed = [r for r in rows if r not in wrong and _missed(r, args.min_effect)]
            for label, pick in (("wrong", wrong), ("missed", missed)):
                for r in pick[:args.examples]:
                    truth = "; ".join(f"c{j} {e:+.1%}" for j, e, _ in r["truth"][:4]) or "none"
                    said = "; ".join(f"{ch['kind']} {ch['candidates'][0]}..{ch['candidates'][-1]} {ch['effect']:+.1%} "
                                     f"conf {ch['confidence']:.3f}" for ch in r["search"]["claims"]) or "nothing"
                    print(f"- {fam} #{r['i']} ({label}, {len(pick)} of {len(rows)}): "
                          f"{json.dumps(r['params'], default=str)}; truth {truth}; said {said}; verdict "
                          f"{r['search']['verdict']}, {r['search']['starts']} starts")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=500, help="histories per family")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--k", type=int, default=4, help="starts per round (the search)")
    ap.add_argument("--min-effect", type=float, default=0.03)
    ap.add_argument("--start-s", type=float, default=START_S)
    ap.add_argument("--families", default=None, help="comma-separated subset of: " + ", ".join(FAMILIES).replace("%", "%%"))
    ap.add_argument("--magnitude", choices=("min-effect", "none"), default="min-effect",
                    help="Pinpoint's comparison magnitude: min_effect times the good commit's level, or none (1 IQR)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--no-pinpoint", action="store_true")
    ap.add_argument("--json", default=None, help="write every history's result here")
    ap.add_argument("--from-json", default=None, help="report a --json file instead of running")
    ap.add_argument("--examples", type=int, default=2)
    ap.add_argument("--search", action="append", default=[], metavar="KEY=VALUE",
                    help="a MetricSearchOptions field other than its default (repeatable)")
    args = ap.parse_args()
    families = [f.strip() for f in args.families.split(",")] if args.families else list(FAMILIES)
    if unknown := [f for f in families if f not in FAMILIES]:
        ap.error(f"unknown families {unknown}")
    options = {}
    for item in args.search:
        key, _, value = item.partition("=")
        options[key] = json.loads(value)
    _ARGS["start_s"] = args.start_s
    if args.from_json:
        results = [r for r in json.loads(Path(args.from_json).read_text()) if r["family"] in families]
        report(results, args, 0.0)
        return
    tasks = [(fam, i) for fam in families for i in range(args.histories)]
    order = np.random.default_rng(0).permutation(len(tasks))
    tasks = [tasks[j] for j in order]
    start = time.perf_counter()
    thresholds = {} if args.no_pinpoint else pinpoint.high_thresholds()
    shared = {"start_s": args.start_s, "seed": args.seed, "k": args.k, "min_effect": args.min_effect, "options": options,
              "magnitude": args.magnitude, "no_pinpoint": args.no_pinpoint}
    results = []
    if args.workers > 1:
        with mp.Pool(args.workers, initializer=_init, initargs=(shared, thresholds)) as pool:
            for n, r in enumerate(pool.imap_unordered(run_one, tasks, chunksize=4), 1):
                results.append(r)
                if n % max(1, len(tasks) // 10) == 0:
                    print(f"{n}/{len(tasks)} histories, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    else:
        _init(shared, thresholds)
        for n, t in enumerate(tasks, 1):
            results.append(run_one(t))
            if n % max(1, len(tasks) // 10) == 0:
                print(f"{n}/{len(tasks)} histories, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    elapsed = time.perf_counter() - start
    if args.json:
        Path(args.json).write_text(json.dumps(results, default=float))
    report(results, args, elapsed)


if __name__ == "__main__":
    main()
