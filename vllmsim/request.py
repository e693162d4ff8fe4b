"""A chat-completions request body, checked the way vLLM checks it (HTTP 400 with its error JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllmsim.config import EngineConfig


class RequestError(Exception):
    def __init__(self, message: str, *, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message, self.status, self.kind = message, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.status}}


@dataclass(frozen=True)
class ChatRequest:
    canonical: str  # the body as canonical JSON: the identity of "the same request"
    generation_key: str  # the canonical body less transport options: what decides the tokens
    prompt_text: str
    max_tokens: int | None
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    schema: Any  # the json_schema's schema; None otherwise
    json_object: bool
    tools: tuple[dict[str, Any], ...]
    tool_choice: str | dict[str, Any] | None
    thinking_budget: int | None
    enable_thinking: bool
    return_token_ids: bool
    ignore_eos: bool = False  # generate until max_tokens: no eos ends the answer
    min_tokens: int = 0  # no eos before this many tokens

    def traits(self) -> dict[str, Any]:
        """The request keys a bug's `when` is matched against."""
        return {
            "json_schema": self.schema is not None,
            "json_object": self.json_object,
            "tools": bool(self.tools) and self.tool_choice != "none",
            "thinking_budget": self.thinking_budget is not None,
            "stream": self.stream,
            "enable_thinking": self.enable_thinking,
        }


# The request fields vLLM's ChatCompletionRequest declares (OpenAI's and vLLM's own); any other field
# is accepted and ignored, with a log line (`ignored_fields_line`).
CHAT_FIELDS: frozenset[str] = frozenset({
    "add_generation_prompt", "add_special_tokens", "allowed_token_ids", "audio", "bad_words", "best_of",
    "cache_salt", "chat_template", "chat_template_kwargs", "continue_final_message", "documents",
    "ec_transfer_params", "echo", "frequency_penalty", "function_call", "functions", "guided_choice",
    "guided_decoding_backend", "guided_grammar", "guided_json", "guided_regex", "guided_whitespace_pattern",
    "ignore_eos", "include_reasoning", "include_stop_str_in_output", "kv_transfer_params", "length_penalty",
    "logit_bias", "logits_processors", "logprob_token_ids", "logprobs", "max_completion_tokens", "max_tokens",
    "media_io_kwargs", "messages", "metadata", "min_p", "min_tokens", "mm_payload", "mm_processor_kwargs",
    "modalities", "model", "n", "parallel_tool_calls", "prediction", "presence_penalty", "priority",
    "prompt_cache_key", "prompt_logprobs", "reasoning_effort", "repetition_detection", "repetition_penalty",
    "request_id", "response_format", "return_mm_kwargs", "return_prompt_text", "return_token_ids",
    "return_token_offsets", "return_tokens_as_token_ids", "return_weight_versions",
    "routed_experts_prompt_start", "safety_identifier", "seed", "service_tier", "session_id",
    "skip_special_tokens", "spaces_between_special_tokens", "stop", "stop_token_ids", "store", "stream",
    "stream_interval", "stream_options", "structural_tag", "structured_outputs", "temperature",
    "thinking_token_budget", "tool_choice", "tools", "top_k", "top_logprobs", "top_p",
    "truncate_prompt_tokens", "truncation_side", "use_beam_search", "user", "verbosity", "vllm_xargs",
    "watermarking", "web_search_options",
})
# vLLM logs ignored fields at WARNING before 0.20 and at DEBUG from then on (shown only with
# VLLM_LOGGING_LEVEL=DEBUG).
IGNORED_AT_DEBUG_SINCE = (0, 20, 0)


def ignored_fields(body: dict[str, Any]) -> set[str]:
    return set(body) - CHAT_FIELDS


# Fields that change how an answer is delivered, not which tokens it has.
_TRANSPORT = frozenset({"stream", "stream_options", "return_token_ids", "logprobs", "top_logprobs", "user"})
# Fields that decide where an answer stops, not which tokens it has: the answer past eos continues it.
LENGTH_ONLY = frozenset({"ignore_eos", "min_tokens"})


def parse(body: Any, cfg: EngineConfig) -> ChatRequest:
    if not isinstance(body, dict):
        raise RequestError("Expected a JSON object as the request body.")
    model = body.get("model")
    if model is not None and model not in cfg.served_model_names:
        raise RequestError(f"The model `{model}` does not exist.", status=404, kind="NotFoundError")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(
            "messages: Field required" if messages is None else "messages: must be a non-empty list"
        )
    texts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise RequestError(f"messages.{i}.role: Field required")
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        texts.append(f"<|im_start|>{message['role']}\n{content or ''}<|im_end|>\n")

    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise RequestError(f"max_tokens must be at least 1, got {max_tokens}.")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise RequestError(f"temperature must be non-negative, got {temperature}.")
    seed = body.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise RequestError("seed: Input should be a valid integer")
    ignore_eos, min_tokens = length_options(body, max_tokens)
    stream = bool(body.get("stream", False))
    stream_options = body.get("stream_options") or {}
    if body.get("stream_options") is not None and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.")

    schema, json_object = _response_format(body.get("response_format"))
    tools, tool_choice = _tools(body, cfg)

    budget = body.get("thinking_token_budget")
    if budget is not None:
        if cfg.reasoning_parser == "none":
            raise RequestError(
                "thinking_token_budget requires a reasoning parser: start the server with --reasoning-parser."
            )
        if not isinstance(budget, int) or budget < 0:
            raise RequestError(f"thinking_token_budget must be a non-negative integer, got {budget}.")
    kwargs = body.get("chat_template_kwargs") or {}
    enable_thinking = cfg.reasoning_parser != "none" and kwargs.get("enable_thinking", True) is not False

    prompt = "".join(texts) + "<|im_start|>assistant\n"
    if max_tokens is not None and len(prompt) // 4 + max_tokens > cfg.max_model_len:
        raise RequestError(
            f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
            f"requested {len(prompt) // 4 + max_tokens} tokens. Please reduce the length."
        )
    return ChatRequest(
        canonical=json.dumps(body, sort_keys=True, separators=(",", ":")),
        generation_key=json.dumps(
            {k: v for k, v in body.items() if k not in _TRANSPORT and k not in LENGTH_ONLY}, sort_keys=True
        ),
        prompt_text=prompt,
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=seed,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage", False)),
        schema=schema,
        json_object=json_object,
        tools=tools,
        tool_choice=tool_choice,
        thinking_budget=budget,
        enable_thinking=enable_thinking,
        return_token_ids=bool(body.get("return_token_ids", False)),
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
    )


def length_options(body: dict[str, Any], max_tokens: int | None) -> tuple[bool, int]:
    """`ignore_eos` and `min_tokens`, checked as vLLM's SamplingParams checks them."""
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("ignore_eos: Input should be a valid boolean")
    min_tokens = body.get("min_tokens", 0)
    if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
        raise RequestError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if max_tokens is not None and min_tokens > max_tokens:
        raise RequestError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    return ignore_eos, min_tokens


def _response_format(fmt: Any) -> tuple[Any, bool]:
    if fmt is None:
        return None, False
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError("response_format.type must be one of 'text', 'json_object', 'json_schema'.")
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or ("schema" not in spec and "json_schema" not in spec):
            raise RequestError("response_format.json_schema: Field required")
        schema = spec.get("schema", spec.get("json_schema"))
        if not isinstance(schema, (dict, bool)):
            raise RequestError("response_format.json_schema.schema: Input should be a valid dictionary")
        return schema, False
    return None, fmt["type"] == "json_object"


def _tools(body: dict[str, Any], cfg: EngineConfig) -> tuple[tuple[dict[str, Any], ...], Any]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError("tools: Input should be a valid list")
    for i, tool in enumerate(tools):
        if (
            not isinstance(tool, dict)
            or not isinstance(tool.get("function"), dict)
            or "name" not in tool["function"]
        ):
            raise RequestError(f"tools.{i}.function.name: Field required")
    choice = body.get("tool_choice", "auto" if tools else "none")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if not tools:
            raise RequestError("When using `tool_choice`, `tools` must be set.")
        if name not in {t["function"]["name"] for t in tools}:
            raise RequestError(
                f"The tool specified in `tool_choice` does not match any of the specified `tools`: {name}"
            )
    elif choice == "required":
        if not tools:
            raise RequestError("When using `tool_choice`, `tools` must be set.")
    elif choice == "auto":
        if tools and not cfg.auto_tool_choice:
            raise RequestError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
    elif choice != "none":
        raise RequestError(f"tool_choice: invalid value {choice!r}")
    return tuple(tools), choice
