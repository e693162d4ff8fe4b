"""From `vllm serve` arguments and environment to the configuration the engine really runs.

vLLM silently falls back (async scheduling off for some speculative methods, Model Runner V2 to
V1, an unavailable attention backend replaced) and refuses some combinations at start-up. All of
that, and every start-up line that states the effective configuration, lives here, in one place,
so it can be lined up with the real vLLM's log lines.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllmsim import envs
from vllmsim.logs import Line
from vllmsim.tree import Tree

SPEC_METHODS = (
    "ngram",
    "ngram_gpu",
    "suffix",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "custom_class",
    "eagle",
    "eagle3",
    "extract_hidden_states",
    "dflash",
    "dspark",
    "mtp",
)
ASYNC_SPEC_METHODS = frozenset({"eagle", "eagle3", "mtp", "draft_model", "ngram_gpu", "dspark", "dflash"})
V2_SPEC_METHODS = ASYNC_SPEC_METHODS  # Model Runner V2 lacks the CPU-side drafters (ngram, suffix, ...)
ASYNC_SPEC_REFUSAL = (
    "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/"
    "DSpark/DFlash kind of speculative decoding"
)
ATTENTION_BACKENDS = (
    "FLASH_ATTN",
    "FLASHINFER",
    "TRITON_ATTN",
    "FLEX_ATTENTION",
    "TREE_ATTN",
    "FLASH_ATTN_DIFFKV",
    "FLASHMLA",
    "FLASHINFER_MLA",
    "TRITON_MLA",
    "CUTLASS_MLA",
    "CPU_ATTN",
)
# Backends a dense model on a CUDA GPU cannot use: vLLM replaces them with its default.
_UNAVAILABLE_BACKENDS = frozenset({"FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "CUTLASS_MLA", "CPU_ATTN"})
DEFAULT_BACKEND = "FLASH_ATTN"
REASONING_PARSERS = (
    "qwen3",
    "deepseek_r1",
    "deepseek_v3",
    "granite",
    "glm45",
    "gpt_oss",
    "hunyuan_a13b",
    "mistral",
    "minimax_m2",
    "seed_oss",
    "step3",
    "ernie45",
    "kimi_k2",
    "olmo3",
)
TOOL_PARSERS = (
    "hermes",
    "qwen3_coder",
    "qwen3_xml",
    "llama3_json",
    "mistral",
    "pythonic",
    "deepseek_v3",
    "granite",
    "internlm",
    "jamba",
    "openai",
    "glm45",
    "kimi_k2",
    "minimax_m2",
    "seed_oss",
)
DEFAULT_MAX_NUM_SEQS = 256
STRUCTURED_BACKENDS = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class EngineConfig:
    """The effective configuration, after fallbacks."""

    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    api_key: str | None
    seed: int
    max_model_len: int
    dtype: str
    enforce_eager: bool
    tensor_parallel_size: int
    spec_method: str  # "none" without speculative decoding
    num_speculative_tokens: int  # 0 without speculative decoding
    async_scheduling: bool
    attention_backend: str
    model_runner: str  # "V1" or "V2"
    strict_tool_calling: bool
    tool_strict_level: str | None
    reasoning_parser: str  # "none" when unset
    tool_call_parser: str | None
    auto_tool_choice: bool
    structured_outputs_backend: str
    release: tuple[int, int, int] = (0, 0, 0)
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # requests running at once; later ones wait (perf model)

    def traits(self) -> dict[str, Any]:
        """The keys a bug's `when` is matched against."""
        return {
            "spec_method": self.spec_method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "async_scheduling": self.async_scheduling,
            "attention_backend": self.attention_backend,
            "model_runner": self.model_runner,
            "strict_tool_calling": self.strict_tool_calling,
            "reasoning_parser": self.reasoning_parser,
            "tool_call_parser": self.tool_call_parser,
            "structured_outputs_backend": self.structured_outputs_backend,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
            "enforce_eager": self.enforce_eager,
        }


@dataclass
class Startup:
    """What start-up decided: the effective config and its log lines, or a refusal."""

    lines: list[Line] = field(default_factory=list)
    config: EngineConfig | None = None
    refusal: str | None = None  # "ExceptionType: message", printed as a traceback; exit 1
    refusal_where: str = "api_server.py:1920"


def resolve(ns: argparse.Namespace, env: Mapping[str, str], tree: Tree) -> Startup:
    out = Startup()
    release = tree.release
    out.lines.append(Line("INFO", "api_server.py:1885", f"vLLM API server version {tree.version}"))
    out.lines.append(Line("INFO", "utils.py:253", f"non-default args: {_non_default(ns)}"))
    for name in sorted(env):
        if name.startswith("VLLM_") and name not in _known_env(release):
            out.lines.append(
                Line("WARNING", "envs.py:1245", f"Unknown vLLM environment variable detected: {name}")
            )

    spec = dict(ns.speculative_config or {})
    method = str(spec.get("method") or ("draft_model" if spec.get("model") else "none")) if spec else "none"
    if method.endswith("_mtp"):  # deepseek_mtp, qwen3_next_mtp, ... are all MTP to the engine
        method = "mtp"
    if method != "none" and method not in SPEC_METHODS:
        return _refuse(
            out,
            f"ValueError: Unsupported speculative method: {method!r}. "
            f"Supported methods: {', '.join(SPEC_METHODS)}",
            "speculative.py:412",
        )
    num_spec = int(spec.get("num_speculative_tokens", 1)) if method != "none" else 0

    backend_req = ns.attention_backend or (ns.attention_config or {}).get("backend")
    if backend_req is not None and str(backend_req).upper() not in ATTENTION_BACKENDS:
        return _refuse(
            out,
            f"ValueError: Unknown attention backend: {backend_req!r}. "
            f"Valid options are: {', '.join(ATTENTION_BACKENDS)}",
            "attention.py:88",
        )
    so_cfg = ns.structured_outputs_config or {}
    so_backend = str(so_cfg.get("backend", "auto"))
    if so_backend not in STRUCTURED_BACKENDS:
        return _refuse(
            out,
            f"ValueError: Invalid structured outputs backend {so_backend!r}; "
            f"expected one of {', '.join(STRUCTURED_BACKENDS)}",
            "structured_outputs.py:71",
        )
    if ns.reasoning_parser is not None and ns.reasoning_parser not in REASONING_PARSERS:
        return _refuse(
            out,
            f"KeyError: 'invalid reasoning parser: {ns.reasoning_parser} "
            f"(chose from {{ {', '.join(REASONING_PARSERS)} }})'",
            "api_server.py:1702",
        )
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        return _refuse(
            out,
            "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser",
            "api_server.py:1696",
        )
    if ns.tool_call_parser is not None and ns.tool_call_parser not in TOOL_PARSERS:
        return _refuse(
            out,
            f"KeyError: 'invalid tool call parser: {ns.tool_call_parser} "
            f"(chose from {{ {', '.join(TOOL_PARSERS)} }})'",
            "api_server.py:1690",
        )

    # Async scheduling: on by default; an unsupported spec method turns the default off, and
    # refuses an explicit request.
    async_on = ns.async_scheduling is not False
    if async_on and method != "none" and method not in ASYNC_SPEC_METHODS:
        if ns.async_scheduling is True:
            return _refuse(out, f"ValueError: {ASYNC_SPEC_REFUSAL}", "vllm.py:641")
        out.lines.append(
            Line(
                "WARNING",
                "vllm.py:652",
                f"Async scheduling not supported with {method}-based "
                "speculative decoding and will be disabled.",
            )
        )
        async_on = False
    out.lines.append(
        Line("INFO", "vllm.py:660", "Asynchronous scheduling is " + ("enabled." if async_on else "disabled."))
    )

    strict_default = release >= (0, 24, 0)
    strict_env = env.get("VLLM_ENFORCE_STRICT_TOOL_CALLING")
    strict = strict_default if strict_env is None or release < (0, 24, 0) else strict_env.lower() in _TRUE
    level = getattr(ns, "tool_strict_level", None)
    if strict:
        out.lines.append(
            Line(
                "INFO",
                "serving_chat.py:142",
                "Strict tool calling is enforced (VLLM_ENFORCE_STRICT_TOOL_CALLING=1).",
            )
        )
    if ns.enable_auto_tool_choice:
        out.lines.append(Line("INFO", "serving_chat.py:118", '"auto" tool choice has been enabled.'))

    v2_env = env.get("VLLM_USE_V2_MODEL_RUNNER")
    want_v2 = release >= (0, 25, 0) if v2_env is None else v2_env.lower() in _TRUE
    runner = "V2" if want_v2 else "V1"
    engine_lines: list[Line] = []
    if want_v2 and method != "none" and method not in V2_SPEC_METHODS:
        engine_lines.append(
            Line(
                "WARNING",
                "gpu_model_runner.py:312",
                f"Model Runner V2 does not support "
                f"{method} speculative decoding; falling back to Model Runner V1.",
                True,
            )
        )
        runner = "V1"

    backend = str(backend_req).upper() if backend_req else DEFAULT_BACKEND
    if backend in _UNAVAILABLE_BACKENDS:
        engine_lines.append(
            Line(
                "WARNING",
                "cuda.py:271",
                f"Cannot use AttentionBackendEnum.{backend} backend "
                f"for this model; falling back to AttentionBackendEnum.{DEFAULT_BACKEND}.",
                True,
            )
        )
        backend = DEFAULT_BACKEND

    names = tuple(ns.served_model_name or [ns.model])
    cfg = EngineConfig(
        model=ns.model,
        served_model_names=names,
        host=ns.host or "127.0.0.1",
        port=ns.port,
        api_key=ns.api_key,
        seed=ns.seed,
        max_model_len=ns.max_model_len or 40960,
        dtype=ns.dtype,
        enforce_eager=ns.enforce_eager,
        tensor_parallel_size=ns.tensor_parallel_size,
        spec_method=method,
        num_speculative_tokens=num_spec,
        async_scheduling=async_on,
        attention_backend=backend,
        model_runner=runner,
        strict_tool_calling=strict,
        tool_strict_level=level,
        reasoning_parser=ns.reasoning_parser or "none",
        tool_call_parser=ns.tool_call_parser,
        auto_tool_choice=ns.enable_auto_tool_choice,
        structured_outputs_backend="xgrammar" if so_backend == "auto" else so_backend,
        release=release,
        max_num_seqs=max(1, ns.max_num_seqs or DEFAULT_MAX_NUM_SEQS),
    )

    out.lines.append(Line("INFO", "model.py:547", "Resolved architecture: Qwen3ForCausalLM"))
    out.lines.append(Line("INFO", "model.py:1510", f"Using max model len {cfg.max_model_len}"))
    out.lines.append(
        Line(
            "INFO",
            "core.py:93",
            f"Initializing a V1 LLM engine (v{tree.version}) with config: " + _engine_config_text(cfg),
            True,
        )
    )
    out.lines.extend(engine_lines)
    if runner == "V2":
        out.lines.append(Line("INFO", "gpu_model_runner.py:298", "Using V2 Model Runner", True))
    out.lines.append(Line("INFO", "cuda.py:408", f"Using AttentionBackendEnum.{backend} backend.", True))
    if method != "none":
        out.lines.append(Line("INFO", "gpu_model_runner.py:2841", "Loading drafter model...", True))
    out.lines.append(
        Line("INFO", "gpu_model_runner.py:2902", "Model loading took 1.12 GiB memory and 2.31 seconds", True)
    )
    out.config = cfg
    return out


def _engine_config_text(cfg: EngineConfig) -> str:
    spec = (
        f"SpeculativeConfig(method='{cfg.spec_method}', model='{cfg.model}', "
        f"num_spec_tokens={cfg.num_speculative_tokens})"
        if cfg.spec_method != "none"
        else "None"
    )
    parser = "" if cfg.reasoning_parser == "none" else cfg.reasoning_parser
    return (
        f"model='{cfg.model}', speculative_config={spec}, tokenizer='{cfg.model}', dtype={cfg.dtype}, "
        f"max_seq_len={cfg.max_model_len}, tensor_parallel_size={cfg.tensor_parallel_size}, "
        f"enforce_eager={cfg.enforce_eager}, structured_outputs_config=StructuredOutputsConfig("
        f"backend='{cfg.structured_outputs_backend}', reasoning_parser='{parser}'), seed={cfg.seed}, "
        f"served_model_name={cfg.served_model_names[0]}, async_scheduling={cfg.async_scheduling}"
    )


def _refuse(out: Startup, message: str, where: str) -> Startup:
    out.refusal, out.refusal_where = message, where
    return out


def _known_env(release: tuple[int, int, int]) -> frozenset[str]:
    return frozenset(envs.names_for(release))


def _non_default(ns: argparse.Namespace) -> dict[str, Any]:
    defaults = {
        "port": 8000,
        "dtype": "auto",
        "enforce_eager": False,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "seed": 0,
        "enable_auto_tool_choice": False,
    }
    shown: dict[str, Any] = {}
    for key, value in sorted(vars(ns).items()):
        if key in ("model_tag",) or (value in (None, False) and key not in defaults):
            continue
        if key in defaults and defaults[key] == value:
            continue
        if key == "api_key":
            value = "******"
        shown[key] = json.loads(json.dumps(value)) if isinstance(value, dict) else value
    return shown
