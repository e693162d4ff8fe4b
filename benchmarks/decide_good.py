"""P4: requests needed to call a commit good when the bad rate is p_bad = 1/3, at alpha = 1 %.

    .venv/bin/python benchmarks/decide_good.py [--trials 2000]

Three figures from the project's own code, side by side: the exact one-sided bound (no failure in
n requests rules out p >= p_bad at 1 - alpha; what `Search.bad_endpoint` uses), the probe size the
bisect search asks for between a clean side and a p_bad side (`Search`'s Wald count after its floor),
and a simulation: the search on [good, x, bad] with the bad endpoint failing at p_bad, driven to
the end, counting the requests it spends on x. With x clean that is the cost of calling x good;
with x failing at p_bad, how often it was called good anyway (the error alpha bounds).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

from sweeper.bisect.search import Search, SearchOptions
from sweeper.judge.stats import samples_to_decide

P_BAD = 1 / 3
ALPHA = 0.01


def run_search(x_rate: float, rng: random.Random) -> tuple[int, int, bool]:
    """(requests spent on x, server starts at x, whether the report put the change after x, i.e.
    called x good)."""
    rates = {"good": 0.0, "x": x_rate, "bad": P_BAD}
    search = Search(["good", "x", "bad"], SearchOptions(confidence=1 - ALPHA))
    while not search.done:
        for req in search.ask(1):
            fails = sum(rng.random() < rates[req.commit] for _ in range(req.samples))
            search.tell(req.commit, req.samples, {"mode": fails} if fails else {})
    at_x = [o.samples for o in search.observations if o.commit == "x"]
    changes = search.result().changes
    called_good = any(c.candidates and c.candidates[0] == "bad" for c in changes) if changes else False
    return sum(at_x), len(at_x), called_good


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    exact = math.ceil(math.log(ALPHA) / math.log1p(-P_BAD))
    wald = samples_to_decide(0.0, P_BAD, 1 - ALPHA)
    probe = Search(["a", "b"], SearchOptions(confidence=1 - ALPHA))._batch(0.0, P_BAD, 0.0)
    clean = [run_search(0.0, rng) for _ in range(args.trials)]
    bad = [run_search(P_BAD, rng) for _ in range(args.trials)]
    spent = sorted(s for s, _, _ in clean)
    starts = statistics.mean(k for _, k, _ in clean)
    print("| measure | requests |\n|---|---|")
    print(f"| exact bound: no failure in n rules out p >= 1/3 at alpha 1 % | {exact} |")
    print(f"| Wald count (`stats.samples_to_decide(0, 1/3, 0.99)`) | {wald} |")
    print(f"| probe size the search asks for between rates 0 and 1/3 (floor `min_batch`) | {probe} |")
    print(f"| search on [good, x, bad]: requests on a clean x, mean / median / p90 | "
          f"{statistics.mean(spent):.1f} / {statistics.median(spent):.0f} / {spent[int(0.9 * len(spent))]} |")
    print(f"\nclean x: {starts:.2f} server starts on average, called good in {sum(g for *_, g in clean) / len(clean):.1%}; "
          f"x failing at 1/3 called good: {sum(g for *_, g in bad) / len(bad):.2%} (alpha {ALPHA:.0%}); "
          f"{args.trials} trials each")


if __name__ == "__main__":
    main()
