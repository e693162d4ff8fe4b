"""The flags an installed vLLM offers, learnt once from `<launch> --help` and cached in its folder.

The help text is parsed by `sweeper.vllm.flags.parse_help` (pure); this module runs the command.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sweeper.errors import ConfigError
from sweeper.store import files
from sweeper.vllm.flags import FlagSet, parse_help

if TYPE_CHECKING:
    from sweeper.install.cache import Installed

FLAGS_FILE = "flags.json"
HELP_TIMEOUT_S = 180.0


def supported_flags(installed: Installed, *, timeout: float = HELP_TIMEOUT_S, refresh: bool = False) -> FlagSet:
    """Ask the environment's vLLM for its flags (`<launch> --help`), cached in its folder.

    Groups of one commit start together on a node: under the folder's lock only the first runs
    `--help` (on real vLLM it imports torch, ~10 s); the others read what it wrote. A `--help` that
    fails or times out raises and is not cached."""
    cache = Path(installed.root) / FLAGS_FILE if installed.root else None
    return files.cached_json(cache, lambda: _ask_help(installed, timeout), decode=FlagSet.from_json,
                             encode=FlagSet.to_json, timeout=timeout, refresh=refresh)


def _ask_help(installed: Installed, timeout: float) -> FlagSet:
    launch = list(installed.launch[:-1] if installed.launch[-1:] == ("--model",) else installed.launch)
    env = {**os.environ, **installed.env}
    if installed.root:  # keep vLLM's caches out of the home folder
        env.setdefault("VLLM_CACHE_ROOT", str(Path(installed.root) / "vllm-cache"))
    text = _help_text([*launch, "--help"], env, timeout)
    flags = parse_help(text, installed.version)
    # Some `vllm serve --help` versions list config groups only; `--help=all` lists every flag.
    if "--port" not in flags or "--max-model-len" not in flags:
        text += "\n" + _help_text([*launch, "--help=all"], env, timeout)
        flags = parse_help(text, installed.version)
    if "--port" not in flags:
        raise ConfigError(f"`{' '.join(launch)} --help` listed no --port flag; is install.launch right? "
                          f"Output: {text[-500:]!r}")
    return flags


def _help_text(argv: list[str], env: Mapping[str, str], timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=dict(env), timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"could not run `{' '.join(argv)}`: {exc}") from exc
    return proc.stdout + "\n" + proc.stderr
