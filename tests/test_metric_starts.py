"""What a metric bisect tells its search of one cell's starts (`MetricTarget.observations`): valid starts
as values, and when a commit is untestable: MAX_INVALID starts without a valid figure, or MAX_SAME_CRASH
starts whose engine died with one failure signature (a release that crashes with the cell's settings)."""

from __future__ import annotations

from sweeper.drivers.metric_bisect import MAX_INVALID, MAX_SAME_CRASH, MetricTarget, StartRow
from sweeper.spec.matrix import MatrixFile, make_cell

CRASH = "TypeError in vllm/v1/spec_decode/ngram_proposer.py:propose"


SPEC = MatrixFile.model_validate({"name": "t", "model": "m", "suite": "s.yaml", "install": {"kind": "sim"},
                                  "axes": {"commit": ["c0"], "spec_method": ["ngram"]}})


def target(*rows: StartRow) -> MetricTarget:
    cell = make_cell(SPEC, {"commit": "c0", "spec_method": "ngram"}, ["commit", "spec_method"])
    return MetricTarget(cell, list(rows))


def start(n: int, commit: str, *, value: float | None = None, invalid: str | None = None,
          crash: str | None = None) -> StartRow:
    return StartRow(("r", f"p{n:04d}", 0), commit, value if value is not None else float("nan"), 0.01,
                    invalid=invalid, crash=crash)


def skipped(t: MetricTarget) -> dict[str, str]:
    return {o.commit: o.skip_reason for o in t.observations("spec_decode_acceptance_length") if o.skip_reason}


def test_valid_starts_are_told_as_values_and_invalid_ones_are_not() -> None:
    t = target(start(1, "a", value=2.5), start(2, "b", invalid="the server exited during the load phase"),
               start(3, "b", value=2.4))
    told = t.observations("spec_decode_acceptance_length")
    assert [(o.commit, o.value) for o in told] == [("a", 2.5), ("b", 2.4)]


def test_the_same_crash_twice_makes_the_commit_untestable() -> None:
    assert MAX_SAME_CRASH == 2 < MAX_INVALID
    died = "the server exited during the load phase"
    t = target(*(start(i, "a", invalid=died, crash=CRASH) for i in range(MAX_SAME_CRASH)), start(9, "b", value=2.0))
    assert skipped(t) == {"a": f"the engine crashed in {MAX_SAME_CRASH} starts ({CRASH})"}


def test_one_off_crashes_and_other_invalid_starts_wait_for_max_invalid() -> None:
    died = "the server exited during the load phase"
    # Two crashes with different causes are no pattern of the release: tried until MAX_INVALID.
    mixed = target(start(1, "a", invalid=died, crash=CRASH), start(2, "a", invalid=died, crash="OSError in vllm/x.py:y"))
    assert skipped(mixed) == {}
    stalls = [start(i, "a", invalid="no token for 60 s") for i in range(MAX_INVALID)]
    assert skipped(target(*stalls[:-1])) == {}
    assert skipped(target(*stalls)) == {"a": f"{MAX_INVALID} starts gave no valid spec_decode_acceptance_length: "
                                             "no token for 60 s"}
