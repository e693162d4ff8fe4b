"""The stopping rule of adaptive cells (sweeper.judge.sequential), on data it did not generate."""

from __future__ import annotations

import math
import random

import pytest

from sweeper.judge.sequential import Rule, Stop, Verdict, confidence_sequence, interleave, run


def test_clean_after_the_fewest_clean_samples_that_settle_it() -> None:
    rule = Rule(threshold=0.01, detect=0.10, confidence=0.95)
    need = rule.clean_after()
    # Wald: log(beta / (1 - alpha)) / log((1 - p1) / (1 - p0)) = 30.9 clean samples.
    assert need == 31
    assert rule.decide(0, need) is Stop.CLEAN
    assert rule.decide(0, need - 1) is None
    assert rule.expected_samples(101) == 32  # whole rounds of 8
    assert rule.expected_samples(20) == 20


def test_two_early_failures_settle_a_cell_failing_one_does_not() -> None:
    rule = Rule()
    assert rule.decide(1, 1) is None
    assert rule.decide(2, 2) is Stop.FAILING
    assert rule.decide(2, 19) is Stop.FAILING
    assert rule.decide(2, 30) is None  # 2 in 30 is inside the indifference zone
    assert rule.decide(0, 0) is None


def test_rule_rejects_what_it_cannot_use() -> None:
    for bad in ({"threshold": 0.2, "detect": 0.1}, {"threshold": 0.0}, {"confidence": 1.0},
                {"width": 0.0}, {"round": 0}):
        with pytest.raises(ValueError, match=r"need|must"):
            Rule(**bad)  # type: ignore[arg-type]


def test_run_stops_at_the_round_that_settles() -> None:
    rule = Rule(round=8)
    assert run(rule, [False] * 101) == Verdict(Stop.CLEAN, 32, 0)
    assert run(rule, [True, False, True] + [False] * 98) == Verdict(Stop.FAILING, 8, 2)
    # A rate inside the zone over a short suite runs it to the end.
    zone = [i % 20 == 0 for i in range(40)]
    assert run(rule, zone).stop is Stop.EXHAUSTED and run(rule, zone).samples == 40
    assert run(rule, [False] * 101, full=16) == Verdict(Stop.EXHAUSTED, 16, 0)


def test_confidence_sequence_matches_its_definition_on_a_grid() -> None:
    # {p : M_n(p) < 1/alpha}, M_n(p) = B(a+k, b+n-k) / B(a, b) / (p^k (1-p)^(n-k)), found by brute force.
    alpha = 0.05
    for k, n in [(0, 10), (3, 10), (10, 10), (1, 101), (40, 101)]:
        lo, hi = confidence_sequence(k, n, alpha)
        log_mix = (math.lgamma(0.5 + k) + math.lgamma(0.5 + n - k) - math.lgamma(1 + n)
                   - 2 * math.lgamma(0.5) + math.lgamma(1.0))
        inside = [p / 10000 for p in range(1, 10000)
                  if log_mix - (k * math.log(p / 10000) + (n - k) * math.log1p(-p / 10000)) < math.log(1 / alpha)]
        assert abs(lo - (0.0 if k == 0 else inside[0])) < 2e-4, (k, n, lo, inside[0])
        assert abs(hi - (1.0 if k == n else inside[-1])) < 2e-4, (k, n, hi, inside[-1])
    assert confidence_sequence(0, 0, alpha) == (0.0, 1.0)


def test_width_stop_once_the_sequence_is_narrow() -> None:
    # 3 failures in 20 sits where the test weighs clean and failing alike: only the width settles it.
    rule = Rule(width=0.2, threshold=0.01, detect=0.5)
    verdicts = {n: rule.decide(3 * n // 20, n) for n in range(20, 400, 20)}
    assert Stop.CLEAN not in verdicts.values() and Stop.FAILING not in verdicts.values()
    first = min(n for n, v in verdicts.items() if v is Stop.WIDTH)
    lo, hi = confidence_sequence(3 * first // 20, first, rule.alpha)
    assert hi - lo <= 0.2
    lo, hi = confidence_sequence(3 * (first - 20) // 20, first - 20, rule.alpha)
    assert hi - lo > 0.2
    assert Rule(threshold=0.01, detect=0.5).decide(3 * first // 20, first) is None


def _error_rates(rule: Rule, rate: float, cells: int, seed: int) -> dict[Stop, float]:
    rng = random.Random(seed)
    got = {s: 0 for s in Stop}
    for _ in range(cells):
        got[run(rule, [rng.random() < rate for _ in range(200)]).stop] += 1
    return {s: c / cells for s, c in got.items()}


def test_error_rates_hold_under_optional_stopping() -> None:
    # Checked after every round of 4, up to 50 rounds: a fixed-n test peeked at this often would
    # exceed its level several times over.
    rule = Rule(threshold=0.02, detect=0.2, confidence=0.95, round=4)
    at_threshold = _error_rates(rule, 0.02, 2000, seed=1)
    at_detect = _error_rates(rule, 0.2, 2000, seed=2)
    # 2,000 cells: a binomial standard error of 0.5 % at 5 %; 6.5 % is three of them above.
    assert at_threshold[Stop.FAILING] <= 0.065
    assert at_detect[Stop.CLEAN] <= 0.065
    assert at_threshold[Stop.CLEAN] > 0.9 and at_detect[Stop.FAILING] > 0.9


def test_a_fixed_sample_test_peeked_at_is_what_the_rule_avoids() -> None:
    # The contrast that makes the previous test meaningful: a one-sided Wilson test of "rate above
    # 2 %" at 95 %, looked at after every round, calls far more than 5 % of 2 %-cells failing.
    from sweeper.judge.stats import wilson

    rng = random.Random(3)
    peeked_failing = 0
    for _ in range(500):
        failed = 0
        for n in range(1, 401):
            failed += rng.random() < 0.02
            if n % 4 == 0 and wilson(failed, n, z=1.645)[0] > 0.02:
                peeked_failing += 1
                break
    assert peeked_failing / 500 > 0.1


def test_interleave_makes_every_prefix_a_fair_sample() -> None:
    items = [("a", r) for r in range(3)] + [("b", r) for r in range(3)] + [("c", r) for r in range(9)]
    order = interleave(items, seed=5)
    assert sorted(order) == sorted(items)
    assert interleave(items, seed=5) == order
    for n in range(1, len(order) + 1):
        prefix = [k for k, _ in order[:n]]
        for key, share in (("a", 0.2), ("b", 0.2), ("c", 0.6)):
            assert abs(prefix.count(key) - share * n) <= 1.0 + 1e-9, (n, key, prefix)
    # Each case's own repeats keep their order.
    assert [r for k, r in order if k == "c"] == list(range(9))
