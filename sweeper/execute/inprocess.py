"""The in-process executor: server groups run in threads of this process, no Ray.

For tests (the fast tier drives the sweep and bisect through it), a single box without a cluster
(`--executor local`), and debugging (a breakpoint in the runner is hit here). Each slot is a
thread running one group at a time; a group mostly waits on its server, so threads are enough.

GPUs: with logical slots (the simulator) every slot is one of them; otherwise the machine's own
GPUs (nvidia-smi) are handed out by index, each group's server seeing only its own
(`CUDA_VISIBLE_DEVICES`), as Ray does for its tasks.

A server's guard is started by the slot's thread and watches it (PR_SET_PDEATHSIG follows the
thread, not the process): the thread lives until its group's server has stopped. Threads are
daemons: after Ctrl-C the process exits without waiting for them, and each guard stops its server.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import threading
import traceback
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Self

from sweeper.errors import ClusterError
from sweeper.execute.executor import OnRetry, OnStart
from sweeper.execute.runner import GroupJob, GroupResult, error_result, run_group

# How often the driver's thread wakes while waiting, so that Ctrl-C is seen promptly.
WAIT_S = 0.5


def deal_devices(devices: Sequence[str] | None, *, slots: int, per_cell: float) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES per slot: slot i owns the physical devices [i*n, (i+1)*n), n GPUs per
    cell, so no two servers share one. Logical slots (`devices` None) and GPU-less cells get none."""
    n = math.ceil(per_cell) if per_cell > 0 else 0
    if devices is None or n == 0:
        return [None] * slots
    return [",".join(devices[i * n:(i + 1) * n]) for i in range(slots)]


class InProcess:
    """Runs group jobs in this process, `free_slots` of them at once."""

    def __init__(self, *, logical_gpus: float | None = None, devices: Sequence[str] | None = None,
                 cpus: int | None = None) -> None:
        self.logical_gpus = logical_gpus
        self._devices = list(devices) if devices is not None else None
        self.cpus = cpus or os.cpu_count() or 1
        self._stop = threading.Event()

    @property
    def devices(self) -> list[str]:
        if self._devices is None:
            from sweeper.execute.fingerprint import gpu_info

            self._devices = [str(i) for i in range(len(gpu_info()))]
        return self._devices

    def __enter__(self) -> Self:
        self._stop.clear()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()

    def capacity(self) -> float:
        return self.logical_gpus if self.logical_gpus is not None else float(len(self.devices))

    def preflight(self, gpus_per_cell: float) -> None:
        if gpus_per_cell > self.capacity():
            raise ClusterError(f"each cell needs {gpus_per_cell:g} GPUs but this machine has {self.capacity():g}"
                               + (" (use --gpus N to declare logical slots for simulator runs)"
                                  if self.logical_gpus is None else ""))

    def free_slots(self, gpus_per_cell: float) -> int:
        if gpus_per_cell <= 0:
            return self.cpus
        return int(self.capacity() // gpus_per_cell)

    def slots(self, gpus_per_cell: float) -> int:
        return self.free_slots(gpus_per_cell)

    def run(self, jobs: Sequence[GroupJob], *, on_start: OnStart | None = None,
            on_retry: OnRetry | None = None) -> Iterator[tuple[GroupJob, GroupResult]]:
        """Every job once; a group that raises outside the runner's own handling is its `error`
        rows. Nothing here is lost with a node, so `on_retry` is never called."""
        if not jobs:
            return
        self._stop.clear()
        per_cell = max(j.spec.gpus_per_cell for j in jobs)
        slots = max(1, min(len(jobs), self.free_slots(per_cell)))
        todo: queue.Queue[GroupJob] = queue.Queue()
        for job in jobs:
            todo.put(job)
        done: queue.Queue[tuple[GroupJob, GroupResult]] = queue.Queue()
        dealt = deal_devices(None if self.logical_gpus is not None else self.devices, slots=slots, per_cell=per_cell)
        threads = []
        for i, devices in enumerate(dealt):
            t = threading.Thread(target=self._slot, args=(todo, done, devices, on_start), daemon=True,
                                 name=f"sweep-slot-{i}")
            t.start()
            threads.append(t)
        try:
            for _ in range(len(jobs)):
                while True:
                    try:
                        item = done.get(timeout=WAIT_S)
                        break
                    except queue.Empty:
                        if not any(t.is_alive() for t in threads):
                            raise ClusterError("the in-process executor's threads ended with groups left") from None
                yield item
        finally:
            # Ctrl-C or an error in the caller: no slot takes another group.
            self._stop.set()

    def _slot(self, todo: queue.Queue[GroupJob], done: queue.Queue[tuple[GroupJob, GroupResult]],
              devices: str | None, on_start: OnStart | None) -> None:
        while not self._stop.is_set():
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            if on_start:
                on_start(job)
            shipped = dataclasses.replace(job, devices=devices) if devices is not None else job
            try:
                result = run_group(shipped)
            except BaseException as exc:  # noqa: BLE001  (the driver must hear of every job)
                trace = "".join(traceback.format_exception(exc))
                result = error_result(job, f"{type(exc).__name__}: {exc}".splitlines()[0][:500], trace)
            done.put((job, result))
