"""`sweep report A --against B --metrics`: the change of each metric per matched cell and load point."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sweeper.judge.metric_compare import MetricVerdict, compare_metrics, render, welch
from tests.metricframes import frame, noisy, row

V2 = {"spec_method": "mtp", "num_speculative_tokens": 2}
NONE = {"spec_method": "none"}


def _runs(tmp_path: Path, tpot_rise: float, starts: int = 5, cv: float = 0.01, seed: int = 3):
    rng = random.Random(seed)
    a, b = [], []
    for settings in (V2, NONE):
        for s in range(starts):
            for side, commit, rise in ((b, "v0.27", 1.0), (a, "main", tpot_rise if settings is V2 else 1.0)):
                side.append(row({"commit": commit, **settings}, s, run_id=commit,
                                mean_tpot_ms=noisy(rng, 20.0 * rise, cv), mean_tpot_ms_se=0.05,
                                output_throughput=noisy(rng, 900.0, cv)))
    return frame(a, tmp_path / "a.parquet"), frame(b, tmp_path / "b.parquet")


def test_a_planted_rise_is_different_and_worse_elsewhere_the_same(tmp_path: Path) -> None:
    a, b = _runs(tmp_path, 1.20)
    cmp = compare_metrics(a, b, run_a="main", run_b="v0.27", names=["mean_tpot_ms", "output_throughput"])
    by = {(c.label, c.metric): c for c in cmp.changes}
    rise = by[("spec_method=mtp num_speculative_tokens=2", "mean_tpot_ms")]
    assert rise.verdict == MetricVerdict.DIFFERENT and rise.worse is True
    assert rise.test.low is not None and rise.test.high is not None
    assert rise.test.low < 0.20 < rise.test.high  # the interval holds the planted change
    assert by[("spec_method=none", "mean_tpot_ms")].verdict == MetricVerdict.SAME
    assert all(c.verdict == MetricVerdict.SAME for c in cmp.changes if c.metric == "output_throughput")
    assert cmp.changes[0] is rise  # DIFFERENT first
    lines = render(cmp)
    assert all(len(line) <= 100 for line in lines)
    assert any("DIFFERENT (worse)" in line and "mean_tpot_ms" in line for line in lines)


def test_two_noisy_starts_are_unknown_with_the_starts_it_would_take(tmp_path: Path) -> None:
    a, b = _runs(tmp_path, 1.06, starts=2, cv=0.04, seed=5)
    cmp = compare_metrics(a, b, names=["mean_tpot_ms"])
    change = next(c for c in cmp.changes if c.settings == (("spec_method", "mtp"), ("num_speculative_tokens", "2")))
    assert change.verdict == MetricVerdict.UNKNOWN
    assert change.test.starts_needed is not None and change.test.starts_needed > 2


def test_invalid_starts_give_no_figure_and_are_counted(tmp_path: Path) -> None:
    rows_b = [row({"commit": "v0.27", **NONE}, s, mean_tpot_ms=20.0 + 0.1 * s) for s in range(3)]
    rows_a = [row({"commit": "main", **NONE}, s, mean_tpot_ms=20.0 + 0.1 * s) for s in range(3)]
    rows_a.append(row({"commit": "main", **NONE}, 3, valid=False, reason="server crashed", mean_tpot_ms=900.0))
    cmp = compare_metrics(frame(rows_a, tmp_path / "a.parquet"), frame(rows_b, tmp_path / "b.parquet"),
                          names=["mean_tpot_ms"])
    (c,) = cmp.changes
    assert (c.n_a, c.invalid_a, c.n_b) == (3, 1, 3)
    assert c.mean_a == pytest.approx(20.1)
    assert c.verdict == MetricVerdict.SAME


def test_load_points_and_unmatched_cells_stay_apart(tmp_path: Path) -> None:
    rows_a = [row({"commit": "main", **NONE}, s, lp, mean_tpot_ms=v) for s in range(3)
              for lp, v in (("concurrency=1", 10.0), ("concurrency=8", 30.0))]
    rows_b = [row({"commit": "old", **NONE}, s, "concurrency=1", mean_tpot_ms=10.0 + 0.01 * s) for s in range(3)]
    rows_b += [row({"commit": "old", "spec_method": "ngram"}, s, mean_tpot_ms=5.0) for s in range(3)]
    cmp = compare_metrics(frame(rows_a, tmp_path / "a.parquet"), frame(rows_b, tmp_path / "b.parquet"),
                          names=["mean_tpot_ms"])
    assert [(c.load_point, c.verdict) for c in cmp.changes] == [("concurrency=1", MetricVerdict.SAME)]
    assert cmp.only_a == ("spec_method=none @ concurrency=8",)
    assert cmp.only_b == ("spec_method=ngram @ concurrency=8",)


@pytest.mark.parametrize("n", [2, 3, 10])
def test_no_change_is_rarely_called_different_and_a_large_one_rarely_same(n: int) -> None:
    # Skewed (gamma) per-start noise the test does not assume, unequal CVs per side.
    rng = random.Random(n)
    false_diff = false_same = 0
    trials = 400
    for _ in range(trials):
        cv_a, cv_b = rng.uniform(0.01, 0.05), rng.uniform(0.01, 0.05)
        b = [50 * rng.gammavariate(1 / cv_b**2, cv_b**2) for _ in range(n)]
        a0 = [50 * rng.gammavariate(1 / cv_a**2, cv_a**2) for _ in range(n)]
        a1 = [55 * rng.gammavariate(1 / cv_a**2, cv_a**2) for _ in range(n)]  # +10 %: twice the margin
        t0, t1 = welch(a0, b), welch(a1, b)
        false_diff += t0.low is not None and (t0.low > 0 or t0.high < 0)  # type: ignore[operator]
        false_same += t1.same
    assert false_diff / trials <= 0.07
    assert false_same / trials <= 0.05


def test_one_start_each_decides_nothing() -> None:
    t = welch([10.0], [12.0], se_a=[0.01], se_b=[0.01])
    assert t.p is None and not t.same and t.starts_needed == 2
