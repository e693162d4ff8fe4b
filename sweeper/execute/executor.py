"""The executor seam: where server groups run, behind one small protocol.

A driver (sweep, bisect) hands group jobs to an executor and stores what comes back; it never knows
whether they ran as Ray tasks over a cluster (`sweeper.execute.ray_executor.Cluster`, the default) or in this
process (`sweeper.execute.inprocess.InProcess`: tests, one box without Ray, debugging). The CLI chooses
one by name; a driver receives a factory that opens it for the matrix, since a local executor's
slots depend on what the matrix runs (logical GPU slots for the simulator, never for real vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from enum import StrEnum
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self

from sweeper.errors import ClusterError
from sweeper.install.registry import kind_of

if TYPE_CHECKING:
    from sweeper.execute.runner import GroupJob, GroupResult
    from sweeper.spec.matrix import Matrix

# Logical GPU slots a local executor declares for simulator cells when --gpus is not given.
DEFAULT_LOGICAL_GPUS = 4

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


class ExecutorKind(StrEnum):
    RAY = "ray"
    LOCAL = "local"


def logical_gpus(matrix: Matrix, gpus: float | None) -> float | None:
    """GPU slots a local executor declares: for the simulator (default 4), never for real vLLM
    (the install kind says which it is)."""
    if kind_of(matrix.spec.install.kind).logical_gpus:
        return gpus if gpus is not None else DEFAULT_LOGICAL_GPUS
    return gpus


def choose(kind: ExecutorKind | str = ExecutorKind.RAY, *, address: str | None = None,
           gpus: float | None = None) -> ExecutorFactory:
    """The factory for `--executor KIND`: Ray (a cluster at `address`/RAY_ADDRESS, else a local
    one) or in-process. `gpus` declares logical GPU slots for simulator runs."""
    try:
        kind = ExecutorKind(kind)
    except ValueError:
        raise ClusterError(f"--executor {kind!r}: expected one of {', '.join(k.value for k in ExecutorKind)}") from None
    if kind is ExecutorKind.LOCAL:
        if address:
            raise ClusterError("--address names a Ray cluster; it cannot be used with --executor local")

        def local(matrix: Matrix) -> Executor:
            from sweeper.execute.inprocess import InProcess

            return InProcess(logical_gpus=logical_gpus(matrix, gpus))

        return local

    def ray(matrix: Matrix) -> Executor:
        from sweeper.execute.ray_executor import Cluster

        return Cluster(address, logical_gpus=logical_gpus(matrix, gpus))

    return ray
