"""Calibration and cost of the noisy bisect on simulated histories.

    .venv/bin/python benchmarks/bisect_calibration.py --histories 5000

Histories: N log-uniform in 10..3,000 candidates, p_bad uniform in 0.05..1, p_good 0 half
the time else uniform in 0..0.02, a random culprit, 5 % of interior commits untestable.
Prints markdown: accuracy and calibration by reported confidence, cost for K = 1, 2, 4, 8,
and samples compared with a fixed-repeats baseline (plain bisection, 20 samples per probe,
a commit is bad when any sample fails: Pinpoint-style).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sweeper.bisect_sim import History, random_history, simulate


def fixed_repeats(history: History, rng: np.random.Generator, repeats: int = 20) -> tuple[bool, int, int]:
    """Plain bisection, `repeats` samples per probe, bad on any failure; skips walk right
    (then left) to the nearest testable commit. Returns (right, probes, samples)."""
    lo, hi, probes = 0, history.n, 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probe = next((i for i in [*range(mid, hi), *range(mid - 1, lo, -1)]
                      if i not in history.skipped), None)
        if probe is None:
            break
        probes += 1
        if rng.binomial(repeats, history.rate(probe)) > 0:
            hi = probe
        else:
            lo = probe
    right = history.culprit is not None and lo < history.culprit <= hi
    return right, probes, probes * repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=5000)
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    histories = [random_history(rng) for _ in range(args.histories)]
    ks = (1, 2, 4, 8)
    rows: dict[int, list[tuple[float, bool, int, int, int, str]]] = {}
    start = time.perf_counter()
    for k in ks:
        krng = np.random.default_rng(args.seed * 100 + k)
        rows[k] = []
        for h in histories:
            r = simulate(h, krng, parallel=k, confidence=args.confidence, max_samples_per_probe=5000)
            rows[k].append((r.confidence, h.is_right(r), r.probes, r.rounds, r.samples, r.kind.name))
    elapsed = time.perf_counter() - start
    brng = np.random.default_rng(args.seed * 100)
    base = [fixed_repeats(h, brng) for h in histories]

    print(f"{args.histories} histories per K, confidence target {args.confidence}, "
          f"{elapsed:.0f} s\n")
    print("| K | right | undecided | mean probes | mean rounds | mean samples | median samples |")
    print("|---|---|---|---|---|---|---|")
    for k in ks:
        conf, ok, probes, rounds, samples, kind = map(np.array, zip(*rows[k]))
        print(f"| {k} | {ok.mean():.2%} | {(kind == 'UNDECIDED').mean():.2%} | {probes.mean():.1f} | "
              f"{rounds.mean():.1f} | {samples.mean():.0f} | {np.median(samples):.0f} |")
    ok_b, probes_b, samples_b = map(np.array, zip(*base))
    print(f"| fixed 20/probe | {ok_b.mean():.2%} | - | {probes_b.mean():.1f} | {probes_b.mean():.1f} | "
          f"{samples_b.mean():.0f} | {np.median(samples_b):.0f} |")

    print("\nCalibration (all K pooled): among results reported with confidence >= c\n")
    print("| c | results | right |")
    print("|---|---|---|")
    pooled = [row for k in ks for row in rows[k]]
    conf = np.array([r[0] for r in pooled])
    ok = np.array([r[1] for r in pooled])
    for c in (0.5, 0.9, 0.95, 0.99, 0.995, 0.999):
        sel = conf >= c
        print(f"| {c} | {sel.sum()} | {ok[sel].mean():.2%} |" if sel.any() else f"| {c} | 0 | - |")

    print("\nBy regression rate (K = 1): samples vs the fixed-repeats baseline\n")
    print("| p_bad | histories | right | mean samples | fixed 20/probe right | fixed mean samples |")
    print("|---|---|---|---|---|---|")
    p_bad = np.array([h.p_bad for h in histories])
    ok1 = np.array([r[1] for r in rows[1]])
    s1 = np.array([r[4] for r in rows[1]])
    for lo, hi in ((0.05, 0.1), (0.1, 0.25), (0.25, 0.5), (0.5, 1.0)):
        sel = (p_bad >= lo) & (p_bad < hi if hi < 1 else p_bad <= hi)
        print(f"| {lo}-{hi} | {sel.sum()} | {ok1[sel].mean():.2%} | {s1[sel].mean():.0f} | "
              f"{ok_b[sel].mean():.2%} | {samples_b[sel].mean():.0f} |")


if __name__ == "__main__":
    main()
