"""Which executor runs a matrix's server groups: `--executor ray` (a Ray cluster at `--address` or
RAY_ADDRESS, else a local one: the default) or `--executor local` (threads of this process, no Ray).

The protocol both kinds follow is `sweeper.execute.executor`; this module knows both kinds and hands
a driver the factory that opens one for a matrix, since a local executor's slots depend on what the
matrix runs (logical GPU slots for the simulator, never for real vLLM).
"""

from __future__ import annotations

from enum import StrEnum

from sweeper.errors import ClusterError
from sweeper.execute.executor import Executor, ExecutorFactory
from sweeper.execute.inprocess import InProcess
from sweeper.execute.ray_executor import Cluster
from sweeper.install.registry import kind_of
from sweeper.spec.matrix import Matrix

__all__ = ["DEFAULT_LOGICAL_GPUS", "ExecutorKind", "choose", "logical_gpus"]

# Logical GPU slots a local executor declares for simulator cells when --gpus is not given.
DEFAULT_LOGICAL_GPUS = 4


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
            return InProcess(logical_gpus=logical_gpus(matrix, gpus))

        return local

    def ray(matrix: Matrix) -> Executor:
        return Cluster(address, logical_gpus=logical_gpus(matrix, gpus))

    return ray
