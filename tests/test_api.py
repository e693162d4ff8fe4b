"""The library's way in: the example in `sweeper`'s docstring runs as written, and the API's shape."""

from __future__ import annotations

import doctest
import inspect
from pathlib import Path

import pytest

import sweeper

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.full
def test_the_package_docstring_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The example names `matrices/demo.yaml` as a user in the checkout would; its runs go to tmp_path.
    monkeypatch.chdir(ROOT)
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(sweeper, "sweeper", globs={"runs_dir": str(tmp_path / "runs")})
    assert tests and tests[0].examples, "the package docstring holds no example"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted >= 6, result


def test_the_api_is_the_documented_five_and_each_says_what_it_does() -> None:
    assert set(sweeper.__all__) == {"Run", "__version__", "bisect", "open_run", "run_matrix", "triage"}
    for name in ("bisect", "open_run", "run_matrix", "triage"):
        assert inspect.getdoc(getattr(sweeper, name)), name
    assert sweeper.Run.__name__ == "Run" and inspect.getdoc(sweeper.Run)


def test_open_run_on_nothing_stored_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(sweeper.errors.SweepError):
        sweeper.open_run(runs_dir=tmp_path)
