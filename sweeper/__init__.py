"""sweep: which vLLM serving configurations break, and which vLLM commit broke them.

The library's way in is these five functions; the `sweep` command line calls the same drivers.
A run is stored under `runs_dir` (a folder or a filesystem URI) and handed back as a `Run` (`sweeper.reports.run.Run`):

>>> import sweeper
>>> run = sweeper.run_matrix("matrices/demo.yaml", runs_dir=runs_dir, executor="local")
>>> run.kind, len(run.cells())
('matrix', 48)
>>> sorted(run.cells().query("n_failed > 0")["spec_method"].unique())
['mtp']
>>> run.duckdb().sql("select count(*) > 0 from samples where not passed").fetchall()
[(True,)]
>>> for mode in run.explain().modes:
...     print(" & ".join(f"{t.axis}={t.value}" for t in mode.terms), "|", mode.mode)
spec_method=mtp | finish_reason + no_whitespace_tail
spec_method=mtp | finish_reason + log_absent(Failed to advance FSM) + no_whitespace_tail
spec_method=mtp & env.VLLM_USE_V2_MODEL_RUNNER=1 | content_nonempty + finish_reason + reasoning_tokens_at_most
>>> sweeper.open_run(runs_dir=runs_dir).run_id == run.run_id
True

`executor` is "ray" (a local Ray cluster, or the one at `address` / RAY_ADDRESS) or "local" (threads
of this process: tests, one box). Every other keyword goes to the driver as the CLI's flag of the
same name does (see `sweep matrix --help`, `sweep bisect --help`, `sweep triage --help`).
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.store.manifest import SWEEPER_VERSION

if TYPE_CHECKING:
    from sweeper.execute.executor import ExecutorFactory
    from sweeper.reports.run import Run
    from sweeper.store.location import Location

__version__ = SWEEPER_VERSION
__all__ = ["Run", "__version__", "bisect", "open_run", "run_matrix", "triage"]


def _executor(executor: str, address: str | None, gpus: float | None) -> ExecutorFactory:
    from sweeper.execute.choice import choose

    return choose(executor, address=address, gpus=gpus)


def run_matrix(matrix: str | Path, *, runs_dir: str | Path = "runs", executor: str = "ray",
               address: str | None = None, gpus: float | None = None, **options: Any) -> Run:
    """Run a matrix file (`sweep matrix`): its design, zoom and budget as the file and `options`
    (`run_id`, `resume`, `design_spec`, `adaptive`, `budget_hours`, `cache_dir`) say."""
    from sweeper.drivers import sweep
    from sweeper.reports.run import Run

    outcome = sweep.run_matrix(matrix, runs_dir=runs_dir, executor=_executor(executor, address, gpus), **options)
    return Run(outcome.run)


def bisect(good: str, bad: str, *, matrix: str | Path | None = None, where: Sequence[str] = (),
           from_run: str | None = None, runs_dir: str | Path = "runs", executor: str = "ray",
           address: str | None = None, gpus: float | None = None, **options: Any) -> Run:
    """Find every change between `good` and `bad` (`sweep bisect`): of the cell of `matrix` that
    `where` picks, or of every cell of the sweep `from_run` (default: the latest sweep) that fails
    differently at bad. `options` are `BisectOptions`' fields (`parallel`, `budget_h`, ...).
    With `metric` (`sweep bisect --metric`): every change of that serving metric larger than
    `min_effect` (a fraction, default 0.03) at `load_point`; `options` are `MetricBisectOptions`' fields."""
    from sweeper.drivers.bisect import BisectOptions, BisectScope, run_bisect
    from sweeper.reports.run import Run

    scope = BisectScope(good, bad, Path(matrix) if matrix is not None else None, from_run, tuple(where))
    metric = options.pop("metric", None)
    if metric is not None:
        from sweeper.drivers.metric_bisect import MetricBisectOptions, run_metric_bisect

        done = run_metric_bisect(scope, MetricBisectOptions(metric=metric, runs_dir=runs_dir, **options),
                                 executor=_executor(executor, address, gpus))
        return Run(done.run)
    outcome = run_bisect(scope, BisectOptions(runs_dir=runs_dir, **options),
                         executor=_executor(executor, address, gpus))
    return Run(outcome.run)


def triage(matrix: str | Path, good: str, bad: str, *, runs_dir: str | Path = "runs", executor: str = "ray",
           address: str | None = None, gpus: float | None = None, **options: Any) -> Run:
    """From a matrix and a commit range to one bug report per failure mode (`sweep triage`).
    `options` are `TriageOptions`' fields (`design`, `budget_h`, `expect_changes`, ...)."""
    from sweeper.drivers.triage import TriageOptions, TriageScope, run_triage
    from sweeper.reports.run import Run

    outcome = run_triage(TriageScope(Path(matrix), good, bad), TriageOptions(runs_dir=runs_dir, **options),
                         executor=_executor(executor, address, gpus))
    return Run(outcome.run)


def open_run(run_id: str | None = None, *, runs_dir: str | os.PathLike[str] | Location = "runs",
             kind: str | None = None) -> Run:
    """A stored run to read: `run_id`, or the latest run (of `kind`: "sweep", "bisect", "triage")."""
    from sweeper.reports.run import open_stored

    return open_stored(run_id, runs_dir=runs_dir, kind=kind)


class _Package(types.ModuleType):
    """This package, keeping `sweeper.bisect` the library's function. Python's import sets a subpackage
    it loads as an attribute of its parent: the first import of the search (`sweeper/bisect/`, reached by
    `from sweeper.bisect.search import ...`) would otherwise replace the function, so that a second
    `sweeper.bisect(...)` in one process called a module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "bisect" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    # `sweeper.Run` without importing the readers (pandas, DuckDB) on `import sweeper`.
    if name == "Run":
        from sweeper.reports.run import Run

        return Run
    raise AttributeError(f"module 'sweeper' has no attribute {name!r}")
