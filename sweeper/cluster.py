"""Ray fan-out: one task per server group, GPUs per cell as a Ray resource.

Connects to an existing cluster (`--address` / `RAY_ADDRESS`) or starts a local one, the embedded
default. A local cluster on a machine without GPUs declares logical GPU slots for simulator cells
(Ray allows that), never for real vLLM, which needs the real ones.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from sweeper.errors import ClusterError
from sweeper.runner import GroupJob, GroupResult, run_group

# Ray's unix socket paths must stay under 107 bytes: its temp dir has to be short.
_RAY_TMP_PREFIX = "/tmp/sweep-ray-"
WAIT_S = 1.0


def _remote_run_group() -> Any:
    import ray

    # max_calls=0: keep the worker process between groups (a fresh one per GPU task costs ~1 s).
    # max_retries: a task lost with its node is retried elsewhere; a failing cell is data, not retried.
    @ray.remote(max_calls=0, max_retries=2, retry_exceptions=False)
    def run_group_task(job: GroupJob) -> GroupResult:
        return run_group(job)

    return run_group_task


@dataclass(frozen=True)
class ClusterInfo:
    address: str
    gpus: float
    max_gpus_per_node: float
    local: bool


class Cluster:
    """A Ray connection for one sweep. Starts (and later stops) a local cluster unless given an address."""

    def __init__(self, address: str | None = None, *, logical_gpus: float | None = None,
                 num_cpus: int | None = None) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.logical_gpus = logical_gpus
        self.num_cpus = num_cpus
        self._tmp: str | None = None
        self._started = False

    def __enter__(self) -> Cluster:
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        if ray.is_initialized():
            return self
        if self.address and self.address != "local":
            try:
                ray.init(address=self.address, log_to_driver=False)
            except Exception as exc:  # Ray raises many types for an unreachable cluster
                raise ClusterError(f"cannot connect to the Ray cluster at {self.address}: {exc}") from None
        else:
            self._tmp = tempfile.mkdtemp(prefix=_RAY_TMP_PREFIX)
            kwargs: dict[str, Any] = {}
            if self.logical_gpus is not None:
                kwargs["num_gpus"] = self.logical_gpus
            ray.init(address="local", num_cpus=self.num_cpus or os.cpu_count() or 1, include_dashboard=False,
                     log_to_driver=False, _temp_dir=self._tmp, configure_logging=False, **kwargs)
        self._started = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        import ray

        if self._started:
            ray.shutdown()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def info(self) -> ClusterInfo:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        per_node = [float(n.get("Resources", {}).get("GPU", 0.0)) for n in nodes]
        return ClusterInfo(address=self.address or "local", gpus=sum(per_node),
                           max_gpus_per_node=max(per_node, default=0.0), local=not self.address)

    def free_gpu_slots(self, gpus_per_cell: float) -> int:
        import ray

        if gpus_per_cell <= 0:
            return max(1, int(ray.available_resources().get("CPU", 1)))
        return int(ray.available_resources().get("GPU", 0.0) // gpus_per_cell)

    def preflight(self, gpus_per_cell: float) -> None:
        """A cell asking for more GPUs than any node has would wait in Ray forever: refuse now."""
        info = self.info()
        if gpus_per_cell > info.max_gpus_per_node:
            where = "this machine" if info.local else f"any node of {info.address}"
            raise ClusterError(f"each cell needs {gpus_per_cell:g} GPUs but {where} has at most "
                               f"{info.max_gpus_per_node:g}" + (" (use --gpus N to declare logical slots for "
                                                              "simulator runs)" if info.local else ""))

    def run(self, jobs: Sequence[GroupJob], *, on_start: Callable[[GroupJob], None] | None = None,
            timeout_s: float | None = None) -> Iterator[tuple[GroupJob, GroupResult]]:
        """Submit every job; yield each (job, result) as it finishes, in completion order."""
        import ray

        task = _remote_run_group()
        pending: dict[Any, GroupJob] = {}
        for job in jobs:
            gpus = job.spec.gpus_per_cell
            # A cell mostly waits on its server: it takes no CPU slot unless it takes no GPU either
            # (then the CPU slot is what bounds how many run at once).
            opts: dict[str, Any] = {"num_gpus": gpus, "num_cpus": 0 if gpus > 0 else 1}
            pending[task.options(**opts).remote(job)] = job
            if on_start:
                on_start(job)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s or WAIT_S)
                for ref in done:
                    job = pending.pop(ref)
                    try:
                        yield job, ray.get(ref, timeout=60)
                    except ray.exceptions.RayError as exc:
                        raise ClusterError(f"group {job.group.group_id} was lost: {exc}".splitlines()[0]) from None
        finally:
            # On Ctrl-C or an error: interrupt the remaining tasks gently, so each stops its server.
            for ref in pending:
                ray.cancel(ref, force=False)
            if pending:
                ray.wait(list(pending), num_returns=len(pending), timeout=15)


