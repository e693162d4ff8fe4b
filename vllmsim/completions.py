"""`POST /v1/completions`: a prompt in, text out, checked the way vLLM checks it.

What `vllm bench serve`'s default backend (`openai`) sends: `prompt` (a string, or token ids),
`max_tokens` (16 when absent, as in vLLM), `temperature`, `ignore_eos`, `min_tokens`, `stream` and
`stream_options: {include_usage: true}`. A prompt of token ids counts as that many prompt tokens;
a string as many as the stand-in tokenizer (`generate.tokenize`) cuts it into. One prompt per
request: a batch of prompts is refused.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from vllmsim import generate as g
from vllmsim.chat import Completion, lengthen, rng_for
from vllmsim.config import EngineConfig
from vllmsim.generate import Channel
from vllmsim.request import LENGTH_ONLY, RequestError, length_options

DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default
_TRANSPORT = frozenset({"stream", "stream_options", "user", "logprobs", "return_token_ids", *LENGTH_ONLY})


@dataclass(frozen=True)
class CompletionRequest:
    canonical: str  # the body as canonical JSON: the identity of "the same request"
    generation_key: str  # the canonical body less transport options: what decides the tokens
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool
    min_tokens: int

    def traits(self) -> dict[str, Any]:
        """The request keys a bug's `when` is matched against: a plain text request."""
        return {
            "json_schema": False,
            "json_object": False,
            "tools": False,
            "thinking_budget": False,
            "stream": self.stream,
            "enable_thinking": False,
        }


def parse(body: Any, cfg: EngineConfig) -> CompletionRequest:
    if not isinstance(body, dict):
        raise RequestError("Expected a JSON object as the request body.")
    model = body.get("model")
    if model is not None and model not in cfg.served_model_names:
        raise RequestError(f"The model `{model}` does not exist.", status=404, kind="NotFoundError")
    ids = _prompt_ids(body.get("prompt"))
    max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = max(1, cfg.max_model_len - len(ids))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1, got {max_tokens}.")
    if len(ids) + max_tokens > cfg.max_model_len:
        raise RequestError(
            f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
            f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in "
            "the completion). Please reduce the length of the messages or completion."
        )
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise RequestError(f"temperature must be non-negative, got {temperature}.")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise RequestError("seed: Input should be a valid integer")
    ignore_eos, min_tokens = length_options(body, max_tokens)
    stream = bool(body.get("stream", False))
    if body.get("stream_options") is not None and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.")
    stream_options = body.get("stream_options") or {}
    return CompletionRequest(
        canonical=json.dumps(body, sort_keys=True, separators=(",", ":")),
        generation_key=json.dumps({k: v for k, v in body.items() if k not in _TRANSPORT}, sort_keys=True),
        prompt_token_ids=ids,
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=seed,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage", False)),
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
    )


def _prompt_ids(prompt: Any) -> tuple[int, ...]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt: the prompt cannot be empty")
        return tuple(t.id for t in g.tokenize(prompt, Channel.CONTENT))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(prompt)
    if prompt is None:
        raise RequestError("prompt: Field required")
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("prompt: a batch of prompts is not simulated; send one prompt per request")
    raise RequestError("prompt: Input should be a string or a list of token ids")


def build(req: CompletionRequest, occurrence: int, server_seed: int) -> Completion:
    """The generated text: pseudo-words ending on eos, unless `ignore_eos`/`min_tokens` hold it back."""
    rng = rng_for(req, occurrence, server_seed)
    prompt_ids = list(req.prompt_token_ids)
    tokens = g.words(rng, rng.randint(6, 60), Channel.CONTENT)
    if len(tokens) >= req.max_tokens:
        c = Completion(tokens[: req.max_tokens], "length", prompt_ids)
    else:
        c = Completion([*tokens, g.control(g.EOS_ID, "")], "stop", prompt_ids)
    more: random.Random = rng_for(req, occurrence, server_seed, stream="lengthen")
    return lengthen(c, req.max_tokens, ignore_eos=req.ignore_eos, min_tokens=req.min_tokens, rng=more)
