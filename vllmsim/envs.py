"""The simulated version's environment variables, exposed as vLLM exposes its own: `environment_variables`,
a dict from each `VLLM_*` name the version reads to a function returning its value (vllm/envs.py).

The version is the tree's (`SWEEP_SIM_TREE`): `python -c "import vllmsim.envs as e; print(list(e.environment_variables))"`
in a simulator environment answers what `import vllm.envs` answers in a real one. Names set but not
listed here are warned about at start-up as vLLM does ("Unknown vLLM environment variable detected").
"""

from __future__ import annotations

import os
from collections.abc import Callable

from vllmsim.tree import Tree, load

# Read by every simulated release (a subset of real vLLM's list, the names the sweeper and its users touch).
_ALWAYS = (
    "VLLM_USE_V2_MODEL_RUNNER", "VLLM_LOGGING_LEVEL", "VLLM_CACHE_ROOT", "VLLM_HOST_IP", "VLLM_PORT",
    "VLLM_API_KEY", "VLLM_CPU_KVCACHE_SPACE", "VLLM_USE_PRECOMPILED", "VLLM_CONFIGURE_LOGGING",
    "VLLM_LOGGING_STREAM", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_SERVER_DEV_MODE", "VLLM_TARGET_DEVICE",
    "VLLM_CONFIG_ROOT", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "VLLM_ENGINE_ITERATION_TIMEOUT_S",
    "VLLM_RPC_TIMEOUT", "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_LOGGING_PREFIX", "VLLM_LOGGING_CONFIG_PATH",
)
# (first release that reads it, name): strict tool calling arrived in 0.24.
_SINCE = (((0, 24, 0), "VLLM_ENFORCE_STRICT_TOOL_CALLING"),)


def _getter(name: str) -> Callable[[], str | None]:
    return lambda: os.environ.get(name)


def names_for(release: tuple[int, int, int]) -> tuple[str, ...]:
    """The `VLLM_*` names a simulated release reads."""
    return _ALWAYS + tuple(name for since, name in _SINCE if release >= since)


def variables(tree: Tree) -> dict[str, Callable[[], str | None]]:
    return {name: _getter(name) for name in names_for(tree.release)}


def __getattr__(name: str) -> dict[str, Callable[[], str | None]]:
    # Read on first use, not at import: the simulator's other commands import this module too.
    if name == "environment_variables":
        return variables(load())
    raise AttributeError(name)
