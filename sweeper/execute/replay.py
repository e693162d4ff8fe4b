"""Send a suite's requests to one server: async, bounded concurrency, a timeout per request.

Each request carries `X-Request-Id`, which vLLM folds into its request id (`chatcmpl-<id>`), so
server log lines can be matched to the sample. Streaming requests are reassembled into the shape
of a non-streaming response and give a time to first token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import httpx

from sweeper.execute import transport
from sweeper.spec.matrix import DEFAULT_MAX_RESPONSE_MB
from sweeper.spec.status import Transport


@dataclass(frozen=True)
class Request:
    case_id: str
    repeat: int
    request_id: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Reply:
    request: Request
    http_status: int | None
    response: Mapping[str, Any] | None
    error: str | None
    latency_s: float
    ttft_s: float | None
    started_at: datetime
    timed_out: bool = False
    # How the answer failed on the wire (`sweeper.execute.transport`); None when it came whole.
    transport: Transport | None = None


class Abort(StrEnum):
    """Why a replay stopped before every request was answered."""

    CRASHED = "crashed"  # the server process exited
    TIMEOUT = "timeout"  # every slot waited a full request timeout: the server hangs
    DEADLINE = "deadline"  # the caller's deadline (the group's `timeouts.group_s`) passed


@dataclass(frozen=True)
class ReplayOutcome:
    replies: tuple[Reply, ...]
    # Requests never sent because the server hung or died, or cut off by the deadline (not samples).
    unsent: int
    aborted: Abort | None


async def _send(client: httpx.AsyncClient, url: str, req: Request, timeout_s: float, max_bytes: int) -> Reply:
    started = datetime.now(UTC)
    t0 = time.monotonic()
    body = dict(req.body)
    acc = _StreamAccumulator() if body.get("stream") else None
    if acc is not None:
        body.setdefault("stream_options", {"include_usage": True})
    answer = await transport.exchange(client, url, body, {"X-Request-Id": req.request_id}, timeout_s=timeout_s,
                                      max_bytes=max_bytes, on_event=acc.add if acc is not None else None)
    response = acc.response() if acc is not None and answer.status == 200 else answer.response
    if answer.fault is not None:
        error: str | None = answer.fault.detail
    elif answer.status != 200:
        error = _error_text(response, answer.status, answer.note)
    else:
        error = None
    ttft = acc.first_token_at - t0 if acc is not None and acc.first_token_at is not None else None
    return Reply(req, answer.status, response, error, time.monotonic() - t0, ttft, started,
                 timed_out=answer.timed_out, transport=answer.fault.kind if answer.fault else None)


def _error_text(response: Mapping[str, Any] | None, status: int | None, note: str = "") -> str:
    if response and isinstance(response.get("error"), dict):
        return f"HTTP {status}: {response['error'].get('message', '')}"[:500]
    if response and "message" in response:
        return f"HTTP {status}: {response['message']}"[:500]
    return f"HTTP {status}" + (f" ({note})" if note else "")


class _StreamAccumulator:
    def __init__(self) -> None:
        self.id: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.token_ids: list[int] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None
        self.first_token_at: float | None = None

    def add(self, chunk: Mapping[str, Any]) -> None:
        self.id = self.id or chunk.get("id")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            got = False
            if delta.get("content"):
                self.content.append(delta["content"])
                got = True
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                self.reasoning.append(reasoning)
                got = True
            for tc in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(tc.get("index", 0), {"type": "function", "function": {
                    "name": "", "arguments": ""}})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
                got = True
            self.token_ids.extend(choice.get("token_ids") or [])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if got and self.first_token_at is None:
                self.first_token_at = time.monotonic()

    def response(self) -> Mapping[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        if self.token_ids:
            choice["token_ids"] = self.token_ids
        return {"id": self.id, "object": "chat.completion", "choices": [choice], "usage": self.usage}


async def replay(base_url: str, api_key: str, requests: Sequence[Request], *, concurrency: int,
                 timeout_s: float, alive: Callable[[], bool] = lambda: True,
                 on_reply: Callable[[Reply], None] | None = None, deadline: float | None = None,
                 max_response_mb: float = DEFAULT_MAX_RESPONSE_MB) -> ReplayOutcome:
    """Send `requests`; stop sending when the server dies or every slot is stuck on a timeout.

    `deadline` (a `time.monotonic()` value): nothing is sent after it, and a request still waiting
    then is cut off; cut-off requests are not replies (they count as unsent). No answer is read past
    `max_response_mb`: the memory a replay holds is bounded by that times `concurrency`."""
    cap = transport.max_bytes(max_response_mb)
    url = f"{base_url}/v1/chat/completions"
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for req in requests:
        queue.put_nowait(req)
    replies: list[Reply] = []
    consecutive_timeouts, cut = 0, 0
    aborted: Abort | None = None
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    auth = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits, headers=auth,
                                 verify=transport.tls()) as client:

        async def worker() -> None:
            nonlocal consecutive_timeouts, cut, aborted
            while aborted is None:
                budget = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
                if budget <= 0:
                    aborted = Abort.DEADLINE
                    return
                try:
                    req = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                reply = await _send(client, url, req, budget, cap)
                if reply.timed_out and budget < timeout_s:
                    # Cut off by the deadline, not by the server's slowness: not a sample.
                    aborted = aborted or Abort.DEADLINE
                    cut += 1
                    continue
                if reply.timed_out:
                    consecutive_timeouts += 1
                elif reply.http_status is not None:
                    consecutive_timeouts = 0
                if not alive():
                    aborted = Abort.CRASHED
                    # A request cut off by the crash is still a sample: it saw the failure.
                elif consecutive_timeouts >= concurrency:
                    # Every slot waited a full timeout with no answer in between: the server hangs.
                    aborted = Abort.TIMEOUT
                replies.append(reply)
                if on_reply:
                    on_reply(reply)

        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(requests))))))
    return ReplayOutcome(tuple(replies), queue.qsize() + cut, aborted)


def run_replay(base_url: str, api_key: str, requests: Sequence[Request], **kwargs: Any) -> ReplayOutcome:
    return asyncio.run(replay(base_url, api_key, requests, **kwargs))
