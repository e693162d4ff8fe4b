"""What the engine generates for one chat request: the token sequence and how it finished.

Pure: a request, the effective config and the bugs that bite go in; a `Completion` comes out. The
server paces and serializes it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllmsim import generate as g
from vllmsim.config import EngineConfig
from vllmsim.generate import Channel, Token
from vllmsim.instance import instance
from vllmsim.request import ChatRequest
from vllmsim.tree import Bug, Effect

FSM_ERROR_TOKENS = (71093, 2164, 271)
_ARRAY_COLON = re.compile(r'(?<!\\)": \[')


@dataclass
class Completion:
    tokens: list[Token]
    finish_reason: str
    prompt_token_ids: list[int]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    fsm_error_token: int | None = None  # set when the FSM error line must be logged

    def text(self, channel: Channel) -> str:
        return "".join(t.text for t in self.tokens if t.channel is channel)

    @property
    def reasoning_tokens(self) -> int:
        return sum(1 for t in self.tokens if t.channel is Channel.REASONING)

    @property
    def content(self) -> str | None:
        if self.tool_calls:
            return None
        text = self.text(Channel.CONTENT) + self.text(Channel.TOOL)
        return text if any(t.channel in (Channel.CONTENT, Channel.TOOL) for t in self.tokens) else None


class Sampled(Protocol):
    """What decides a request's random source: a chat or a completions request."""

    @property
    def generation_key(self) -> str: ...
    @property
    def temperature(self) -> float: ...
    @property
    def seed(self) -> int | None: ...


def rng_for(req: Sampled, occurrence: int, server_seed: int, *, stream: str = "") -> random.Random:
    # Greedy decoding and an explicit seed are reproducible; sampling varies between repeats.
    if req.seed is not None:
        key = f"seed:{req.seed}:{req.generation_key}"
    elif req.temperature == 0:
        key = f"greedy:{req.generation_key}"
    else:
        key = f"sample:{server_seed}:{occurrence}:{req.generation_key}"
    if stream:  # a stream of its own (the tokens past eos), leaving the answer's draws as they were
        key = f"{stream}:{key}"
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def lengthen(c: Completion, limit: int, *, ignore_eos: bool, min_tokens: int, rng: random.Random) -> Completion:
    """The answer once eos is ignored (`ignore_eos`: on to `limit`) or held back (until `min_tokens`).

    Only an answer that ended on eos of its own grows (text; not a tool call or a grammar-bound
    document, which end where their grammar does). The words past the natural end come from `rng`.
    """
    if c.finish_reason != "stop" or c.tool_calls or not c.tokens or c.tokens[-1].id != g.EOS_ID:
        return c
    body = c.tokens[:-1]
    target = limit if ignore_eos else max(len(body), min(min_tokens, limit))
    if target == len(body):
        return c
    more = g.words(rng, target - len(body), Channel.CONTENT)
    if body and more:  # a continuation, not a new first word
        first = more[0]
        more[0] = Token(g.token_id(" " + first.text.lower()), " " + first.text.lower(), first.channel)
    tokens = body + more
    if len(tokens) >= limit:
        return Completion(tokens[:limit], "length", c.prompt_token_ids)
    return Completion([*tokens, g.control(g.EOS_ID, "")], "stop", c.prompt_token_ids)


def build(req: ChatRequest, cfg: EngineConfig, bugs: list[Bug], rng: random.Random) -> Completion:
    prompt_ids = [t.id for t in g.tokenize(req.prompt_text, Channel.CONTENT)]
    limit = req.max_tokens if req.max_tokens is not None else max(1, cfg.max_model_len - len(prompt_ids))
    effects = {b.effect for b in bugs}
    tokens: list[Token] = []
    answer_len = rng.randint(6, 60)

    if req.enable_thinking:
        if req.thinking_budget is not None and Effect.THINKING_BUDGET_IGNORED in effects:
            tokens = g.words(rng, limit, Channel.REASONING, thinking=True)
            return Completion(tokens, "length", prompt_ids)
        natural = rng.randint(8, 40)
        if req.thinking_budget is not None and req.thinking_budget <= natural:
            # The budget counts </think> itself: budget 8 gives 7 reasoning tokens, budget 1 none.
            # Cut off while thinking, the model blurts a short answer ("\n\n2").
            natural = max(0, req.thinking_budget - 1)
            answer_len = rng.randint(1, 3)
        tokens = g.words(rng, natural, Channel.REASONING, thinking=True)
        if len(tokens) >= limit:
            return Completion(tokens[:limit], "length", prompt_ids)
        tokens.append(g.control(g.THINK_END_ID, "</think>"))

    whitespace = Effect.FSM_WHITESPACE in effects or Effect.SILENT_WHITESPACE in effects
    structured = req.schema is not None or req.json_object
    tool = _tool_to_call(req)
    if tool is not None:
        args = instance(tool.get("parameters") or {"type": "object"}, rng)
        call_text = json.dumps({"name": tool["name"], "arguments": args})
        if whitespace:
            return _degenerate(tokens, call_text, limit, rng, prompt_ids, Effect.FSM_WHITESPACE in effects)
        body = g.tokenize(f"<tool_call>\n{call_text}\n</tool_call>", Channel.TOOL)
        tokens += body
        if len(tokens) > limit:
            return Completion(tokens[:limit], "length", prompt_ids)
        tokens.append(g.control(g.EOS_ID, ""))
        call = {
            "id": f"chatcmpl-tool-{uuid.UUID(int=rng.getrandbits(128)).hex}",
            "type": "function",
            "index": 0,
            "function": {"name": tool["name"], "arguments": json.dumps(args)},
        }
        return Completion(tokens, "tool_calls", prompt_ids, tool_calls=[call])

    if structured:
        value = instance(req.schema if req.schema is not None else _OBJECT_SCHEMA, rng)
        text = json.dumps(value)
        if whitespace and req.schema is not None:
            return _degenerate(tokens, text, limit, rng, prompt_ids, Effect.FSM_WHITESPACE in effects)
        body = g.tokenize(text, Channel.CONTENT)
    else:
        lead = [Token(271, "\n\n", Channel.CONTENT)] if tokens else []
        body = lead + g.words(rng, answer_len, Channel.CONTENT)
    tokens += body
    if len(tokens) > limit:
        return Completion(tokens[:limit], "length", prompt_ids)
    if len(tokens) < limit:
        tokens.append(g.control(g.EOS_ID, ""))
    return Completion(tokens, "stop", prompt_ids)


def apply_length_options(req: ChatRequest, cfg: EngineConfig, c: Completion, occurrence: int) -> Completion:
    """`ignore_eos` and `min_tokens` on a built answer (a text answer only: see `lengthen`)."""
    if not (req.ignore_eos or req.min_tokens) or req.schema is not None or req.json_object:
        return c
    limit = req.max_tokens if req.max_tokens is not None else max(1, cfg.max_model_len - len(c.prompt_token_ids))
    more = rng_for(req, occurrence, cfg.seed, stream="lengthen")
    return lengthen(c, limit, ignore_eos=req.ignore_eos, min_tokens=req.min_tokens, rng=more)


def _degenerate(
    prefix: list[Token], text: str, limit: int, rng: random.Random, prompt_ids: list[int], logged: bool
) -> Completion:
    """Valid JSON up to the colon of the first array field, then whitespace until the limit."""
    m = _ARRAY_COLON.search(text)
    cut = m.start() + 2 if m else (text.find(": ") + 1 if ": " in text else 1)
    tokens = prefix + g.tokenize(text[:cut], Channel.CONTENT)
    tokens = tokens[:limit]
    tokens += g.whitespace(rng, limit - len(tokens), residue=not logged)
    return Completion(
        tokens, "length", prompt_ids, fsm_error_token=rng.choice(FSM_ERROR_TOKENS) if logged else None
    )


def _tool_to_call(req: ChatRequest) -> dict[str, Any] | None:
    if not req.tools or req.tool_choice == "none":
        return None
    functions: list[dict[str, Any]] = [t["function"] for t in req.tools]
    if isinstance(req.tool_choice, dict):
        name = req.tool_choice["function"]["name"]
        return next(f for f in functions if f["name"] == name)
    return functions[0]


_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}
