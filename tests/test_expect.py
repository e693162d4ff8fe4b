"""`expect:` bounds: bad input is one line before anything starts; a start outside a bound is a failure
of a named mode that explain sees like any other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sweeper.errors import ConfigError
from sweeper.install.matrix_loader import load_matrix
from sweeper.judge.expectations import evidence, failures
from sweeper.judge.explain import Verdict, classify, explain
from sweeper.judge.metric_names import METRICS
from sweeper.spec.expect import Expectation, parse_expect
from sweeper.spec.yamlfile import Positions
from tests.metricframes import frame, row

ROOT = Path(__file__).resolve().parent.parent
KNOWN = {n: m.higher_is_better for n, m in METRICS.items()}


def _matrix(tmp_path: Path, expect: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"""name: expect
model: M
suite: {ROOT / "suites" / "structured-output.yaml"}
install: {{kind: sim, repo: "sim:demo"}}
axes:
  commit: [v0.27.0, main]
  spec_method: [none, mtp]
expect:
{expect}""")
    return path


def test_bounds_parse_with_their_mode_names(tmp_path: Path) -> None:
    matrix = load_matrix(_matrix(tmp_path, """  spec_decode_acceptance_length: {min: 2.5}
  mean_tpot_ms: {max: 40}
  output_throughput: {max_change: 5%, against: {commit: v0.27.0}}
"""))
    found = parse_expect(matrix.spec.expect, Positions("m", {}), ["v0.27.0", "main"], KNOWN)
    assert [e.mode for e in found] == ["expect:spec_decode_acceptance_length>=2.5", "expect:mean_tpot_ms<=40",
                                      "expect:output_throughput change>=-5% vs v0.27.0"]
    assert found[2].max_change == pytest.approx(0.05)


@pytest.mark.parametrize(("expect", "line", "key", "words"), [
    ("  mean_tpot_msec: {max: 40}\n", 9, "expect.mean_tpot_msec", "unknown metric"),
    ("  mean_tpot_ms:\n    max: forty\n", 10, "expect.mean_tpot_ms.max", "expected a number"),
    ("  mean_tpot_ms: {max: true}\n", 9, "expect.mean_tpot_ms.max", "expected a number"),
    ("  output_throughput:\n    max_change: 5%\n    against: {commit: v0.26.0}\n", 11,
     "expect.output_throughput.against.commit", "not a commit of this matrix"),
    ("  output_throughput: {max_change: 5%}\n", 9, "expect.output_throughput.max_change", "needs both"),
    ("  mean_tpot_ms: {maximum: 4}\n", 9, "expect.mean_tpot_ms.maximum", "unknown bound"),
])
def test_bad_input_is_one_line_naming_file_line_and_key(tmp_path: Path, expect: str, line: int, key: str,
                                                        words: str) -> None:
    path = _matrix(tmp_path, expect)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert (info.value.line, info.value.key) == (line, key)
    assert words in info.value.message


def test_dry_run_refuses_a_bad_bound_before_anything_starts(tmp_path: Path) -> None:
    path = _matrix(tmp_path, "  mean_tpot_ms: {max: forty}\n")
    done = subprocess.run([sys.executable, "-m", "sweeper", "matrix", str(path), "--dry-run"],
                          check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and f"{path}:9: expect.mean_tpot_ms.max: expected a number" in done.stderr
    assert not done.stdout


def _planted(tmp_path: Path) -> tuple[list[dict[str, object]], Path]:
    # TPOT rises past 40 ms only with mtp and async scheduling off; other cells stay near 30.
    rows = []
    for spec in ("none", "mtp"):
        for sync in (True, False):
            for s in range(5):
                for point in ("concurrency=1", "concurrency=8"):
                    slow = spec == "mtp" and not sync
                    rows.append(row({"commit": "main", "spec_method": spec, "async_scheduling": sync}, s, point,
                                    mean_tpot_ms=(45.0 if slow else 30.0) + 0.3 * s))
    rows.append(row({"commit": "main", "spec_method": "none", "async_scheduling": True}, 5, valid=False,
                    reason="server crashed", mean_tpot_ms=900.0))
    return rows, tmp_path / "metrics.parquet"


def test_a_start_outside_a_bound_is_a_failure_explain_names(tmp_path: Path) -> None:
    rows, path = _planted(tmp_path)
    bound = Expectation("mean_tpot_ms", high=40.0)
    found = evidence(frame(rows, path), [bound])
    assert len(found) == 40  # one per valid (cell, start, load point): the invalid start gives none
    per_cell = failures(found)
    slow = [c for c in per_cell if "mtp" in c and "async_scheduling=False" in c]
    assert per_cell[slow[0]] == {"expect:mean_tpot_ms<=40": (10, 10)}
    assert all(v == {"expect:mean_tpot_ms<=40": (0, 10)} for c, v in per_cell.items() if c not in slow)
    modes = {m for m in classify(found, None).mode if m}
    assert modes == {"expect:mean_tpot_ms<=40"}
    (m,) = explain(found).modes
    assert m.mode == "expect:mean_tpot_ms<=40" and m.verdict == Verdict.EXPLAINED
    assert {str(t) for t in m.terms} == {"spec_method=mtp", "async_scheduling=false"}


def test_a_relative_bound_judges_each_start_against_the_baselines_mean(tmp_path: Path) -> None:
    rows = [row({"commit": c, "spec_method": "mtp"}, s, output_throughput=v)
            for c, values in (("v0.27.0", [100.0, 102.0, 98.0]), ("main", [96.0, 94.0, 99.0]))
            for s, v in enumerate(values)]
    bound = Expectation("output_throughput", max_change=0.05, against="v0.27.0", higher_is_better=True)
    found = evidence(frame(rows, tmp_path / "m.parquet"), [bound])
    # Baseline mean 100: 94 is worse than -5 %, 96 and 99 are not; the baseline's own starts are not judged.
    assert sorted(zip(found["value"], found["passed"], strict=True)) == [(94.0, False), (96.0, True), (99.0, True)]
    assert found["failed_checks"].iloc[1] == ["expect:output_throughput change>=-5% vs v0.27.0"]
