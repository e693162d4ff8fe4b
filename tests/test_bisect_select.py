"""Which cells a bisect works on: `--where` over a matrix, and the screen of a sweep's counts at good
and at bad. Pure: counts in, cell keys out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.bisect.select import Counts, Ends, ends, screen, select_cell, select_cells
from sweeper.errors import BisectError
from sweeper.install.matrix_loader import load_matrix

DEMO = Path(__file__).resolve().parents[1] / "matrices" / "bisect-demo.yaml"


def test_a_credible_change_either_way_is_chosen_and_alike_rates_are_not() -> None:
    found = screen({
        "rise": Ends(Counts(60, {}), Counts(60, {"a": 12}), failed_somewhere=True),  # p 0.0003
        "fix": Ends(Counts(60, {"a": 20}), Counts(60, {}), failed_somewhere=True),
        "alike": Ends(Counts(60, {"a": 6}), Counts(60, {"a": 8}), failed_somewhere=True),  # p 0.78
        "clean": Ends(Counts(60, {}), Counts(60, {}), failed_somewhere=False),
        # Not measured at good, but seen failing: the bisect measures its endpoints first.
        "half": Ends(None, Counts(30, {"b": 1}), failed_somewhere=True),
        "half and clean": Ends(Counts(60, {}), None, failed_somewhere=False),
    })
    assert found.chosen == ("rise", "fix", "half")
    assert found.checked == 4 and found.unclear == 1


def test_the_threshold_is_corrected_for_the_modes_tried() -> None:
    """0/40 -> 8/40 is p = 0.0053: below 1 % for one mode, not when three modes were tried."""
    alone = Ends(Counts(40, {}), Counts(40, {"a": 8}), failed_somewhere=True)
    among_three = Ends(Counts(40, {"b": 1}), Counts(40, {"a": 8, "c": 1}), failed_somewhere=True)
    assert screen({"x": alone}).chosen == ("x",)
    found = screen({"x": among_three})
    assert found.chosen == () and found.unclear == 1
    assert screen({"x": among_three}, alpha=0.02).chosen == ("x",)


def test_ends_count_a_cells_samples_by_mode_at_either_endpoint() -> None:
    fsm = frozenset({"log_absent(FSM)", "no_whitespace_tail"})
    by_commit = {"good": [("json", frozenset()), ("json", frozenset())],
                 "mid": [("json", fsm)],
                 "bad": [("json", fsm), ("json", frozenset()), ("tool", frozenset({"tool_json"}))]}
    modes = {("json", fsm): "fsm"}
    seen = ends(by_commit, "good", "bad", modes)
    assert seen == Ends(Counts(2, {}), Counts(3, {"fsm": 1, "tool_json": 1}), failed_somewhere=True)
    # An endpoint without samples is unmeasured, not clean.
    assert ends({"mid": [("json", fsm)]}, "good", "bad", modes) == Ends(None, None, failed_somewhere=True)


def test_where_picks_cells_by_their_settings() -> None:
    matrix = load_matrix(DEMO)
    assert {c.values["spec_method"] for c in select_cells(matrix, [])} == {"none", "mtp"}
    assert select_cell(matrix, ["spec_method=mtp"]).values["spec_method"] == "mtp"
    # The commit is what a bisect varies: naming one, even one outside the matrix, picks nothing more.
    assert len(select_cells(matrix, ["commit=main"])) == 2


@pytest.mark.parametrize(("where", "message"), [
    (["spec_method"], r"--where 'spec_method': expected AXIS=VALUE"),
    (["backend=x"], r"--where backend: not an axis of .*bisect-demo.yaml; axes: commit, "),
    (["spec_method=ngram"], r"no cell of .*bisect-demo.yaml matches spec_method=ngram"),
    ([], (r"2 cells match \(nothing\); add --where to pick one of: spec_method=none; spec_method=mtp "
          r"num_speculative_tokens=4$")),
])
def test_where_that_picks_no_single_cell_says_why(where: list[str], message: str) -> None:
    with pytest.raises(BisectError, match=message):
        select_cell(load_matrix(DEMO), where)
