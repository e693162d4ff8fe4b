"""The executor seam: where server groups run, behind one small protocol.

A driver (sweep, bisect) hands group jobs to an executor and stores what comes back; it never knows
whether they ran as Ray tasks over a cluster (`sweeper.execute.ray_executor.Cluster`, the default) or in this
process (`sweeper.execute.inprocess.InProcess`: tests, one box without Ray, debugging). The CLI chooses
one by name (`sweeper.execute.choice`); a driver receives a factory that opens it for the matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self

if TYPE_CHECKING:
    from sweeper.execute.runner import GroupJob, GroupResult
    from sweeper.spec.matrix import Matrix

OnStart = Callable[["GroupJob"], None]
OnRetry = Callable[["GroupJob", int, str], None]


class Executor(Protocol):
    """Runs group jobs and yields each (job, result) once, in completion order."""

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def preflight(self, gpus_per_cell: float) -> None:
        """Refuse now (ClusterError) what could never be scheduled; get ready to run."""

    def free_slots(self, gpus_per_cell: float) -> int:
        """How many groups of `gpus_per_cell` GPUs can run at once right now."""

    def slots(self, gpus_per_cell: float) -> int:
        """How many groups of `gpus_per_cell` GPUs the whole cluster can run at once: its capacity,
        not what happens to be free this instant (a round of a bisect is planned on it)."""

    def run(self, jobs: Sequence[GroupJob], *, on_start: OnStart | None = None,
            on_retry: OnRetry | None = None) -> Iterator[tuple[GroupJob, GroupResult]]:
        """Run every job; a failure of a job is its `error` rows, never an exception here."""


ExecutorFactory = Callable[["Matrix"], Executor]
