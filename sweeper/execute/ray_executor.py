"""The Ray executor: one task per server group, GPUs per cell as a Ray resource.

Connects to an existing cluster (`--address` / `RAY_ADDRESS`, as inside `ray job submit`) or starts
a local one, the embedded default. A local cluster on a machine without GPUs declares logical GPU
slots for simulator cells (Ray allows that), never for real vLLM, which needs the real ones.

A job's repository bundle goes into the object store once and is fetched by a node only when its
cache lacks it. A group lost with its node or worker (Ray's death errors) is submitted again,
`MAX_ATTEMPTS` times at most, and the caller hears of each retry; any other failure of a task is
that group's `error` rows: the sweep goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sweeper.errors import ClusterError
from sweeper.execute.executor import OnRetry, OnStart
from sweeper.execute.runner import GroupJob, GroupResult, error_result, run_group
from sweeper.store import files

# Ray's unix socket paths must stay under 107 bytes: its temp dir has to be short.
RAY_TMP_PREFIX = "/tmp/sweep-ray-"
WAIT_S = 1.0
# A local start sometimes fails ("Failed to register worker to Raylet", ~1 in 24 on 2 busy cores):
# a fresh start nearly always works. Bounded, so a machine where Ray cannot start fails clearly.
INIT_ATTEMPTS = 3
WARM_TIMEOUT_S = 120.0
# Attempts per group when its node or worker dies under it (the first one included).
MAX_ATTEMPTS = 3
FETCH_TIMEOUT_S = 600.0


def _lost_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors for a task whose node or worker died (or whose result died with its node)."""
    from ray import exceptions as rex

    return (rex.NodeDiedError, rex.WorkerCrashedError, rex.LocalRayletDiedError, rex.ObjectLostError,
            rex.OutOfMemoryError)


def _remote_run_group() -> Any:
    import ray

    # max_calls=0: keep the worker process between groups (a fresh one per GPU task costs ~1 s).
    # max_retries=0: a task lost with its node is submitted again by `Cluster.run`, which records it;
    # a failing cell is data, never retried.
    @ray.remote(max_calls=0, max_retries=0, retry_exceptions=False)
    def run_group_task(job: GroupJob) -> GroupResult:
        return run_group(job, fetch=lambda ref: ray.get(ref, timeout=FETCH_TIMEOUT_S))

    return run_group_task


def _task_options(gpus: float) -> dict[str, Any]:
    # A cell mostly waits on its server: it takes no CPU slot unless it takes no GPU either
    # (then the CPU slot is what bounds how many run at once).
    return {"num_gpus": gpus, "num_cpus": 0 if gpus > 0 else 1}


def _warm_task() -> Any:
    import ray

    @ray.remote(max_calls=0, max_retries=0)
    def warm_worker(barrier: str, slots: int) -> int:
        # Imports the first group would pay; then hold this worker until every slot has its own.
        import pandas  # noqa: F401  (pyarrow imports it to build the first table)

        import sweeper.execute.runner  # noqa: F401

        Path(barrier, str(os.getpid())).touch()
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while len(os.listdir(barrier)) < slots and time.monotonic() < deadline:
            time.sleep(0.02)
        return os.getpid()

    return warm_worker


def kill_processes_using(path: str) -> list[int]:
    """Kill the processes whose command line names `path` (a Ray temp dir this process made and
    nothing else uses); returns their pids."""
    import psutil

    me = os.getpid()
    named = re.compile(re.escape(path.rstrip("/")) + r"(?![^/])")  # the folder itself, not a longer name
    victims = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.info["pid"] != me and any(named.search(part) for part in proc.info["cmdline"] or ()):
                victims.append(proc)
        except psutil.Error:
            continue
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=10)
    return [p.pid for p in victims]


def remove_orphan_clusters() -> list[str]:
    """Stop and remove the local clusters of drivers that are gone (a driver killed outright never
    reaches its own clean-up; its Ray temp dir names its pid): their processes are killed by the
    temp dir they run from, then the dir is removed."""
    removed = [str(path) for path in files.orphan_dirs(RAY_TMP_PREFIX)]
    for path in removed:
        kill_processes_using(path)
        shutil.rmtree(path, ignore_errors=True)
    return removed


class _NoTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def quiet_token_notice() -> None:
    """Ray says on every local start that it enabled token authentication (its default): a line on
    every command that tells a user nothing to do. The authentication stays on; only the notice goes."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _NoTokenNotice) for f in logger.filters):
        logger.addFilter(_NoTokenNotice())


@dataclass(frozen=True)
class ClusterInfo:
    address: str
    gpus: float
    max_gpus_per_node: float
    local: bool


class Cluster:
    """A Ray connection for one sweep. Starts (and later stops) a local cluster unless given an address."""

    def __init__(self, address: str | None = None, *, logical_gpus: float | None = None,
                 num_cpus: int | None = None, init_attempts: int = INIT_ATTEMPTS) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.logical_gpus = logical_gpus
        self.num_cpus = num_cpus
        self.init_attempts = max(1, init_attempts)
        self._tmp: str | None = None
        self._started = False
        self._warm = False
        self.warm_pids: set[int] = set()
        self._bundles: dict[str, Any] = {}  # repository bundle digest -> its object in the store
        # Seconds spent starting Ray and pre-starting its workers: the fixed cost of a run.
        self.timings: dict[str, float] = {}

    def __enter__(self) -> Self:
        import ray

        t0 = time.monotonic()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        if ray.is_initialized():
            return self
        if self.address and self.address != "local":
            try:
                ray.init(address=self.address, log_to_driver=False)
            except Exception as exc:  # noqa: BLE001  (Ray raises many types for an unreachable cluster)
                raise ClusterError(f"cannot connect to the Ray cluster at {self.address}: {exc}") from None
        else:
            self._start_local()
        self._started = True
        self.timings["init"] = time.monotonic() - t0
        return self

    def _start_local(self) -> None:
        import ray

        remove_orphan_clusters()
        quiet_token_notice()
        num_cpus = self.num_cpus or os.cpu_count() or 1
        slots = max(num_cpus, int(self.logical_gpus or 0))
        kwargs: dict[str, Any] = {}
        if self.logical_gpus is not None:
            kwargs["num_gpus"] = self.logical_gpus
        # Ray starts at most min(cores, CPUs) workers at once and kills idle ones beyond the CPU
        # count: 8 GPU slots on 2 cores filled only seconds after submission. Let every slot have
        # its worker, started together and kept.
        config = {"worker_maximum_startup_concurrency": slots, "num_workers_soft_limit": slots}
        errors: list[str] = []
        for _ in range(self.init_attempts):
            # A fresh config dict each time: ray.init writes this session's spilling folder into it.
            self._tmp = tempfile.mkdtemp(prefix=f"{RAY_TMP_PREFIX}{os.getpid()}-")
            try:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         _temp_dir=self._tmp, configure_logging=False, _system_config=dict(config), **kwargs)
                return
            except Exception as exc:  # noqa: BLE001  (Ray raises many types for a failed start)
                errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
                self._stop_local()
        raise ClusterError(f"could not start a local Ray cluster ({len(errors)} attempts): {errors[-1]}")

    def _stop_local(self) -> None:
        """Stop this cluster's Ray and remove its temp dir, also after a start that failed halfway:
        whatever still runs from that temp dir was started here and is killed by pid."""
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        if self._tmp:
            kill_processes_using(self._tmp)
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        import ray

        if self._started:
            ray.shutdown()
        if self._tmp:
            self._stop_local()

    def warm(self, gpus_per_cell: float) -> None:
        """Start a worker for every slot of a local cluster before any job is submitted, each with the
        runner's modules imported (pandas included), so the first wave starts at once. Workers that
        ran a GPU task serve only GPU tasks: warm-up tasks ask what the jobs will ask."""
        import ray

        if self._warm or not self._tmp:
            return
        self._warm = True
        t0 = time.monotonic()
        slots = self.free_slots(gpus_per_cell)
        barrier = tempfile.mkdtemp(prefix="warm-", dir=self._tmp)
        opts = _task_options(gpus_per_cell)
        refs = [_warm_task().options(**opts).remote(barrier, slots) for _ in range(slots)]
        with contextlib.suppress(ray.exceptions.GetTimeoutError):
            self.warm_pids = set(ray.get(refs, timeout=WARM_TIMEOUT_S))
        self.timings["warm"] = time.monotonic() - t0

    def info(self) -> ClusterInfo:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        per_node = [float(n.get("Resources", {}).get("GPU", 0.0)) for n in nodes]
        return ClusterInfo(address=self.address or "local", gpus=sum(per_node),
                           max_gpus_per_node=max(per_node, default=0.0), local=not self.address)

    def free_slots(self, gpus_per_cell: float) -> int:
        import ray

        if gpus_per_cell <= 0:
            return max(1, int(ray.available_resources().get("CPU", 1)))
        return int(ray.available_resources().get("GPU", 0.0) // gpus_per_cell)

    def slots(self, gpus_per_cell: float) -> int:
        """Groups the alive nodes can hold at once, node by node (a group never spans nodes). Not
        `free_slots`: right after `warm` Ray still counts the warm-up tasks' GPUs as taken for a
        while, and a bisect planned on that ran one server a round on a 4-slot machine."""
        import ray

        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        if gpus_per_cell <= 0:
            return max(1, int(sum(float(r.get("CPU", 0.0)) for r in nodes)))
        return sum(int(float(r.get("GPU", 0.0)) // gpus_per_cell) for r in nodes)

    def preflight(self, gpus_per_cell: float) -> None:
        """A cell asking for more GPUs than any node has would wait in Ray forever: refuse now.
        Then, on a local cluster, start a worker per slot (`warm`)."""
        info = self.info()
        if gpus_per_cell > info.max_gpus_per_node:
            where = "this machine" if info.local else f"any node of {info.address}"
            raise ClusterError(f"each cell needs {gpus_per_cell:g} GPUs but {where} has at most "
                               f"{info.max_gpus_per_node:g}" + (" (use --gpus N to declare logical slots for "
                                                              "simulator runs)" if info.local else ""))
        self.warm(gpus_per_cell)

    def _shipped(self, job: GroupJob) -> GroupJob:
        """The job as it travels: its repository bundle as an object of the store, put there once."""
        import ray

        source = job.repo
        if source is None or source.digest is None or not isinstance(source.bundle, bytes):
            return job
        if source.digest not in self._bundles:
            self._bundles[source.digest] = ray.put(source.bundle)
        return dataclasses.replace(job, repo=source.with_bundle(self._bundles[source.digest]))

    def run(self, jobs: Sequence[GroupJob], *, on_start: OnStart | None = None,
            on_retry: OnRetry | None = None, timeout_s: float | None = None,
            max_attempts: int = MAX_ATTEMPTS) -> Iterator[tuple[GroupJob, GroupResult]]:
        """Submit every job; yield each (job, result) as it finishes, in completion order, exactly
        once per job. A job lost with its node or worker is submitted again (`on_retry(job, attempt,
        error)` first), up to `max_attempts` in all, then becomes `error` rows, as does a task that
        fails in any other way."""
        import ray

        task = _remote_run_group()
        lost = _lost_errors()
        pending: dict[Any, tuple[GroupJob, int]] = {}

        def submit(job: GroupJob, attempt: int) -> None:
            ref = task.options(**_task_options(job.spec.gpus_per_cell)).remote(self._shipped(job))
            pending[ref] = (job, attempt)

        for job in jobs:
            submit(job, 1)
            if on_start:
                on_start(job)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s or WAIT_S)
                for ref in done:
                    job, attempt = pending.pop(ref)
                    try:
                        result = ray.get(ref, timeout=60)
                    except lost as exc:
                        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
                        if attempt < max_attempts:
                            if on_retry:
                                on_retry(job, attempt + 1, error)
                            submit(job, attempt + 1)
                            continue
                        result = error_result(job, f"lost with its node or worker {attempt} times; last: {error}")
                    except ray.exceptions.TaskCancelledError:
                        raise ClusterError(f"group {job.group.group_id} was cancelled") from None
                    except ray.exceptions.RayError as exc:
                        # Raised outside the runner's own handling (its arguments, its result): the
                        # group's rows say so, with Ray's text (a task's error carries its traceback).
                        text = str(exc)
                        result = error_result(job, f"{type(exc).__name__}: {text}".splitlines()[0][:500], text)
                    yield job, result
        except KeyboardInterrupt:
            # Ctrl-C: leave the tasks to the shutdown that follows; their workers end and each
            # server's guard stops it. (Cancelling a task as it finishes can abort Ray's own core
            # worker, "Tried to complete task that was not pending", which ends the driver uncleanly.)
            pending.clear()
            raise
        finally:
            # On an error: interrupt the remaining tasks gently, so each stops its server.
            for ref in pending:
                ray.cancel(ref, force=False)
            if pending:
                ray.wait(list(pending), num_returns=len(pending), timeout=15)


