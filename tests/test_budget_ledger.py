"""The one GPU-hour budget (`sweeper.plan.budget.Ledger`) the sweep's zoom, the triage and the bisect
ask, and its words (`sweeper.reports.budget`), on data: no run, no server."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sweeper.errors import ConfigError
from sweeper.plan.budget import Ledger, budget_seconds
from sweeper.reports.budget import budget_lines
from sweeper.store.manifest import BudgetRecord, PhaseRecord


def test_what_is_left_is_the_budget_less_what_was_spent_and_what_is_held() -> None:
    assert Ledger(None, spent_s=5.0).left() is None
    assert Ledger(100.0).left() == 100.0
    assert Ledger(100.0, spent_s=30.0, held_s=20.0).left() == 50.0
    assert Ledger.of_hours(0.5, spent_s=600.0).left() == 1200.0
    assert Ledger.of_hours(None).left() is None
    overspent = Ledger(10.0, spent_s=25.0)  # priced before it ran, spent as it ran
    assert overspent.left() == -15.0


def test_charging_spends_what_is_left() -> None:
    ledger = Ledger(100.0)
    ledger.charge(40.0)
    ledger.charge(25.0)
    assert (ledger.spent_s, ledger.left()) == (65.0, 35.0)
    free = Ledger(None)
    free.charge(1e9)
    assert free.left() is None and free.spent_s == 1e9


def test_work_fits_up_to_what_is_left_and_unpriced_work_always_fits() -> None:
    ledger = Ledger(100.0, spent_s=40.0)
    assert ledger.fits(60.0) and not ledger.fits(60.5)
    assert ledger.fits(None)
    assert Ledger(None).fits(1e12)
    assert not Ledger(100.0, spent_s=40.0, held_s=1.0).fits(60.0)


def test_afford_takes_the_longest_prefix_priced_whole() -> None:
    # An install shared by items of one commit is paid once: a prefix is priced whole.
    start, install = 10.0, 50.0
    items = ["a1", "a2", "b1", "a3"]

    def price(prefix: Sequence[str]) -> float:
        return start * len(prefix) + install * len({i[0] for i in prefix})

    asked: list[tuple[str, ...]] = []

    def logged(prefix: Sequence[str]) -> float:
        asked.append(tuple(prefix))
        return price(prefix)

    # a1: 60, a1+a2: 70, +b1: 130, +a3: 140.
    assert Ledger(135.0).afford(items, logged) == ("a1", "a2", "b1")
    assert asked == [("a1",), ("a1", "a2"), ("a1", "a2", "b1"), ("a1", "a2", "b1", "a3")]
    assert Ledger(140.0).afford(items, price) == tuple(items)  # at the budget exactly: it fits
    assert Ledger(200.0, spent_s=130.0).afford(items, price) == ("a1", "a2")
    # A prefix, never a subset: a3 would fit after a2 alone, but b1 stops the phase first.
    assert Ledger(129.0).afford(items, price) == ("a1", "a2")


def test_nothing_affordable_marks_the_ledger_exhausted() -> None:
    ledger = Ledger(100.0, spent_s=90.0)
    assert ledger.afford([], lambda p: 1.0) == () and not ledger.exhausted  # nothing offered: not spent
    assert ledger.afford(["x", "y"], lambda p: 5.0 * len(p)) == ("x", "y") and not ledger.exhausted
    assert ledger.afford(["z"], lambda p: 10.5) == ()
    assert ledger.exhausted


def test_without_a_budget_everything_is_affordable_unpriced() -> None:
    def never(prefix: Sequence[str]) -> float:
        raise AssertionError("priced without a budget")

    ledger = Ledger(None)
    assert ledger.afford(["a", "b"], never) == ("a", "b") and not ledger.exhausted


@pytest.mark.parametrize("hours", [0.0, -1.0, float("inf"), float("nan")])
def test_a_budget_is_a_finite_number_of_hours_above_zero(hours: float) -> None:
    with pytest.raises(ConfigError, match="--budget: expected a number of GPU-hours above 0"):
        budget_seconds(hours)


def test_budget_seconds_are_hours_times_3600() -> None:
    assert budget_seconds(500 / 3600) == 500 / 3600 * 3600.0
    assert budget_seconds(2.0) == 7200.0


RECORD = BudgetRecord(gpu_hours=0.5, modelled_hours=0.4, servers=2, cells=4, left_servers=2, left_cells=3,
                      left_groups=("g3", "g4"))


def test_the_budget_in_words_before_a_run_and_after_it() -> None:
    assert budget_lines(None) == [] and budget_lines(None, ()) == []
    assert budget_lines(RECORD) == ["budget 0.5 GPU-hours: 2 of 4 servers fit (0.40 GPU-hours modelled)",
                                    "left untested: 2 servers, 3 cells:", "    g3", "    g4"]
    assert budget_lines(RECORD, ()) == ["budget: 0.5 GPU-hours: 2 servers (4 cells) fitted, modelled at 0.400 GPU-hours",
                                        "  left untested: 2 servers (3 cells): g3, g4"]
    zoomed = (PhaseRecord(1, "design", ("g1", "g2"), 4, "covering:2"), PhaseRecord(2, "zoom", ("g4",), 1, "why"))
    assert budget_lines(RECORD, zoomed)[1:] == ["  then zoom phases within what was left: 1 servers",
                                                "  left untested: 1 servers: g3"]
    everything = BudgetRecord(gpu_hours=1.0, modelled_hours=0.4, servers=4, cells=7, left_servers=0, left_cells=0)
    assert budget_lines(everything) == ["budget 1 GPU-hours: 4 of 4 servers fit (0.40 GPU-hours modelled)"]
    assert budget_lines(everything, ())[1:] == ["  nothing left untested"]
