"""How often *any* level-α procedure could name the planted conjunction exactly, on the matrices of
`explain_calibration.py`: an upper bound to set explain's power against.

    .venv/bin/python benchmarks/explain_calibration.py --matrices 300 --jobs 2 --json /tmp/explain-cal.json
    .venv/bin/python benchmarks/explain_bound.py --matrices 300 --explain-json /tmp/explain-cal.json

Naming a conjunction exactly means naming each of its terms as needed. Take one term t, and the
cells that match every other planted term but not t (its "clean half": they never fail, as nothing
is planted there). The hypothesis "t is not needed" says those cells fail like the planted ones, at
the same rate and per-start correlation. Under it, the planted cells' samples have the same law as
in truth, and the clean half comes out all clean with probability P0. So any procedure that names t
in at most α of the matrices where t is not needed names it, in truth, with probability at most
α / P0 (Neyman-Pearson: the data outside the clean half carry nothing that tells the two apart).
The bound on exact naming is the least of these over the terms, and of the chance that the planted
cells fail at all (plus α). It is generous: it lets each term be tested alone at α, with the rate
and the correlation known, where explain tests many conjunctions and estimates both.

P0 is exact for the generator's starts: a start's rate is drawn from a beta around the planted rate
(intra-start correlation ICC), and a varied suite is clean with probability (1 - q)^n, a replay
suite (each distinct request sent `REPLAYS` times, a replay repeating its first outcome 90 % of the
time) with the product over its distinct requests; the beta average is taken by Gauss-Jacobi
quadrature, exact for these polynomials.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import explain_calibration as cal
import numpy as np
from scipy.special import betaln, roots_jacobi

FAILS = "failures at all"  # the bound set by the chance the planted cells fail at all
NODES = 64  # Gauss-Jacobi nodes: exact for polynomials up to degree 127 (a start's is at most ~60)


def beta_of(rate: float, icc: float) -> tuple[float, float]:
    """The beta a start's rate is drawn from: mean `rate`, intra-start correlation `icc` (as the generator draws it)."""
    return rate * (1 - icc) / icc, (1 - rate) * (1 - icc) / icc


@cache
def clean_start(rate: float, icc: float, samples: int, replay: bool) -> float:
    """The probability that one start of `samples` requests at a planted `rate` has no failure."""

    def clean(q: np.ndarray) -> np.ndarray:
        if not replay:
            return (1 - q) ** samples
        distinct = max(1, samples // cal.REPLAYS)
        out = np.ones_like(q)
        for j in range(distinct):
            sent = len(range(j, samples, distinct))
            # Each output copies the request's first outcome or draws afresh.
            fresh = 1 - cal.REPEAT
            out *= (1 - q) * (cal.REPEAT + fresh * (1 - q)) ** sent + q * (fresh * (1 - q)) ** sent
        return out

    if icc == 0:
        return float(clean(np.array([rate]))[0])
    a, b = beta_of(rate, icc)
    # Weight (1 - x)^(b-1) (1 + x)^(a-1) on [-1, 1] is the beta(a, b) density of q = (1 + x) / 2.
    x, w = roots_jacobi(NODES, b - 1, a - 1)
    return float(np.sum(w * clean((1 + x) / 2)) / np.sum(w))


def _check_quadrature() -> None:
    """A varied suite's clean chance has a closed form, E(1 - q)^n = B(a, b + n) / B(a, b): the
    quadrature must give it."""
    for rate, icc, n in ((0.1, 0.1, 48), (0.02, 0.3, 12), (0.4, 0.2, 24)):
        a, b = beta_of(rate, icc)
        exact = float(np.exp(betaln(a, b + n) - betaln(a, b)))
        if not math.isclose(clean_start(rate, icc, n, False), exact, rel_tol=1e-9):
            raise SystemExit(f"quadrature off: {clean_start(rate, icc, n, False)} != {exact} at {rate, icc, n}")


def bound(m: cal.Matrix, alpha: float) -> dict[str, Any]:
    """The upper bound on naming m's planted conjunction exactly, and the term that sets it."""
    levels = [cal.ran(m, c) for c in m.cells]
    p_start = clean_start(m.rate, m.icc, m.samples, m.replay)
    hit = sum(all(lv.get(a) == v for a, v in m.planted) for lv in levels)
    best, by = min(1.0, 1 - p_start ** (hit * m.starts) + alpha), FAILS
    for t in m.planted:
        others = [x for x in m.planted if x != t]
        half = sum(all(lv.get(a) == v for a, v in others) and lv.get(t[0]) != t[1] for lv in levels)
        # No clean half: the conjunction without t selects the same cells; nothing can tell them apart.
        p0 = p_start ** (half * m.starts)
        term = 0.0 if half == 0 else 1.0 if p0 <= alpha else alpha / p0
        if term < best:
            best, by = term, f"{t[0]}={t[1]} ({half} cell(s) without it)"
    return {"bound": best, "limited_by": by, "planted_cells": hit}


def _share(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], float]) -> str:
    return f"{100 * float(np.mean([key(r) for r in rows])):.1f} %" if rows else "—"


def report(rows: list[dict[str, Any]], explained: bool) -> str:
    head = "| ICC | group | matrices | bound: mean | explain: exact |" if explained else "| ICC | group | matrices | bound: mean |"
    out = [head, "|---|---|---|---|---|" if explained else "|---|---|---|---|"]
    groups: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
        ("1 start", lambda r: r["starts"] == 1),
        ("≥ 2 starts, all rates", lambda r: r["starts"] >= 2),
        ("≥ 2 starts, rate < 0.1", lambda r: r["starts"] >= 2 and r["rate"] < 0.1),
        ("≥ 2 starts, rate ≥ 0.1", lambda r: r["starts"] >= 2 and r["rate"] >= 0.1),
        ("≥ 2 starts, rate ≥ 0.1, varied suite", lambda r: r["starts"] >= 2 and r["rate"] >= 0.1 and not r["replay"]),
        ("≥ 2 starts, rate ≥ 0.1, replay suite", lambda r: r["starts"] >= 2 and r["rate"] >= 0.1 and r["replay"]),
    ]
    for icc in cal.ICCS:
        for name, keep in groups:
            rs = [r for r in rows if r["icc"] == icc and keep(r)]
            line = f"| {icc} | {name} | {len(rs)} | {_share(rs, lambda r: r['bound'])} |"
            if explained:
                line += f" {_share(rs, lambda r: r['category'] == 'exact')} |"
            out.append(line)
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", type=int, default=300, help="per family (the calibration's)")
    parser.add_argument("--families", default=",".join(f for f in cal.FAMILIES if f != "null"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--explain-json", type=Path, help="an explain_calibration.py --json of the same matrices")
    parser.add_argument("--json", type=Path, help="write every matrix's bound here")
    parser.add_argument("--alpha", type=float, default=cal.ALPHA,
                        help="the level each term is tested at (explain's α is shared among many tests)")
    a = parser.parse_args()
    _check_quadrature()
    explained: dict[tuple[str, int], dict[str, Any]] = {}
    if a.explain_json:
        explained = {(r["family"], r["seed"]): r for r in json.loads(a.explain_json.read_text())["rows"]}
    rows = []
    for fam in a.families.split(","):
        for i in range(a.matrices):
            seed = cal.matrix_seed(fam, a.seed, i)
            m = cal.draw(fam, seed)
            row = {"family": fam, "seed": seed, "icc": m.icc, "rate": m.rate, "starts": m.starts,
                   "samples": m.samples, "replay": m.replay, **bound(m, a.alpha)}
            if explained:
                row["category"] = explained[(fam, seed)]["category"]
            rows.append(row)
    print(report(rows, bool(explained)))
    low = defaultdict(int)
    for r in rows:
        if r["icc"] == 0.1 and r["starts"] >= 2 and r["bound"] < 0.95:
            low["a term's clean half" if r["limited_by"] != FAILS else FAILS] += 1
    print(f"\nICC 0.1, ≥ 2 starts, bound under 95 %: {dict(low)}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
