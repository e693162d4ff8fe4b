"""What a server really ran, read from its log: effective configuration, per-request lines, start failures.

vLLM falls back silently (async scheduling off, Model Runner V2 -> V1, an attention backend replaced),
so the sweeper records the effective configuration next to the requested one. Pure functions of text;
the lines they read are those of real vLLM (checked against the 0.32 CPU build) and the simulator:

    (APIServer pid=1) INFO 11-29 08:14:41 [api_utils.py:347]  ... version 0.32.0        (banner)
    INFO ... [api_server.py:1885] vLLM API server version 0.28.1                       (older banner)
    ... non-default args: {'host': '127.0.0.1', ..., 'async_scheduling': True, ...}
    WARNING ... Async scheduling not supported with ngram-based speculative decoding and will be disabled.
    WARNING ... Model Runner V2 requires Triton; using the V1 model runner instead.
    (EngineCore pid=2) INFO ... Initializing a V1 LLM engine (v0.32.0) with config: model='...',
        speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3), ...,
        device_config=cpu, structured_outputs_config=StructuredOutputsConfig(backend='xgrammar', ...), ...
    INFO ... Using V2 Model Runner
    INFO ... Using AttentionBackendEnum.FLASH_ATTN backend.          (explicit choice, CUDA)
    INFO ... Using FLASHINFER attention backend out of potential backends: [...]   (auto, CUDA)
    (Worker pid=3) INFO ... Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU.
    ERROR ... [backend_xgrammar.py:167] Failed to advance FSM for request chatcmpl-<id>-<8 hex> ...
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from sweeper.spec.matrix import Cell

# `(APIServer pid=1) ` / `(EngineCore_DP0 pid=2) ` / `(Worker pid=3) ` then `LEVEL MM-DD HH:MM:SS [file:line] `.
LINE = re.compile(r"^(?:\((?P<proc>[\w.-]+) pid=(?P<pid>\d+)\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                  r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d) \[(?P<where>[^\]]+)\] (?P<msg>.*)$")
_VERSION = (re.compile(r"Initializing a V\d LLM engine \(v(?P<v>[^)]+)\)"),
            re.compile(r"vLLM API server version (?P<v>\S+)"),
            re.compile(r"█\s+version (?P<v>\S+)"))
_SPEC = re.compile(r"speculative_config=(?:None|SpeculativeConfig\(method='(?P<m>[^']+)'[^)]*?"
                   r"num_spec_tokens=(?P<n>\d+))")
_SO = re.compile(r"structured_outputs_config=StructuredOutputsConfig\((?P<body>[^)]*)\)")
_DEVICE = re.compile(r"device_config=(?P<d>\w+)")
_ASYNC_IN_CONFIG = re.compile(r"async_scheduling=(?P<a>True|False)")
_ASYNC_OFF = re.compile(r"Async scheduling (?:not supported with|is not compatible with .* will be disabled|"
                        r"will be disabled|is disabled)|Asynchronous scheduling is disabled")
_ASYNC_ON = re.compile(r"Asynchronous scheduling is enabled")
_BACKEND_USED = re.compile(r"Using (?:AttentionBackendEnum\.)?(?P<b>[A-Z][A-Z0-9_]+) (?:attention )?backend"
                           r"(?: on V1 engine)?(?:\.| out of)")
_BACKEND_REFUSED = re.compile(r"Cannot use (?:AttentionBackendEnum\.)?(?P<b>[A-Z][A-Z0-9_]+) backend")
_NON_DEFAULT = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
# vllm/envs.py: `logger.warning("Unknown vLLM environment variable detected: %s", env)`; the request
# models: "The following fields were present in the request but ignored: {'temprature'}" (a set).
_UNKNOWN_ENV = re.compile(r"Unknown vLLM environment variable detected: (?P<name>[A-Za-z_][A-Za-z0-9_]*)")
_IGNORED_FIELDS = re.compile(r"The following fields were present in the request but ignored: (?P<set>\{[^}]*\})")
_ERROR_LINE = re.compile(r"^(?:\S+Error|\S*Exception|Value error)[:,] ")


@dataclass(frozen=True)
class EffectiveConfig:
    """The configuration a server really ran with, as far as its log tells; None = the log did not say."""

    version: str | None = None
    model_runner: str | None = None  # "V1" / "V2"
    async_scheduling: bool | None = None
    attention_backend: str | None = None
    spec_method: str | None = None  # "none" without speculative decoding
    num_speculative_tokens: int | None = None
    structured_outputs_backend: str | None = None
    disable_any_whitespace: bool | None = None
    reasoning_parser: str | None = None
    device: str | None = None  # cpu, cuda, ...
    # What vLLM said it ignored: env names it does not know, request fields outside its schema.
    unknown_env: tuple[str, ...] = ()
    ignored_fields: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def structured_backend(self) -> str | None:
        return self.structured_outputs_backend


def parse_line(line: str) -> dict[str, str] | None:
    m = LINE.match(line.rstrip("\n"))
    return m.groupdict() if m else None


def non_default_args(log_text: str) -> dict[str, Any]:
    """The `non-default args: {...}` dict vLLM prints at start (the arguments as it parsed them)."""
    for line in log_text.splitlines():
        m = _NON_DEFAULT.search(line)
        if m:
            try:
                value = _literal(ast.parse(m.group("args"), mode="eval").body)
            except (ValueError, SyntaxError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def _literal(node: ast.AST) -> Any:
    """A Python literal, where config objects (`StructuredOutputsConfig(backend='x', ...)`) become dicts."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Call):
        return {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    if isinstance(node, (ast.Name, ast.Attribute)):
        return ast.unparse(node)  # an enum member or a type: keep its text
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def effective_config(log_text: str) -> EffectiveConfig:
    version = next((m.group("v") for rx in _VERSION for m in [rx.search(log_text)] if m), None)
    args = non_default_args(log_text)
    spec = _SPEC.search(log_text)
    spec_method = num_spec = None
    if spec:
        spec_method = spec.group("m") or "none"
        num_spec = int(spec.group("n")) if spec.group("n") else None
    device_m = _DEVICE.search(log_text)
    device = device_m.group("d") if device_m else None

    so_backend = disable_ws = reasoning = None
    # The engine's line comes last (the non-default args may repeat the requested config before it).
    so = next(reversed(list(_SO.finditer(log_text))), None)
    if so:
        kv = dict(re.findall(r"(\w+)=('[^']*'|\w+)", so.group("body")))
        so_backend = kv.get("backend", "").strip("'") or None
        if "disable_any_whitespace" in kv:
            disable_ws = kv["disable_any_whitespace"] == "True"
        reasoning = kv.get("reasoning_parser", "").strip("'") or None
    reasoning = reasoning or args.get("reasoning_parser")

    runner = None
    if "Using V2 Model Runner" in log_text:
        runner = "V2"
    elif "V1 LLM engine" in log_text or re.search(r"V1 model runner|Model Runner V1", log_text):
        # V2 always says so when it runs; an engine that started without saying it runs V1.
        runner = "V1"

    backend = _attention_backend(log_text, device, args)
    return EffectiveConfig(
        version=version, model_runner=runner, async_scheduling=_async(log_text, device, args, version),
        attention_backend=backend, spec_method=spec_method, num_speculative_tokens=num_spec,
        structured_outputs_backend=so_backend, disable_any_whitespace=disable_ws,
        reasoning_parser=reasoning or ("none" if so else None), device=device,
        unknown_env=tuple(sorted({m.group("name") for m in _UNKNOWN_ENV.finditer(log_text)})),
        ignored_fields=tuple(sorted({f for m in _IGNORED_FIELDS.finditer(log_text) for f in _names(m.group("set"))})))


def _names(text: str) -> set[str]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return set()
    return {str(v) for v in value} if isinstance(value, (set, frozenset, list, tuple)) else set()


def _async(log_text: str, device: str | None, args: Mapping[str, Any], version: str | None) -> bool | None:
    if _ASYNC_OFF.search(log_text):
        return False
    if _ASYNC_ON.search(log_text):
        return True
    m = _ASYNC_IN_CONFIG.search(log_text)
    if m:
        return m.group("a") == "True"
    if device == "cpu":
        return False  # the CPU platform turns it off without a word (vllm/platforms/cpu.py)
    if "async_scheduling" in args:
        return bool(args["async_scheduling"])
    if version is None or "V1 LLM engine" not in log_text:
        return None
    return _release(version) >= (0, 14)  # the default since 0.14


def _attention_backend(log_text: str, device: str | None, args: Mapping[str, Any]) -> str | None:
    used = [m.group("b") for m in _BACKEND_USED.finditer(log_text)]
    used = [b for b in used if not b.endswith("_MLA_PREFILL")]
    if used:
        return used[-1]
    if device == "cpu":
        return "CPU_ATTN"  # chosen silently; a refused request logs "Cannot use ... on CPU."
    return None


def _release(version: str) -> tuple[int, int]:
    m = re.match(r"v?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# --- requested vs effective -------------------------------------------------------------------------

def requested_config(cell: Cell) -> dict[str, Any]:
    """What the cell asked for, in `EffectiveConfig`'s terms (None = left to vLLM's default)."""
    so = cell.serve.get("--structured-outputs-config")
    so = so if isinstance(so, Mapping) else {}
    env_runner = cell.env.get("VLLM_USE_V2_MODEL_RUNNER")
    return {
        "spec_method": cell.spec_method, "num_speculative_tokens": cell.num_speculative_tokens,
        "async_scheduling": cell.async_scheduling,
        "attention_backend": cell.attention_backend.upper() if cell.attention_backend else None,
        "model_runner": None if env_runner is None else ("V2" if env_runner.lower() in ("1", "true") else "V1"),
        "structured_outputs_backend": so.get("backend"),
        "disable_any_whitespace": so.get("disable_any_whitespace"),
        "reasoning_parser": cell.serve.get("--reasoning-parser"),
    }


IGNORED = "ignored by vLLM"


def diff(requested: Cell, effective: EffectiveConfig) -> dict[str, tuple[Any, Any]]:
    """Settings the cell asked for explicitly that the server did not run: {name: (requested, effective)}.
    An env var vLLM called unknown and a request field it ignored are `env.NAME` / `request.FIELD`,
    effective `IGNORED`."""
    eff = effective.as_dict()
    out: dict[str, tuple[Any, Any]] = {}
    for name in effective.unknown_env:
        if name in requested.env:
            out[f"env.{name}"] = (requested.env[name], IGNORED)
    for name in effective.ignored_fields:
        if name in requested.request:
            out[f"request.{name}"] = (requested.request[name], IGNORED)
    for key, want in requested_config(requested).items():
        got = eff.get(key)
        if want is None or got is None:
            continue  # not asked for, or the log did not say
        if key == "num_speculative_tokens" and requested.spec_method == "none":
            continue
        if want != got:
            out[key] = (want, got)
    return out


# --- per-request lines and failures -----------------------------------------------------------------

def _id_pattern(request_id: str) -> re.Pattern[str]:
    # The response id is `chatcmpl-<X-Request-Id>`; the engine adds `-<8 hex>` to it in its lines.
    rid = re.escape(request_id.removeprefix("chatcmpl-").removeprefix("cmpl-"))
    return re.compile(rf"(?<![\w-])(?:chatcmpl-|cmpl-)?{rid}(?:-[0-9a-f]{{8}})?(?![\w-])")


def request_log_lines(log_lines: Iterable[str], request_id: str,
                      response: Mapping[str, Any] | None = None) -> list[str]:
    """The log lines that name this request: the X-Request-Id sent (vLLM answers with id
    `chatcmpl-<X-Request-Id>` and names the engine request `chatcmpl-<X-Request-Id>-<8 hex>`), or the
    response's own id when the server chose another one."""
    rxs = [_id_pattern(request_id)]
    rid = (response or {}).get("id")
    if isinstance(rid, str) and rid and rid.removeprefix("chatcmpl-").removeprefix("cmpl-") != \
            request_id.removeprefix("chatcmpl-").removeprefix("cmpl-"):
        rxs.append(_id_pattern(rid))
    return [line.rstrip("\n") for line in log_lines if any(rx.search(line) for rx in rxs)]


# A request id as it can appear in a line: a run of id characters; `.` may sit inside an id but is
# also a token boundary for `_id_pattern` (it is not in [\w-]), so a run is cut at its dots. Only
# runs with a `-` are indexed (every id vLLM or the sweeper makes has one); others are scanned for.
_ID_RUN = re.compile(r"[\w.-]+")
_ID_KEY = re.compile(r"^[\w.-]*-[\w.-]*$")
_HEX8 = re.compile(r"[0-9a-f]{8}")
_PREFIXES = ("", "chatcmpl-", "cmpl-")
# Runs with more dots than this index only their shorter dotted spans; longer ids are looked up by a scan.
_MAX_SPAN = 8


def _norm_id(request_id: str) -> str:
    return request_id.removeprefix("chatcmpl-").removeprefix("cmpl-")


class LogIndex:
    """The lines of a server log indexed by the tokens they hold, in one pass.

    `lines_for` answers what `request_log_lines` answers, in time proportional to the lines found
    instead of the whole log: a group of N requests costs O(log) once, not O(N x log). A token
    `P + id + S` (P: no prefix, `chatcmpl-` or `cmpl-`; S: nothing or the engine's `-<8 hex>`) is
    filed under itself and, when it ends in S, without S; a lookup tries the three prefixes.

    `hints`: substrings every id the caller will look up is likely to contain (the sweeper's id
    prefixes). Then only the runs holding a hint are indexed, and most lines are passed over with
    a substring test; an id without a hint is looked up in a full index, built once when first
    needed. `add` extends the index as the log grows.
    """

    def __init__(self, log_lines: Iterable[str] = (), hints: Iterable[str] = ()) -> None:
        self.lines: list[str] = []
        self.hints = tuple(h for h in dict.fromkeys(hints) if h)
        self._hinted: dict[str, list[int]] = {}
        self._full: dict[str, list[int]] | None = None if self.hints else {}
        self.add(log_lines)

    def add(self, log_lines: Iterable[str]) -> None:
        first = len(self.lines)
        self.lines.extend(line.rstrip("\n") for line in log_lines)
        if self.hints:
            _index_lines(self._hinted, self.lines, first, self.hints)
        if self._full is not None:
            _index_lines(self._full, self.lines, first, ())

    def _find(self, request_id: str) -> set[int]:
        key = _norm_id(request_id)
        if _ID_KEY.match(key) and key.count(".") < _MAX_SPAN:
            if self.hints and any(h in key for h in self.hints):
                index = self._hinted  # every line naming this id holds the hint, so was indexed
            else:
                if self._full is None:
                    self._full = {}
                    _index_lines(self._full, self.lines, 0, ())
                index = self._full
            out: set[int] = set()
            for prefix in _PREFIXES:
                out.update(index.get(prefix + key, ()))
            return out
        rx = _id_pattern(request_id)  # an id the index cannot hold: scan (rare; never a sweep's own ids)
        return {i for i, line in enumerate(self.lines) if rx.search(line)}

    def lines_for(self, request_id: str, response: Mapping[str, Any] | None = None) -> list[str]:
        found = self._find(request_id)
        rid = (response or {}).get("id")
        if isinstance(rid, str) and rid and _norm_id(rid) != _norm_id(request_id):
            found |= self._find(rid)
        return [self.lines[i] for i in sorted(found)]


def _index_lines(index: dict[str, list[int]], lines: Sequence[str], first: int, hints: tuple[str, ...]) -> None:
    for i in range(first, len(lines)):
        line = lines[i]
        if hints and not any(h in line for h in hints):
            continue
        for run in _ID_RUN.findall(line):
            if "-" not in run or (hints and not any(h in run for h in hints)):
                continue
            if "." in run:
                parts = run.split(".")
                tokens = [t for a in range(len(parts)) for b in range(a + 1, min(len(parts), a + _MAX_SPAN) + 1)
                          if "-" in (t := ".".join(parts[a:b]))]
            else:
                tokens = [run]
            for token in tokens:
                keys = [token]
                n = len(token)
                if n > 9 and token[n - 9] == "-" and _HEX8.fullmatch(token, n - 8):
                    keys.append(token[:n - 9])
                for key in keys:
                    found = index.get(key)
                    if found is None:
                        index[key] = [i]
                    elif found[-1] != i:
                        found.append(i)


def is_error_line(line: str) -> bool:
    parsed = parse_line(line)
    return bool(parsed and parsed["level"] in ("ERROR", "CRITICAL"))


def error_lines(log_lines: Iterable[str], request_id: str | None = None) -> list[str]:
    """ERROR/CRITICAL lines (of one request when `request_id` is given)."""
    rx = _id_pattern(request_id) if request_id else None
    out = []
    for line in log_lines:
        if is_error_line(line) and (rx is None or rx.search(line)):
            out.append(line.rstrip("\n"))
    return out


def failure_reason(log_text: str) -> str | None:
    """Why a server refused to start: the last exception message in its log, if any."""
    reason = None
    for line in log_text.splitlines():
        stripped = line.strip()
        if _ERROR_LINE.match(stripped):
            reason = stripped
        else:
            parsed = parse_line(line)
            if parsed and parsed["level"] in ("ERROR", "CRITICAL") and "Traceback" not in parsed["msg"]:
                reason = reason or parsed["msg"]
    if reason and reason.startswith("Value error, "):
        # pydantic's wrapper around vLLM's ValueError: keep vLLM's message, drop pydantic's trailer.
        reason = "ValueError: " + re.sub(r" \[type=value_error.*$", "", reason[len("Value error, "):])
    return reason
