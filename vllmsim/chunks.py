"""What a paced answer sends: the streamed chunks per decode step, and the whole responses.

The server (`server.Handler._paced`) calls `first` with the first token, `step` once per decode step
with the tokens that step emitted (several under speculative decoding, in one chunk, as vLLM sends
them), then `tail`. Pure: a request, its completion and the time stamps go in; JSON-able dicts out.
Chat chunks keep vLLM's shape: a role chunk with the first token, text under `delta.content`
(`delta.reasoning` for reasoning), the finish reason on the last token's chunk. Completions chunks
carry `choices[0].text`, one per step, even when a step's text is empty (eos).
"""

from __future__ import annotations

from typing import Any, Protocol

from vllmsim.chat import Completion
from vllmsim.completions import CompletionRequest
from vllmsim.generate import Channel, Token
from vllmsim.request import ChatRequest


class Render(Protocol):
    def first(self) -> list[dict[str, Any]]: ...
    def step(self, tokens: list[Token], *, last: bool) -> list[dict[str, Any]]: ...
    def tail(self) -> list[dict[str, Any]]: ...


def usage(c: Completion, *, reasoning: bool) -> dict[str, Any]:
    return {
        "prompt_tokens": len(c.prompt_token_ids),
        "completion_tokens": len(c.tokens),
        "total_tokens": len(c.prompt_token_ids) + len(c.tokens),
        "completion_tokens_details": {"reasoning_tokens": c.reasoning_tokens} if reasoning else None,
    }


class ChatRender:
    def __init__(self, rid: str, model: str, created: int, req: ChatRequest, c: Completion, *, reasoning: bool):
        self.rid, self.model, self.created, self.req, self.c = rid, model, created, req, c
        self.reasoning = reasoning

    def _chunk(self, delta: dict[str, Any], finish: str | None, token_ids: list[int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if self.req.return_token_ids:
            choice["token_ids"] = token_ids
        return {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def first(self) -> list[dict[str, Any]]:
        return [self._chunk({"role": "assistant", "content": ""}, None, [])]

    def step(self, tokens: list[Token], *, last: bool) -> list[dict[str, Any]]:
        calls = bool(self.c.tool_calls)
        reasoning = "".join(t.text for t in tokens if t.channel is Channel.REASONING)
        content = "".join(
            t.text for t in tokens if t.channel is Channel.CONTENT or (t.channel is Channel.TOOL and not calls)
        )
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning"] = reasoning
        if content:
            delta["content"] = content
        finish = self.c.finish_reason if last and not calls else None
        if not delta and finish is None and not (self.req.return_token_ids and tokens):
            return []  # nothing to show (</think> alone): vLLM sends no chunk
        return [self._chunk(delta, finish, [t.id for t in tokens])]

    def tail(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.c.tool_calls:
            out.append(self._chunk({"tool_calls": self.c.tool_calls}, None, []))
            out.append(self._chunk({}, self.c.finish_reason, []))
        if self.req.include_usage:
            out.append(
                {
                    "id": self.rid,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": usage(self.c, reasoning=self.reasoning),
                }
            )
        return out


class TextRender:
    """`/v1/completions`."""

    def __init__(self, rid: str, model: str, created: int, req: CompletionRequest, c: Completion):
        self.rid, self.model, self.created, self.req, self.c = rid, model, created, req, c

    def _body(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices}

    def first(self) -> list[dict[str, Any]]:
        return []

    def step(self, tokens: list[Token], *, last: bool) -> list[dict[str, Any]]:
        text = "".join(t.text for t in tokens if t.channel is not Channel.CONTROL)
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": self.c.finish_reason if last else None, "stop_reason": None}
        return [self._body([choice])]

    def tail(self) -> list[dict[str, Any]]:
        if not self.req.include_usage:
            return []
        return [{**self._body([]), "usage": usage(self.c, reasoning=False)}]

    def response(self) -> dict[str, Any]:
        text = "".join(t.text for t in self.c.tokens if t.channel is not Channel.CONTROL)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.c.finish_reason,
                  "stop_reason": None, "prompt_logprobs": None}
        return {**self._body([choice]), "usage": usage(self.c, reasoning=False)}
