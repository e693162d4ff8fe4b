"""From a cell to a `vllm serve` command line, for the flags the installed vLLM really has. Pure.

The flags a version offers are parsed from its `--help` text (`parse_help`; asking an environment
for that text is `sweeper.install.supported`'s job). A flag the version lacks is translated where vLLM
renamed it (`RENAMES`), or refused with a clear error before any server starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sweeper.errors import ConfigError
from sweeper.spec.matrix import Cell

# The vLLM release that introduced a flag, for a message that says which version to use.
INTRODUCED: Mapping[str, str] = {
    "--tool-strict-level": "0.31",
    "--structured-outputs-config": "0.10.2",
    "--attention-backend": "0.11",
    "--async-scheduling": "0.10",
    "--no-async-scheduling": "0.11",
    "--speculative-config": "0.7",
    "--reasoning-parser": "0.7.1",
}


@dataclass(frozen=True)
class FlagSet:
    """The long flags one vLLM version's `serve` accepts (`--no-x` forms included), with their choices."""

    flags: frozenset[str]
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    version: str | None = None

    def __contains__(self, flag: object) -> bool:
        return isinstance(flag, str) and _norm(flag) in self.flags

    def to_json(self) -> dict[str, Any]:
        return {"flags": sorted(self.flags), "choices": {k: list(v) for k, v in self.choices.items()},
                "version": self.version}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FlagSet:
        return cls(frozenset(data["flags"]), {k: tuple(v) for k, v in data.get("choices", {}).items()},
                   data.get("version"))


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    env: dict[str, str]


class Program(Protocol):
    """What starts a server: an installed environment (`sweeper.install.cache.Installed`), or a
    plain command such as the `vllm serve` a bug report shows (`Command`)."""

    @property
    def launch(self) -> tuple[str, ...]: ...  # argv before the model

    @property
    def env(self) -> Mapping[str, str]: ...  # extra server environment

    @property
    def version(self) -> str | None: ...  # vLLM version string, where known


@dataclass(frozen=True)
class Command:
    """A plain command line that starts vLLM's server, with no environment behind it."""

    launch: tuple[str, ...] = ("vllm", "serve")
    env: Mapping[str, str] = field(default_factory=dict)
    version: str | None = None


# --- learning the flags ---------------------------------------------------------------------------

_USAGE_OPT = re.compile(r"\[(--[A-Za-z0-9][\w.-]*)(?:[ =](\{[^}]*\})?[^\]|]*)?(?:\s*\|\s*(--[\w.-]+))?")
_BODY_OPT = re.compile(r"^\s{1,8}(-{1,2}[A-Za-z0-9][\w.-]*(?:[ =][^,\s]+)?(?:,\s*-{1,2}[A-Za-z0-9][\w.-]*"
                       r"(?:[ =][^,\s]+)?)*)", re.MULTILINE)
# Choices followed by "or name registered in --x-plugin" are open-ended: not recorded.
_CHOICES = re.compile(r"(--[\w.-]+)[ =]\{([^}]*)\}(?! or )")


def parse_help(text: str, version: str | None = None) -> FlagSet:
    """The flags in argparse help text: the usage block and option lines (`--x, -x`, `--x | --no-x`)."""
    flags: set[str] = set()
    choices: dict[str, tuple[str, ...]] = {}
    for m in _USAGE_OPT.finditer(text):
        flags.add(_norm(m.group(1)))
        if m.group(3):
            flags.add(_norm(m.group(3)))
    for m in _BODY_OPT.finditer(text):
        for part in re.split(r",\s*", m.group(1)):
            name = part.split()[0].split("=")[0]
            if name.startswith("--"):
                flags.add(_norm(name))
    for m in _CHOICES.finditer(text):
        choices.setdefault(_norm(m.group(1)), tuple(c.strip() for c in m.group(2).split(",") if c.strip()))
    flags.discard("--help")
    return FlagSet(frozenset(flags), choices, version)


# --- from a cell to argv ----------------------------------------------------------------------------

Translation = Callable[[Any, FlagSet], "tuple[list[str], dict[str, str]] | None"]


def _attention_env(value: Any, have: FlagSet) -> tuple[list[str], dict[str, str]] | None:
    # Before --attention-backend existed, vLLM read the backend from this variable.
    return [], {"VLLM_ATTENTION_BACKEND": str(value)}


def _attention_config(value: Any, have: FlagSet) -> tuple[list[str], dict[str, str]] | None:
    if "--attention-config" in have:
        return ["--attention-config", json.dumps({"backend": value})], {}
    return None


def _guided_decoding(value: Any, have: FlagSet) -> tuple[list[str], dict[str, str]] | None:
    # --structured-outputs-config replaced --guided-decoding-backend (+ -disable-any-whitespace).
    conf = value if isinstance(value, Mapping) else json.loads(str(value))
    if "--guided-decoding-backend" not in have:
        return None
    argv: list[str] = []
    if "backend" in conf:
        argv += ["--guided-decoding-backend", str(conf["backend"])]
    for key, val in conf.items():
        if key == "backend":
            continue
        flag = "--guided-decoding-" + key.replace("_", "-")
        if flag not in have:
            return None
        if val is True:
            argv.append(flag)
        elif val is not False:
            argv += [flag, str(val)]
    return argv, {}


def _old_async(value: Any, have: FlagSet) -> tuple[list[str], dict[str, str]] | None:
    # Versions with only `--async-scheduling` (off by default) have no `--no-` form: leave it out.
    if value is False and "--async-scheduling" in have:
        return [], {}
    return None


# flag the sweeper wants -> translations to try, in order, when the version lacks it.
RENAMES: Mapping[str, tuple[Translation, ...]] = {
    "--attention-backend": (_attention_config, _attention_env),
    "--structured-outputs-config": (_guided_decoding,),
    "--no-async-scheduling": (_old_async,),
}


def serve_command(cell: Cell, *, model: str, spec_config: Mapping[str, Mapping[str, Any]] | None,
                  installed: Program, host: str, port: int, api_key: str | None,
                  supported: FlagSet | None = None) -> Launch:
    """argv + env that start `cell`'s server; ConfigError when this vLLM lacks a flag the cell needs."""
    wanted: list[tuple[str, Any]] = []
    spec = cell.speculative_config(spec_config)
    if spec is not None:
        wanted.append(("--speculative-config", spec))
    if cell.async_scheduling is not None:
        wanted.append(("--async-scheduling" if cell.async_scheduling else "--no-async-scheduling", True))
    if cell.attention_backend:
        wanted.append(("--attention-backend", cell.attention_backend))
    wanted.extend((flag, value) for flag, value in cell.serve.items())

    argv = [*installed.launch, model, "--host", host, "--port", str(port)]
    if api_key:
        argv += ["--api-key", api_key]
    env = {**installed.env, **cell.env}
    for flag, value in wanted:
        if value is None or value is False:
            continue
        extra_argv, extra_env = _render(flag, value, supported, cell, installed)
        argv += extra_argv
        env.update(extra_env)
    return Launch(tuple(argv), env)


def _render(flag: str, value: Any, have: FlagSet | None, cell: Cell,
            installed: Program) -> tuple[list[str], dict[str, str]]:
    base = _norm(flag.split(".", 1)[0]) if "." in flag else _norm(flag)
    if have is None or base in have:
        _check_choice(flag, value, have, cell, installed)
        return _flag_argv(flag, value), {}
    for translate in RENAMES.get(base, ()):
        out = translate(False, have) if base == "--no-async-scheduling" else translate(value, have)
        if out is not None:
            return out
    since = INTRODUCED.get(base)
    need = f"needs vLLM >= {since}" if since else "is not offered"
    version = have.version or installed.version or "(unknown version)"
    raise ConfigError(f"{flag} {need}; commit {cell.commit} has vLLM {version}",
                      key=f"cell {cell.cell_id}")


def _check_choice(flag: str, value: Any, have: FlagSet | None, cell: Cell, installed: Program) -> None:
    allowed = have.choices.get(_norm(flag)) if have else None
    if allowed and value is not True and str(value) not in allowed and "None" not in allowed:
        raise ConfigError(f"{flag} {value!r} is not one of {', '.join(allowed)} in vLLM "
                          f"{installed.version or '(unknown version)'} (commit {cell.commit})",
                          key=f"cell {cell.cell_id}")


def _flag_argv(flag: str, value: Any) -> list[str]:
    if value is True:
        return [flag]
    if isinstance(value, (Mapping, list)):
        return [flag, json.dumps(value, separators=(",", ":"))]
    return [flag, str(value)]


def _norm(flag: str) -> str:
    # vLLM's parser accepts `--flag_name` for `--flag-name`.
    return "--" + flag.lstrip("-").replace("_", "-") if flag.startswith("--") else flag
