"""Calibration and power of `sweeper.judge.explain` on independently generated matrices.

    nice -n 19 .venv/bin/python benchmarks/explain_calibration.py --matrices 300 --json /tmp/explain-cal.json

The generator here shares no code with the simulator's bug declarations (`vllmsim`/`sweeper.sim`)
nor with explain: it draws a matrix of 4-8 axes (a full product, or a random fraction of it when
the product is large), plants a conjunction of 1-3 terms at a rate of 0.02-0.5, and draws every
server start's own rate around it (beta, intra-start correlation 0-0.3). Families:

- `1-term`, `2-term`, `3-term`: planted on requested values;
- `effective`: one term is async scheduling *as it ran*: the axis is `[null, false]`, the version's
  default is on except with ngram, which turns it off;
- `include`: the planted `serve.--dtype=float16` comes with a flag an include rule adds to every
  float16 cell only: the two never vary apart, and the right answer names both ("not identifiable");
- `null`: nothing planted: every start of every cell draws its rate around one background rate.

A suite is either varied (each request its own draw at the start's rate) or identical replays (a
few requests repeated; a replay repeats its first outcome 90 % of the time). Per matrix the answer
is scored: `exact` (the planted conjunction, or for `include` both aliases, claimed significant),
`superset` (claimed with extra terms), `subset` (with terms missing), `wrong` (other claims),
`unexplained` (no significant claim although something was planted), and for `null` any
significant claim is `false claim`. Printed as markdown; `--json` keeps every matrix.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing as mp
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# `--src PATH` measures the explain of another checkout (e.g. `git archive` of an older commit).
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, _SRC)
from sweeper.judge import explain
from sweeper.judge.explain import Verdict
from sweeper.judge.stats import wilson

ALPHA = 0.01
FAMILIES = ("1-term", "2-term", "3-term", "effective", "include", "null")
ICCS = (0.0, 0.1, 0.2, 0.3)
MAX_CELLS = 48  # larger products are run as a random fraction of this many cells
# Axes a matrix draws from (name -> values); async and dtype are added by their families.
POOL = {
    "spec_method": ["none", "ngram", "mtp"],
    "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"],
    "attention_backend": ["FLASH_ATTN", "FLASHINFER"],
    "serve.--max-num-seqs": [64, 256],
    "serve.--enable-prefix-caching": [True, False],
    "env.VLLM_FLASHINFER_MOE": ["0", "1"],
    "serve.--block-size": [16, 32],
    "serve.--kv-cache-dtype": ["auto", "fp8"],
}
FLAG = "serve.--enforce-eager"
REPLAYS = 6  # each request of a replay suite is sent this many times to one server
REPEAT = 0.9  # how often a replay repeats its request's first outcome (else it draws afresh)
CHECKS = ["finish_reason", "json_schema"]


@dataclass
class Matrix:
    family: str
    seed: int
    icc: float
    rate: float
    starts: int  # per cell
    samples: int  # per start
    replay: bool  # identical-replay suite
    axes: dict[str, list[Any]]
    cells: list[dict[str, Any]]
    planted: list[tuple[str, str]]  # (axis, level) as explain names them
    aliases: list[list[tuple[str, str]]] = field(default_factory=list)  # the right alias sets (include)


def _text(v: Any) -> str:
    return explain.value_text(v) or "default"


def draw(family: str, seed: int) -> Matrix:
    rng = np.random.default_rng(seed)
    n_axes = int(rng.integers(4, 9))
    names = list(POOL)
    rng.shuffle(names)
    axes = {n: list(POOL[n]) for n in names[:n_axes]}
    if family == "effective":
        axes.pop(next(iter(axes)))
        axes["spec_method"] = list(POOL["spec_method"])
        axes["async_scheduling"] = [None, False]
    if family == "include":
        axes.pop(next(iter(axes)))
        axes["serve.--dtype"] = ["float16", "bfloat16"]
    combos = [dict(zip(axes, vs, strict=True)) for vs in itertools.product(*axes.values())]
    if len(combos) > MAX_CELLS:
        combos = [combos[i] for i in sorted(rng.choice(len(combos), MAX_CELLS, replace=False))]
    if family == "include":
        for c in combos:
            if c["serve.--dtype"] == "float16":
                c[FLAG] = True
    icc = float(rng.choice(ICCS))
    rate = float(math.exp(rng.uniform(math.log(0.02), math.log(0.5))))
    starts = int(rng.integers(1, 4))
    samples = int(rng.choice([12, 24, 48]))
    replay = bool(rng.integers(0, 2))
    planted: list[tuple[str, str]] = []
    aliases: list[list[tuple[str, str]]] = []
    if family != "null":
        size = {"1-term": 1, "2-term": 2, "3-term": 3}.get(family, int(rng.integers(1, 3)))
        fixed: list[tuple[str, str]] = []
        if family == "effective":
            fixed = [("async_scheduling", "true")]
        if family == "include":
            fixed = [("serve.--dtype", "float16")]
        free = [a for a in axes if a not in {"async_scheduling", "serve.--dtype"}]
        picks = [free[i] for i in rng.choice(len(free), size - len(fixed), replace=False)]
        planted = fixed + [(a, _text(axes[a][int(rng.integers(0, len(axes[a])))])) for a in picks]
        if family == "include":
            aliases = [planted, [(FLAG, "true"), *planted[1:]]]
    return Matrix(family, seed, icc, rate, starts, samples, replay, axes, combos, planted, aliases)


def ran(m: Matrix, cell: dict[str, Any]) -> dict[str, str]:
    """The levels a cell ran, as the generator knows them (async resolved to what the version does)."""
    out = {a: _text(v) for a, v in cell.items()}
    if "async_scheduling" in cell:
        a = cell["async_scheduling"]
        out["async_scheduling"] = _text(a if a is not None else cell["spec_method"] != "ngram")
    return out


def tables(m: Matrix) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """The samples and cells tables of one matrix, and the server starts of its planted cells."""
    rng = np.random.default_rng(m.seed + 1_000_003)
    srows, crows = [], []
    planted_starts = 0
    background = m.rate if m.family == "null" else 0.0
    for i, cell in enumerate(m.cells):
        levels = ran(m, cell)
        hit = bool(m.planted) and all(levels.get(a) == v for a, v in m.planted)
        mean = m.rate if hit else background
        planted_starts += m.starts if hit else 0
        cid = f"cell{i}"
        values = {"commit": "c1", **cell}
        axes = [(a, json.dumps(v)) for a, v in values.items()]
        for s in range(m.starts):
            p = mean if m.icc == 0 or mean == 0 else rng.beta(mean * (1 - m.icc) / m.icc, (1 - mean) * (1 - m.icc) / m.icc)
            fails = _start_failures(rng, p, m.samples, m.replay)
            for r, f in enumerate(fails):
                # A replay suite is a few cases repeated; a varied one a case per request.
                case = f"case{r % max(1, m.samples // REPLAYS)}" if m.replay else f"case{r}"
                srows.append({"run_id": "b", "group_id": f"{cid}#{s}", "cell_id": cid, "commit": "c1",
                              "commit_sha": "c1".ljust(40, "0"), "case_id": case, "repeat": r,
                              "passed": not f, "failed_checks": list(CHECKS) if f else [], "axes": axes})
        row: dict[str, Any] = {"cell_id": cid, "commit": "c1", "status": "ok", "axes": axes,
                               "effective_differs": []}
        if "async_scheduling" in cell:
            row["effective_async_scheduling"] = levels["async_scheduling"] == "true"
            if cell["async_scheduling"] is not None and _text(cell["async_scheduling"]) != levels["async_scheduling"]:
                row["effective_differs"] = ["async_scheduling"]
        crows.append(row)
    return pd.DataFrame(srows), pd.DataFrame(crows), planted_starts


def _start_failures(rng: np.random.Generator, p: float, n: int, replay: bool) -> list[bool]:
    if not replay:
        return [bool(x) for x in rng.random(n) < p]
    distinct = max(1, n // REPLAYS)
    first = rng.random(distinct) < p
    out = []
    for r in range(n):
        same = rng.random() < REPEAT
        out.append(bool(first[r % distinct]) if same else bool(rng.random() < p))
    return out


def matrix_seed(family: str, seed: int, i: int) -> int:
    """The draw seed of a family's i-th matrix (`explain_bound.py` joins on it)."""
    return seed * 1_000_000 + FAMILIES.index(family) * 100_000 + i


def score(m: Matrix, e: explain.Explanation) -> dict[str, Any]:
    mode = e.modes[0] if e.modes else None
    significant = mode is not None and mode.verdict in (Verdict.EXPLAINED, Verdict.NOT_IDENTIFIABLE)
    claimed = [(t.axis, t.value) for t in mode.terms] if mode is not None else []
    alts = [[(t.axis, t.value) for t in a] for a in mode.alternatives] if mode is not None else []
    named = [claimed, *alts]
    if not m.planted:
        category = "false claim" if significant else "quiet"
    elif not significant:
        category = "unexplained"
    elif m.aliases:
        want = {frozenset(a) for a in m.aliases}
        category = "exact" if {frozenset(x) for x in named} == want else _near(set(m.planted), named)
    elif any(set(x) == set(m.planted) for x in named):
        category = "exact"
    else:
        category = _near(set(m.planted), named)
    return {"verdict": mode.verdict.value if mode else "none", "claimed": claimed, "aliases": alts,
            "significant": significant, "category": category,
            "p_adjusted": mode.p_adjusted if mode else None, "rho": getattr(mode, "rho", None)}


def _near(planted: set[tuple[str, str]], named: list[list[tuple[str, str]]]) -> str:
    sets = [set(x) for x in named]
    if any(planted < s for s in sets):
        return "superset"
    if any(s < planted for s in sets):
        return "subset"
    return "wrong"


def run_one(args: tuple[str, int]) -> dict[str, Any]:
    family, seed = args
    m = draw(family, seed)
    samples, cells, planted_starts = tables(m)
    started = time.perf_counter()
    from sweeper.store import frames as analysis
    e = explain.explain(analysis.with_axes(samples), cells, alpha=ALPHA)
    out = {"family": family, "seed": seed, "icc": m.icc, "rate": m.rate, "starts": m.starts,
           "samples": m.samples, "replay": m.replay, "n_axes": len(m.axes), "cells": len(m.cells),
           "planted": m.planted, "planted_starts": planted_starts, "failures": int((~samples["passed"]).sum()),
           "seconds": time.perf_counter() - started, **score(m, e)}
    return out


def _pct(k: int, n: int) -> str:
    if n == 0:
        return "—"
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] ({k}/{n})"


def report(rows: list[dict[str, Any]]) -> str:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["family"]].append(r)
    out = ["| family | matrices | significant claims | of them exact | superset | subset | wrong | unexplained (planted) |",
           "|---|---|---|---|---|---|---|---|"]
    for fam in FAMILIES:
        rs = by.get(fam, [])
        if not rs:
            continue
        sig = [r for r in rs if r["significant"]]
        cat = defaultdict(int)
        for r in rs:
            cat[r["category"]] += 1
        if fam == "null":
            out.append(f"| null | {len(rs)} | {_pct(len(sig), len(rs))} (α = {ALPHA}) | — | — | — | — | — |")
            continue
        out.append(f"| {fam} | {len(rs)} | {len(sig)} | {_pct(cat['exact'], len(sig))} | {cat['superset']} | "
                   f"{cat['subset']} | {cat['wrong']} | {_pct(cat['unexplained'], len(rs))} |")
    out += ["", "Exact conjunction named, planted families, by intra-start correlation and planted starts:", "",
            "| ICC | planted cells have 1 start | ≥ 2 starts, rate < 0.1 | ≥ 2 starts, rate ≥ 0.1 |", "|---|---|---|---|"]
    planted = [r for r in rows if r["family"] != "null"]
    for icc in ICCS:
        rs = [r for r in planted if r["icc"] == icc]
        one = [r for r in rs if r["starts"] == 1]
        low = [r for r in rs if r["starts"] >= 2 and r["rate"] < 0.1]
        high = [r for r in rs if r["starts"] >= 2 and r["rate"] >= 0.1]
        out.append(f"| {icc} | " + " | ".join(_pct(sum(r['category'] == 'exact' for r in g), len(g))
                                              for g in (one, low, high)) + " |")
    out += ["", "Significant claims exact, by intra-start correlation (planted families):", "",
            "| ICC | exact among significant | false claims (null) |", "|---|---|---|"]
    for icc in ICCS:
        sig = [r for r in planted if r["icc"] == icc and r["significant"]]
        null = [r for r in by.get("null", []) if r["icc"] == icc]
        out.append(f"| {icc} | {_pct(sum(r['category'] == 'exact' for r in sig), len(sig))} | "
                   f"{_pct(sum(r['significant'] for r in null), len(null))} |")
    secs = [r["seconds"] for r in rows]
    out += ["", f"{len(rows)} matrices; explain took {np.mean(secs):.2f} s on average, {max(secs):.2f} s at most."]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", type=int, default=300, help="per family")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--src", help="a checkout whose sweeper to measure (default: this one)")
    parser.add_argument("--examples", type=int, default=3, help="misses printed per family")
    a = parser.parse_args()
    work = [(f, matrix_seed(f, a.seed, i))
            for f in a.families.split(",") for i in range(a.matrices)]
    started = time.time()
    if a.jobs > 1:
        with mp.Pool(a.jobs) as pool:
            rows = pool.map(run_one, work, chunksize=4)
    else:
        rows = [run_one(w) for w in work]
    print(report(rows))
    print(f"\nwall {time.time() - started:.0f} s")
    for fam in a.families.split(","):
        bad = [r for r in rows if r["family"] == fam and r["category"] not in ("exact", "quiet")][: a.examples]
        for r in bad:
            print(f"- {fam} seed {r['seed']}: {r['category']}; planted {r['planted']} at {r['rate']:.3f}, "
                  f"ICC {r['icc']}, {r['starts']} start(s) x {r['samples']}; got {r['verdict']} {r['claimed']} "
                  f"(aliases {r['aliases']}, ρ {r['rho']})")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows}, default=str))


if __name__ == "__main__":
    main()
