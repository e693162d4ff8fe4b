"""The simulated vLLM source tree at one commit: what `sim.yaml` declares about that commit.

`SWEEP_SIM_TREE` names a directory (a checkout of a repository made by `sweep sim make-repo`,
or any folder) whose `sim.yaml` says how the vLLM of that commit behaves. Unset, the simulator
is the latest version with no bugs. The format, every key optional:

```yaml
version: "0.28.1.dev130"      # what logs and --version print; in a git checkout without a
                              # "+g<sha>" local part, "+g<short sha of HEAD>" is appended the
                              # way setuptools-scm does for real vLLM
install: ok                   # or "fail: <message>": the installer refuses this commit
startup_s: 1.0                # seconds from start until the API server listens
token_latency_s: 0.001        # seconds per generated token
bugs:                         # each entry: effect (required), id, when, rate, rate_sd,
                              # after_requests, message
  - id: fsm-whitespace
    effect: fsm_whitespace    # see Effect
    when: {spec_method: [mtp], strict_tool_calling: true}
    rate: 0.33                # fraction of (deterministically chosen) matching requests hit
    rate_sd: 0.1              # optional: the rate varies per server start (see below)
  - effect: crash
    after_requests: 5         # matching requests answered before the engine dies
    message: "TypeError: ..." # the root cause in the log (default: a CUDA illegal memory access)
    exit_after_s: 0.05        # the API server exits this long after the engine died
  - effect: refuse_start
    message: "CUDA error: no kernel image is available for execution on the device"
```

`when` maps a key to one value or a list of accepted values; every key must match. Server keys
are matched against the EFFECTIVE configuration (after vLLM's silent fallbacks): spec_method
("none" without speculative decoding), num_speculative_tokens, async_scheduling,
attention_backend, model_runner (V1/V2), strict_tool_calling, reasoning_parser ("none" when
unset), tool_call_parser, structured_outputs_backend, tensor_parallel_size, dtype, enforce_eager.
Request keys are traits of one request: json_schema, json_object, tools, thinking_budget,
stream, enable_thinking (all booleans).

`rate_sd` (default 0: off) makes a rate-based bug vary between server starts, the way a real
regression's rate can depend on the GPU, the batch mix and the warm-up of each start: at every start
the bug's rate is drawn once from a Beta distribution with mean `rate` and standard deviation
`rate_sd`, and that rate holds for the life of the process (see `behaviour`). A Beta with that mean
and spread exists only when rate_sd² < rate·(1 − rate), so 0 < rate < 1 is required too.
"""

from __future__ import annotations

import enum
import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LATEST_VERSION = "0.33.1"
TREE_ENV = "SWEEP_SIM_TREE"

SERVER_KEYS = frozenset(
    {
        "spec_method",
        "num_speculative_tokens",
        "async_scheduling",
        "attention_backend",
        "model_runner",
        "strict_tool_calling",
        "reasoning_parser",
        "tool_call_parser",
        "structured_outputs_backend",
        "tensor_parallel_size",
        "dtype",
        "enforce_eager",
    }
)
REQUEST_KEYS = frozenset(
    {"json_schema", "json_object", "tools", "thinking_budget", "stream", "enable_thinking"}
)
_TOP_KEYS = frozenset({"version", "install", "startup_s", "token_latency_s", "bugs"})
_BUG_KEYS = frozenset({"id", "effect", "when", "rate", "rate_sd", "after_requests", "message", "exit_after_s"})


class TreeError(ValueError):
    """sim.yaml is malformed; the message names the file and the key."""


class Effect(enum.Enum):
    """What a bug does when it bites."""

    FSM_WHITESPACE = "fsm_whitespace"  # JSON cut after an array field's colon, whitespace, FSM error line
    SILENT_WHITESPACE = "silent_whitespace"  # the same degeneration without any log line
    THINKING_BUDGET_IGNORED = "thinking_budget_ignored"  # reasoning runs to max_tokens, no </think>
    CRASH = "crash"  # the engine dies after `after_requests` matching requests
    HANG = "hang"  # a matching request is never answered
    REFUSE_START = "refuse_start"  # the server exits during start-up with `message`


@dataclass(frozen=True)
class Bug:
    id: str
    effect: Effect
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    rate: float = 1.0
    after_requests: int = 0
    exit_after_s: float = 0.05  # crash: how long the API server lives on after its engine died
    message: str = ""
    rate_sd: float = 0.0  # > 0: the rate is drawn per server start from Beta(mean rate, sd rate_sd)

    def server_when(self) -> dict[str, tuple[Any, ...]]:
        return {k: v for k, v in self.when.items() if k in SERVER_KEYS}

    def request_when(self) -> dict[str, tuple[Any, ...]]:
        return {k: v for k, v in self.when.items() if k in REQUEST_KEYS}


@dataclass(frozen=True)
class Tree:
    version: str = LATEST_VERSION
    install: str = "ok"
    startup_s: float = 0.0
    token_latency_s: float = 0.0
    bugs: tuple[Bug, ...] = ()
    source: str = "<built-in>"

    @property
    def install_ok(self) -> bool:
        return self.install == "ok"

    @property
    def release(self) -> tuple[int, int, int]:
        return parse_release(self.version)


def beta_parameters(rate: float, rate_sd: float) -> tuple[float, float]:
    """(alpha, beta) of the Beta distribution with mean `rate` and standard deviation `rate_sd`.

    Raises ValueError when no such Beta exists: its variance is below rate·(1 − rate).
    """
    variance = rate_sd * rate_sd
    if not 0.0 < rate < 1.0 or rate_sd <= 0.0 or variance >= rate * (1.0 - rate):
        raise ValueError(
            f"no Beta distribution has mean {rate} and standard deviation {rate_sd}: "
            f"needs 0 < rate < 1 and 0 < rate_sd < sqrt(rate*(1-rate))"
            + (f" = {math.sqrt(rate * (1.0 - rate)):.4g}" if 0.0 < rate < 1.0 else "")
        )
    common = rate * (1.0 - rate) / variance - 1.0
    return rate * common, (1.0 - rate) * common


def parse_release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a PEP 440-ish vLLM version such as 0.28.1rc1.dev130+g44fe2a3."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not m:
        raise TreeError(f"version {version!r} does not start with MAJOR.MINOR")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def load(directory: str | os.PathLike[str] | None = None) -> Tree:
    """The tree named by the argument or `SWEEP_SIM_TREE`; built-in defaults when neither is set."""
    if directory is None:
        directory = os.environ.get(TREE_ENV) or None
    if directory is None:
        return Tree()
    path = Path(directory) / "sim.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise TreeError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise TreeError(f"{path}: not valid YAML: {exc}") from exc
    tree = parse(raw, source=str(path))
    if "+" not in tree.version:
        sha = _head_sha(Path(directory))
        if sha:
            tree = Tree(**{**tree.__dict__, "version": f"{tree.version}+g{sha}"})
    return tree


def parse(raw: Any, *, source: str = "<sim.yaml>") -> Tree:
    if not isinstance(raw, dict):
        raise TreeError(f"{source}: expected a mapping at the top level")
    _reject_unknown(raw, _TOP_KEYS, source, "")
    version = str(raw.get("version", LATEST_VERSION))
    parse_release(version)
    install = str(raw.get("install", "ok"))
    if install != "ok" and not install.startswith("fail"):
        raise TreeError(f"{source}: install: expected 'ok' or 'fail: <message>', got {install!r}")
    bugs_raw = raw.get("bugs") or []
    if not isinstance(bugs_raw, list):
        raise TreeError(f"{source}: bugs: expected a list")
    bugs = tuple(_parse_bug(b, source, i) for i, b in enumerate(bugs_raw))
    return Tree(
        version=version,
        install=install,
        startup_s=_number(raw, "startup_s", source),
        token_latency_s=_number(raw, "token_latency_s", source),
        bugs=bugs,
        source=source,
    )


def _parse_bug(raw: Any, source: str, index: int) -> Bug:
    where = f"bugs[{index}]"
    if not isinstance(raw, dict):
        raise TreeError(f"{source}: {where}: expected a mapping")
    _reject_unknown(raw, _BUG_KEYS, source, where + ".")
    try:
        effect = Effect(raw.get("effect"))
    except ValueError:
        valid = ", ".join(e.value for e in Effect)
        raise TreeError(f"{source}: {where}.effect: {raw.get('effect')!r} is not one of: {valid}") from None
    when_raw = raw.get("when") or {}
    if not isinstance(when_raw, dict):
        raise TreeError(f"{source}: {where}.when: expected a mapping")
    _reject_unknown(when_raw, SERVER_KEYS | REQUEST_KEYS, source, where + ".when.")
    when = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in when_raw.items()}
    rate = float(raw.get("rate", 1.0))
    if not 0.0 <= rate <= 1.0:
        raise TreeError(f"{source}: {where}.rate: must be within [0, 1], got {rate}")
    rate_sd = raw.get("rate_sd", 0.0)
    if isinstance(rate_sd, bool) or not isinstance(rate_sd, (int, float)) or rate_sd < 0:
        raise TreeError(f"{source}: {where}.rate_sd: expected a non-negative number, got {rate_sd!r}")
    if rate_sd > 0:
        try:
            beta_parameters(rate, float(rate_sd))
        except ValueError as exc:
            raise TreeError(f"{source}: {where}.rate_sd: {exc}") from None
    return Bug(
        id=str(raw.get("id", effect.value)),
        effect=effect,
        when=when,
        rate=rate,
        after_requests=int(raw.get("after_requests", 0)),
        exit_after_s=float(raw.get("exit_after_s", 0.05)),
        message=str(raw.get("message", "")),
        rate_sd=float(rate_sd),
    )


def _number(raw: dict[str, Any], key: str, source: str) -> float:
    value = raw.get(key, 0.0)
    if not isinstance(value, (int, float)) or value < 0:
        raise TreeError(f"{source}: {key}: expected a non-negative number, got {value!r}")
    return float(value)


def _reject_unknown(raw: dict[str, Any], known: frozenset[str], source: str, prefix: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TreeError(
            f"{source}: unknown keys {', '.join(prefix + k for k in unknown)}; "
            f"expected: {', '.join(sorted(known))}"
        )


def _head_sha(directory: Path) -> str | None:
    # Only a checkout has a HEAD; a plain folder keeps the declared version as is.
    if not (directory / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "--short=9", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
