"""Calibration of `sweeper.judge.metric_compare.welch` (the verdict of `sweep report A --against B --metrics`).

The generator shares nothing with the test's model (log-normal per-start noise, equal variances):
each history draws a metric's true value (1 to 1000), a per-start coefficient of variation of 1–5 %
per side (A and B need not be equally noisy), a per-start factor that is gamma-distributed (skewed,
not log-normal) with that CV, an outlier start with probability `--outliers` (the whole start 10–30 %
slower or faster: a noisy neighbour, a throttled GPU), and within-start noise of 0.5 % whose standard
error is reported as the `_se` column would. A is B times (1 + effect) for effects 0–20 %.

Reported per (starts per side, effect): the share of DIFFERENT, SAME and UNKNOWN verdicts; at effect 0
the DIFFERENT share is the false-alarm rate (target ≤ 5 %), at effects ≥ 10 % (twice the default
5 % minimum effect) the SAME share is the false-"no change" rate (target ≤ 5 %), elsewhere the
DIFFERENT share is the power. One comparison per history (a report's BH correction over many cells
only lowers the false alarms further).

    nice -n 10 .venv/bin/python benchmarks/metric_compare.py --histories 2000
"""

from __future__ import annotations

import argparse
import random

from sweeper.judge.metric_compare import MIN_EFFECT, welch

STARTS = ((2, 2), (3, 3), (2, 5), (5, 5), (10, 10))
EFFECTS = (0.0, 0.02, 0.05, 0.10, 0.20)


def draw(rng: random.Random, n: int, mean: float, cv: float, outliers: float) -> tuple[list[float], list[float]]:
    values, ses = [], []
    shape = 1 / cv ** 2
    for _ in range(n):
        factor = rng.gammavariate(shape, 1 / shape)
        if rng.random() < outliers:
            factor *= rng.choice((1.0, -1.0)) * rng.uniform(0.10, 0.30) + 1.0
        within = 0.005 * mean * factor
        values.append(mean * factor + rng.gauss(0.0, within))
        ses.append(within)
    return values, ses


def run(histories: int, outliers: float, seed: int) -> list[tuple[int, int, float, float, float, float]]:
    rng = random.Random(seed)
    out = []
    for na, nb in STARTS:
        for effect in EFFECTS:
            counts = {"DIFFERENT": 0, "SAME": 0, "UNKNOWN": 0}
            for _ in range(histories):
                base = 10 ** rng.uniform(0, 3)
                cv_a, cv_b = rng.uniform(0.01, 0.05), rng.uniform(0.01, 0.05)
                a, se_a = draw(rng, na, base * (1 + effect), cv_a, outliers)
                b, se_b = draw(rng, nb, base, cv_b, outliers)
                t = welch(a, b, se_a=se_a, se_b=se_b)
                excludes = t.low is not None and t.high is not None and (t.low > 0 or t.high < 0)
                # One comparison: BH's q equals p, so DIFFERENT is the interval excluding no change.
                verdict = "SAME" if t.same else ("DIFFERENT" if excludes else "UNKNOWN")
                counts[verdict] += 1
            out.append((na, nb, effect, counts["DIFFERENT"] / histories, counts["SAME"] / histories,
                        counts["UNKNOWN"] / histories))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--histories", type=int, default=2000, help="comparisons per row")
    parser.add_argument("--outliers", type=float, default=0.05, help="probability of an outlier start")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"min effect {100 * MIN_EFFECT:g} %, per-start CV 1–5 % (gamma), outlier starts {100 * args.outliers:g} %, "
          f"{args.histories} comparisons per row\n")
    print("| starts A/B | effect | DIFFERENT | SAME | UNKNOWN | reads as |")
    print("|---|---|---|---|---|---|")
    for na, nb, effect, diff, same, unknown in run(args.histories, args.outliers, args.seed):
        what = ("false DIFFERENT" if effect == 0 else
                "false SAME" if effect >= 2 * MIN_EFFECT else "power")
        value = diff if what != "false SAME" else same
        print(f"| {na}/{nb} | {100 * effect:g} % | {100 * diff:.1f} % | {100 * same:.1f} % | {100 * unknown:.1f} % "
              f"| {what} {100 * value:.1f} % |")


if __name__ == "__main__":
    main()
