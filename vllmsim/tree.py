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

`perf` (optional) is the commit's performance model (see `perf` for what the server does with it).
Without it, timing is `token_latency_s` per generated token, as always; with it, `perf` decides
every time and the speculative-decoding counters, and `token_latency_s` is ignored. Every key is
optional (times in seconds, factors multiply):

```yaml
perf:
  prefill_s_per_token: 0.00005  # prefill time per prompt token: TTFT = queueing + prompt tokens × this
  decode_step_s: 0.003          # one decode step of the target model at batch 1 (one token without
                                # speculation, 1 + accepted drafts with it)
  draft_s_per_token: 0.0001     # added to a decode step per proposed draft token
  batch_slowdown: 0.01          # a step takes (1 + this × (running requests − 1)) × decode_step_s
  async_overlap: 0.08           # fraction of decode_step_s saved with async scheduling on
  attention_backends:           # speed factor on prefill and decode step per EFFECTIVE backend
    {FLASH_ATTN: 1.0, TRITON_ATTN: 1.15}  # (unlisted backends: 1.0)
  acceptance:                   # per spec method: the probability that draft position i (0-based,
    mtp: [0.9, 0.75, 0.6, 0.45] # the /metrics `position` label) is accepted given that position
    ngram: [0.5, 0.35, 0.25]    # i − 1 was; unlisted methods take `perf.DEFAULT_ACCEPTANCE`;
                                # positions past the list continue at 0.8 × the previous one
  start_cv: 0.02                # coefficient of variation of one factor on all times, drawn once
                                # per server start (log-normal, mean 1)
  request_cv: 0.03              # the same, drawn once per request
  changes:                      # declared metric changes of this commit, each: metric, factor
                                # (required), id, when, positions or from_position (acceptance only)
    - id: mtp-v2-acceptance
      metric: acceptance        # acceptance | decode_step | prefill | draft (see PerfMetric)
      from_position: 2          # or positions: [2, 3]; neither: every position
      factor: 0.8               # acceptance probabilities are capped at 1
      when: {spec_method: mtp, model_runner: V2}
    - {id: sync-step, metric: decode_step, factor: 1.1, when: {async_scheduling: false}}
```

A change's `when` takes the server keys of a bug's `when` and is matched the same way, against the
effective configuration; request keys are refused (a change holds for the whole server).
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
_TOP_KEYS = frozenset({"version", "install", "startup_s", "token_latency_s", "bugs", "perf"})
_BUG_KEYS = frozenset({"id", "effect", "when", "rate", "rate_sd", "after_requests", "message", "exit_after_s"})
_PERF_KEYS = frozenset(
    {
        "prefill_s_per_token",
        "decode_step_s",
        "draft_s_per_token",
        "batch_slowdown",
        "async_overlap",
        "attention_backends",
        "acceptance",
        "start_cv",
        "request_cv",
        "changes",
    }
)
_CHANGE_KEYS = frozenset({"id", "metric", "factor", "positions", "from_position", "when"})


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


class PerfMetric(enum.Enum):
    """What a declared performance change multiplies."""

    ACCEPTANCE = "acceptance"  # the conditional acceptance probability of draft positions
    DECODE_STEP = "decode_step"  # the whole decode step (drafting included): TPOT and ITL by the factor
    PREFILL = "prefill"  # prefill time per prompt token: TTFT
    DRAFT = "draft"  # the drafting cost per draft token only


@dataclass(frozen=True)
class PerfChange:
    id: str
    metric: PerfMetric
    factor: float
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    positions: tuple[int, ...] | None = None  # acceptance: these positions only (None: all)
    from_position: int = 0  # acceptance: positions from this one on

    def covers(self, position: int) -> bool:
        return position >= self.from_position and (self.positions is None or position in self.positions)


@dataclass(frozen=True)
class Perf:
    """The `perf:` section: the declared speeds and acceptance of this commit (see `perf`)."""

    prefill_s_per_token: float = 0.0
    decode_step_s: float = 0.0
    draft_s_per_token: float = 0.0
    batch_slowdown: float = 0.0
    async_overlap: float = 0.0
    attention_backends: dict[str, float] = field(default_factory=dict)
    acceptance: dict[str, tuple[float, ...]] = field(default_factory=dict)
    start_cv: float = 0.0
    request_cv: float = 0.0
    changes: tuple[PerfChange, ...] = ()


@dataclass(frozen=True)
class Tree:
    version: str = LATEST_VERSION
    install: str = "ok"
    startup_s: float = 0.0
    token_latency_s: float = 0.0
    bugs: tuple[Bug, ...] = ()
    source: str = "<built-in>"
    perf: Perf | None = None  # None: `token_latency_s` per token, no performance model

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
        perf=_parse_perf(raw["perf"], source) if raw.get("perf") is not None else None,
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


def _parse_perf(raw: Any, source: str) -> Perf:
    # The names vLLM knows live with the configuration, which itself reads trees: imported here.
    from vllmsim.config import ATTENTION_BACKENDS, SPEC_METHODS

    if not isinstance(raw, dict):
        raise TreeError(f"{source}: perf: expected a mapping")
    _reject_unknown(raw, _PERF_KEYS, source, "perf.")
    numbers = {
        key: _number(raw, key, source, where=f"perf.{key}")
        for key in ("prefill_s_per_token", "decode_step_s", "draft_s_per_token", "batch_slowdown")
    }
    fractions = {key: _fraction(raw, key, source) for key in ("async_overlap", "start_cv", "request_cv")}
    backends_raw = raw.get("attention_backends") or {}
    if not isinstance(backends_raw, dict):
        raise TreeError(f"{source}: perf.attention_backends: expected a mapping of backend to factor")
    backends: dict[str, float] = {}
    for name, factor in backends_raw.items():
        if str(name) not in ATTENTION_BACKENDS:
            raise TreeError(
                f"{source}: perf.attention_backends.{name}: not an attention backend; expected one of: "
                f"{', '.join(ATTENTION_BACKENDS)}"
            )
        backends[str(name)] = _positive(factor, source, f"perf.attention_backends.{name}")
    acceptance_raw = raw.get("acceptance") or {}
    if not isinstance(acceptance_raw, dict):
        raise TreeError(f"{source}: perf.acceptance: expected a mapping of spec method to a list")
    acceptance: dict[str, tuple[float, ...]] = {}
    for method, probs in acceptance_raw.items():
        where = f"perf.acceptance.{method}"
        if str(method) not in SPEC_METHODS:
            raise TreeError(f"{source}: {where}: not a spec method; expected one of: {', '.join(SPEC_METHODS)}")
        if not isinstance(probs, list) or not probs or not all(_is_probability(p) for p in probs):
            raise TreeError(
                f"{source}: {where}: expected a non-empty list of probabilities within [0, 1], got {probs!r}"
            )
        acceptance[str(method)] = tuple(float(p) for p in probs)
    changes_raw = raw.get("changes") or []
    if not isinstance(changes_raw, list):
        raise TreeError(f"{source}: perf.changes: expected a list")
    return Perf(
        **numbers,
        **fractions,
        attention_backends=backends,
        acceptance=acceptance,
        changes=tuple(_parse_change(c, source, i) for i, c in enumerate(changes_raw)),
    )


def _parse_change(raw: Any, source: str, index: int) -> PerfChange:
    where = f"perf.changes[{index}]"
    if not isinstance(raw, dict):
        raise TreeError(f"{source}: {where}: expected a mapping")
    _reject_unknown(raw, _CHANGE_KEYS, source, where + ".")
    try:
        metric = PerfMetric(raw.get("metric"))
    except ValueError:
        valid = ", ".join(m.value for m in PerfMetric)
        raise TreeError(f"{source}: {where}.metric: {raw.get('metric')!r} is not one of: {valid}") from None
    if "factor" not in raw:
        raise TreeError(f"{source}: {where}.factor: required (a positive number the metric is multiplied by)")
    factor = _positive(raw["factor"], source, f"{where}.factor")
    when_raw = raw.get("when") or {}
    if not isinstance(when_raw, dict):
        raise TreeError(f"{source}: {where}.when: expected a mapping")
    _reject_unknown(when_raw, SERVER_KEYS, source, where + ".when.")
    when = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in when_raw.items()}
    positions: tuple[int, ...] | None = None
    from_position = 0
    if ("positions" in raw or "from_position" in raw) and metric is not PerfMetric.ACCEPTANCE:
        key = "positions" if "positions" in raw else "from_position"
        raise TreeError(f"{source}: {where}.{key}: only an acceptance change has draft positions")
    if "positions" in raw and "from_position" in raw:
        raise TreeError(f"{source}: {where}.from_position: give positions or from_position, not both")
    if "positions" in raw:
        pos = raw["positions"]
        if not isinstance(pos, list) or not pos or not all(_is_index(p) for p in pos):
            raise TreeError(
                f"{source}: {where}.positions: expected a non-empty list of 0-based draft positions, got {pos!r}"
            )
        positions = tuple(int(p) for p in pos)
    if "from_position" in raw:
        if not _is_index(raw["from_position"]):
            raise TreeError(
                f"{source}: {where}.from_position: expected a 0-based draft position, got {raw['from_position']!r}"
            )
        from_position = int(raw["from_position"])
    return PerfChange(
        id=str(raw.get("id", f"{metric.value}-{index}")),
        metric=metric,
        factor=factor,
        when=when,
        positions=positions,
        from_position=from_position,
    )


def _is_probability(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive(value: Any, source: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise TreeError(f"{source}: {where}: expected a positive number, got {value!r}")
    return float(value)


def _fraction(raw: dict[str, Any], key: str, source: str) -> float:
    value = raw.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        hint = f" (write {value / 100:g} for {value:g} %)" if isinstance(value, (int, float)) and value >= 1 else ""
        raise TreeError(f"{source}: perf.{key}: expected a fraction within [0, 1), got {value!r}{hint}")
    return float(value)


def _number(raw: dict[str, Any], key: str, source: str, *, where: str | None = None) -> float:
    value = raw.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise TreeError(f"{source}: {where or key}: expected a non-negative number, got {value!r}")
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
