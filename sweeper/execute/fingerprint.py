"""Where a cell ran: vLLM, torch and CUDA versions of its environment, GPU and driver, CPU, host.

Queried once per environment (the `torch_build` probe run by the environment's Python, `nvidia-smi`
when present) and cached in the environment's folder: the host part is re-read every time, it is cheap.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from sweeper.install import probes
from sweeper.install.cache import Installed
from sweeper.store import files

CACHE_FILE = "fingerprint.json"


@dataclass(frozen=True)
class Fingerprint:
    vllm_version: str | None
    torch_version: str | None
    cuda_version: str | None
    gpu_name: str | None
    gpu_driver: str | None
    gpu_count: int
    cpu_model: str | None
    hostname: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def fingerprint(installed: Installed, *, timeout: float = 120.0) -> Fingerprint:
    env_part = _cached_env_part(installed, timeout)
    gpus = gpu_info()
    return Fingerprint(vllm_version=installed.version or env_part.get("vllm"), torch_version=env_part.get("torch"),
                       cuda_version=env_part.get("cuda"), gpu_name=gpus[0][0] if gpus else None,
                       gpu_driver=gpus[0][1] if gpus else None, gpu_count=len(gpus), cpu_model=cpu_model(),
                       hostname=socket.gethostname())


def collect(installed: Installed) -> dict[str, object]:
    """`fingerprint()` as a dict (the columns of a cell row)."""
    return fingerprint(installed).as_dict()


class _ProbeFailed(Exception):
    """The environment's Python did not answer: this time's fingerprint lacks torch and CUDA, and
    nothing is cached, so the next group asks again."""


def _cached_env_part(installed: Installed, timeout: float) -> dict[str, str | None]:
    cache = Path(installed.root) / CACHE_FILE if installed.root else None
    try:
        # Groups of one commit finish together: under the lock only the first probe imports torch.
        return files.cached_json(cache, lambda: _probe(installed, timeout), decode=_decode, encode=dict,
                                 timeout=timeout)
    except _ProbeFailed:
        return {"torch": None, "cuda": None}


def _decode(data: object) -> dict[str, str | None]:
    if not isinstance(data, dict) or not all(v is None or isinstance(v, str) for v in data.values()):
        raise ValueError("not a fingerprint")
    return {str(k): v for k, v in data.items()}


def _probe(installed: Installed, timeout: float) -> dict[str, str | None]:
    part: dict[str, str | None] = {"torch": None, "cuda": None}
    if not installed.python:
        return part  # nothing to ask: a known answer, cached like any other
    try:
        # The `torch_build` probe reads torch's version without importing vLLM; torch's import (for
        # its CUDA version) is the slow part, a few seconds.
        proc = subprocess.run(probes.argv(installed.python, "torch_build", "torch"), capture_output=True, text=True,
                              timeout=timeout,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")},
                              check=False)
        if proc.returncode != 0:
            raise _ProbeFailed(f"exit code {proc.returncode}")
        part.update(_decode(json.loads(proc.stdout.strip().splitlines()[-1])))
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        raise _ProbeFailed(str(exc)) from exc
    return part


def gpu_info() -> list[tuple[str, str]]:
    """(name, driver) per GPU from nvidia-smi; empty without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [tuple(x.strip() for x in line.rsplit(",", 1)) for line in proc.stdout.splitlines() if "," in line]
    return [(r[0], r[1]) for r in rows] if proc.returncode == 0 else []


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None
