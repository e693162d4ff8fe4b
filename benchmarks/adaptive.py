"""Adaptive cells against whole replays: error rates, verdicts reached and requests saved.

Three parts, each printing a Markdown table:

- `--cells N`: N simulated cells judged by the stopping rule (`sweeper.judge.sequential.run`) on samples
  from a generator that shares nothing with the rule's model: a suite of cases of unequal repeats
  (the demo's 101 requests), a failure hitting a random subset of the cases at rates of their own,
  a rate that varies from one server start to the next (a log-normal factor per start), and a share
  of cells placed right at the rule's two rates (where its errors are largest). The clean error is
  the share of cells whose start failed at `detect` or more that the rule called clean; the failing
  error, the share of cells whose start failed at `threshold` or less that it called failing.
- `--matrix8`: the cells of an 8-server-axis matrix (levels 4,4,2,3,2,3,2,3: 3,456 servers, one cell
  each) with planted 1-, 2- and 3-term conjunctions (some varying between starts), replayed whole and
  adaptive at the sample level (no servers): per-cell verdicts and requests.
- `--compare RUNS_DIR WHOLE ADAPTIVE`: two stored runs of one matrix (e.g. `matrices/demo.yaml` run
  both ways): per-cell verdicts, requests (sample rows) and server starts (counted from the logs).

A verdict is `failing` when the cell has a failed sample (whole replay), or when the rule stopped it
failing (adaptive; a cell that ran its suite out is judged like a whole replay).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sweeper.judge.sequential import Rule, Stop, interleave, run

# A suite of the demo's shape: cases of 3 and of 5 repeats, 101 requests in all.
SUITE = [(f"s{i}", 3) for i in range(12)] + [(f"t{i}", 5) for i in range(13)]
assert sum(r for _, r in SUITE) == 101


@dataclass(frozen=True)
class SimCell:
    case_rates: dict[str, float]  # this start's failure rate per case

    def rate(self) -> float:
        n = sum(r for _, r in SUITE)
        return sum(self.case_rates.get(c, 0.0) * r for c, r in SUITE) / n


def draw_cell(rng: random.Random, kind: str, rule: Rule) -> SimCell:
    """One server start of a cell: per-case rates from the generator's own choices."""
    cases = [c for c, _ in SUITE]
    if kind == "clean":
        return SimCell({})
    hit = rng.sample(cases, rng.randint(1, len(cases)))
    per_start = math.exp(rng.gauss(0.0, 0.6))  # start-to-start variation of the rate
    if kind == "bug":
        base = rng.betavariate(1.2, 2.5)
        return SimCell({c: min(1.0, base * per_start * rng.uniform(0.5, 1.5)) for c in hit})
    # At a boundary: rates scaled so that this start's suite rate is exactly the target.
    target = rule.threshold if kind == "at_threshold" else rule.detect
    raw = {c: rng.uniform(0.2, 1.0) for c in hit}
    cell = SimCell(raw)
    scale = target / cell.rate()
    if max(raw.values()) * scale > 1.0:
        return SimCell({c: target for c in cases})
    return SimCell({c: v * scale for c, v in raw.items()})


def outcomes(rng: random.Random, cell: SimCell, seed: int) -> list[bool]:
    order = interleave([(c, r) for c, reps in SUITE for r in range(reps)], seed)
    return [rng.random() < cell.case_rates.get(c, 0.0) for c, _ in order]


def verdicts(rule: Rule, samples: Sequence[bool]) -> tuple[bool, bool, int, Stop]:
    """(whole replay failing, adaptive failing, adaptive requests, adaptive stop)."""
    whole = any(samples)
    v = run(rule, samples)
    adaptive = v.stop is Stop.FAILING or (v.stop in (Stop.EXHAUSTED, Stop.WIDTH) and v.failed > 0)
    return whole, adaptive, v.samples, v.stop


def error_rates(rule: Rule, n: int, seed: int) -> None:
    rng = random.Random(seed)
    kinds = ["clean"] * 3 + ["bug"] * 3 + ["at_threshold"] * 2 + ["at_detect"] * 2
    clean_given_bad = [0, 0]  # [called clean, cells with start rate >= detect]
    failing_given_ok = [0, 0]
    agree = requests = 0
    stops: dict[Stop, int] = dict.fromkeys(Stop, 0)
    for i in range(n):
        cell = draw_cell(rng, kinds[i % len(kinds)], rule)
        samples = outcomes(rng, cell, seed=i)
        whole, adaptive, sent, stop = verdicts(rule, samples)
        stops[stop] += 1
        requests += sent
        agree += whole == adaptive
        rate = cell.rate()
        if rate >= rule.detect - 1e-12:
            clean_given_bad[1] += 1
            clean_given_bad[0] += stop is Stop.CLEAN
        if rate <= rule.threshold + 1e-12:
            failing_given_ok[1] += 1
            failing_given_ok[0] += stop is Stop.FAILING
    alpha = rule.alpha
    print(f"\n### {n:,} simulated cells (seed {seed}; threshold {rule.threshold:g}, detect {rule.detect:g}, "
          f"confidence {rule.confidence:g}, rounds of {rule.round})\n")
    print("| measure | value | bound |\n|---|---|---|")
    for name, (k, m) in (("clean error: called clean, start failing at >= detect", clean_given_bad),
                         ("failing error: called failing, start failing at <= threshold", failing_given_ok)):
        se = math.sqrt(alpha * (1 - alpha) / m) if m else 0.0
        print(f"| {name} | {k}/{m} = {k / m:.2%} (binomial s.e. at the bound {se:.2%}) | <= {alpha:.0%} |")
    full = n * 101
    print(f"| requests sent | {requests:,} of {full:,} ({1 - requests / full:.0%} fewer) | |")
    print(f"| verdict as the whole replay's (any failure = failing) | {agree / n:.2%} | |")
    print(f"| stops | {', '.join(f'{s.value} {c}' for s, c in stops.items() if c)} | |")


# ---- the 8-axis matrix at the sample level ------------------------------------------------------

LEVELS = (4, 4, 2, 3, 2, 3, 2, 3)


def matrix8(rule: Rule, seed: int) -> None:
    rng = random.Random(seed)
    axes = range(len(LEVELS))
    # Planted conjunctions: (terms, per-case rate, cases hit, varies between starts).
    planted = []
    for terms in (1, 2, 3):
        for _ in range(2):
            picked = rng.sample(list(axes), terms)
            conj = tuple((a, rng.randrange(LEVELS[a])) for a in sorted(picked))
            cases = rng.sample([c for c, _ in SUITE], rng.randint(2, 10))
            planted.append((conj, rng.uniform(0.15, 0.6), cases, rng.random() < 0.5))
    agree = whole_req = adaptive_req = again = 0
    cells = 0
    disagree: list[str] = []
    failing_cells = 0
    for i, values in enumerate(itertools.product(*(range(k) for k in LEVELS))):
        rates: dict[str, float] = {}
        for conj, rate, cases, varies in planted:
            if all(values[a] == v for a, v in conj):
                r = rate * (math.exp(rng.gauss(0.0, 0.6)) if varies else 1.0)
                for c in cases:
                    rates[c] = 1 - (1 - rates.get(c, 0.0)) * (1 - min(1.0, r))
        samples = outcomes(rng, SimCell(rates), seed=i)
        whole, adaptive, sent, stop = verdicts(rule, samples)
        again += any(outcomes(rng, SimCell(rates), seed=i)) == whole  # a second whole replay of this start
        cells += 1
        failing_cells += whole
        agree += whole == adaptive
        whole_req += len(samples)
        adaptive_req += sent
        if whole != adaptive:
            disagree.append(f"{values}: whole {'failing' if whole else 'clean'} ({sum(samples)}/101), "
                            f"adaptive {stop.value} after {sent}")
    print(f"\n### 8 server axes, levels {LEVELS}: {cells:,} cells, {len(planted)} planted conjunctions "
          f"(seed {seed})\n")
    print("| measure | value |\n|---|---|")
    print(f"| cells failing in the whole replay | {failing_cells:,} |")
    print(f"| per-cell verdict as the whole replay's | {agree:,} / {cells:,} = {agree / cells:.2%} |")
    print(f"| for reference: a second whole replay of the same start agrees | {again / cells:.2%} |")
    print(f"| requests, whole / adaptive | {whole_req:,} / {adaptive_req:,} ({1 - adaptive_req / whole_req:.0%} fewer) |")
    for line in disagree[:5]:
        print(f"\n- differs: {line}")


# ---- two stored runs ----------------------------------------------------------------------------

def compare(runs_dir: str, whole_id: str, adaptive_id: str) -> None:
    from sweeper.store import frames as analysis
    from sweeper.store.run_folder import open_run

    rows = {}
    for rid in (whole_id, adaptive_id):
        run = open_run(runs_dir, rid, create=False)
        cells = analysis.load_cells(run)
        starts = 0
        for log in sorted((run.root / "logs").glob("*.log")):
            starts += len(re.findall(r"Started server process", log.read_text(errors="replace")))
        rows[rid] = ({r["cell_id"]: (r["status"] != "ok" or r["n_failed"] > 0) for r in cells.to_dict("records")},
                     int(cells.n_samples.sum()), starts, float(cells.gpu_seconds.sum()),
                     dict(cells.stop_reason.value_counts()) if cells.stop_reason.notna().any() else {})
    (wv, wn, ws, wg, _), (av, an, as_, ag, stops) = rows[whole_id], rows[adaptive_id]
    same = sum(wv[c] == av.get(c) for c in wv)
    print(f"\n### {whole_id} (whole) against {adaptive_id} (adaptive)\n")
    print("| measure | whole | adaptive | ratio |\n|---|---|---|---|")
    print(f"| cells | {len(wv)} | {len(av)} | |")
    print(f"| failing cells | {sum(wv.values())} | {sum(av.values())} | |")
    print(f"| per-cell verdict as the whole run's | | {same} / {len(wv)} = {same / len(wv):.1%} | |")
    print(f"| requests (sample rows) | {wn:,} | {an:,} | {an / wn:.2f} ({1 - an / wn:.0%} fewer) |")
    print(f"| server starts (logs) | {ws} | {as_} | |")
    print(f"| GPU-seconds (cost model, measured) | {wg:,.0f} | {ag:,.0f} | {ag / wg:.2f} |")
    print(f"| adaptive stops | | {', '.join(f'{k} {v}' for k, v in sorted(stops.items()))} | |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=0)
    ap.add_argument("--matrix8", action="store_true")
    ap.add_argument("--compare", nargs=3, metavar=("RUNS_DIR", "WHOLE", "ADAPTIVE"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--threshold", type=float, default=0.01)
    ap.add_argument("--detect", type=float, default=0.10)
    ap.add_argument("--seeds", type=int, default=1, help="--matrix8: this many histories, seeds from --seed")
    args = ap.parse_args()
    rule = Rule(threshold=args.threshold, detect=args.detect, confidence=args.confidence)
    if args.cells:
        error_rates(rule, args.cells, args.seed)
    if args.matrix8:
        for seed in range(args.seed, args.seed + args.seeds):
            matrix8(rule, seed)
    if args.compare:
        compare(*args.compare)
    if not (args.cells or args.matrix8 or args.compare):
        ap.error("nothing to do: give --cells N, --matrix8 and/or --compare")


if __name__ == "__main__":
    main()
