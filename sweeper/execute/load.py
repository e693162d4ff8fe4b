"""The sweeper's own load generator: one load point against one server, timed as `vllm bench serve` times it.

The same client for every commit under test (a benchmark client that changed with the commit would
move the numbers itself). asyncio over a lean HTTP/1.1 client (`sweeper.execute.http_stream`: httpx's
per-request cost made the client the bottleneck), keep-alive connections, one per request in flight,
streaming: `/v1/completions` as vLLM's default `openai`
backend sends it (`prompt` as token ids or text, `max_tokens`, `ignore_eos`, `min_tokens`,
`stream_options: {include_usage: true}`), or `/v1/chat/completions` for a suite's own cases.

Per request (vllm/benchmarks/lib/endpoint_request_func.py): the send time; TTFT, the first
server-sent event that carries a choice; every inter-chunk gap (a chunk may carry several tokens:
counted once, as vLLM does); E2EL, the last such event; prompt and output tokens from the usage
event; success or the error. Warm-up requests (the first prompt, `num_warmups` times, under the same
concurrency limit, as vLLM) come first and are never records. Concurrency is a semaphore; a finite
request rate draws gamma inter-arrival times (Poisson at burstiness 1) from a seeded generator and
scales them so the last arrival is at n / rate, exactly as vLLM's `get_request` does.

A load phase stops early, rather than wait out every request, when the server stalls (a request gets
no byte within the request timeout), when the server process is gone, or at the deadline: the
requests it never finished are failures that say why. The phase is then invalid anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweeper.execute.http_stream import Connection, WireError
from sweeper.execute.transport import tls

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
ERROR_CHARS = 300


@dataclass(frozen=True)
class Prompt:
    """One request of a dataset: its endpoint, its body (without the streaming fields, which the load
    generator sets), and the lengths it was made with (None where the dataset does not say)."""

    endpoint: str
    body: Mapping[str, Any]
    prompt_len: int | None = None
    output_len: int | None = None


@dataclass
class RequestRecord:
    """One measured request. Times in seconds; `start` is on the `time.perf_counter()` clock."""

    index: int
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2el: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    chunks: int = 0
    ok: bool = False
    status: int | None = None
    error: str | None = None
    # When sending had to wait for the concurrency limit: seconds from arrival to send.
    queue_s: float = 0.0


@dataclass(frozen=True)
class PhaseOutcome:
    """What one load point measured: the records in the dataset's order, the phase's duration (the
    first arrival to the last request done), and why it stopped early (None: it ran to the end)."""

    records: tuple[RequestRecord, ...]
    duration: float
    started_at: float  # wall clock (time.time()) when the measured requests began
    warmups: int = 0
    warmups_failed: int = 0
    stopped: str | None = None
    t0: float = 0.0  # the phase's start on the records' clock (`time.perf_counter()`)


def arrival_times(n: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds from the phase's start at which each of `n` requests arrives: all at 0 for an infinite
    rate; else cumulative gamma draws (shape `burstiness`, mean 1/rate) rescaled so that the last is at
    n / rate, as vLLM's `get_request` does (without ramp-up). Seeded: the same seed, the same times."""
    if n <= 0:
        return []
    if math.isinf(request_rate):
        return [0.0] * n
    if burstiness == math.inf:
        gaps = np.full(n, 1.0 / request_rate)
    else:
        rng = np.random.default_rng(seed)
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    times = np.cumsum(gaps)
    if times[-1] > 0:
        times *= (n / request_rate) / times[-1]
    return [float(t) for t in times]


class _Connections:
    """A keep-alive connection per request in flight, taken and given back per request (as many as the
    concurrency allows, opened when first needed)."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        self.base_url, self.headers = base_url, dict(headers)
        self.free: list[Connection] = []
        self.made: list[Connection] = []

    def take(self) -> Connection:
        if self.free:
            return self.free.pop()
        conn = Connection(self.base_url, self.headers, tls())
        self.made.append(conn)
        return conn

    def give(self, conn: Connection) -> None:
        self.free.append(conn)

    def close(self) -> None:
        for conn in self.made:
            conn.close()


class _Stop(Exception):
    """The phase stops: the server stalled or is gone, or the deadline passed."""


def _payload(prompt: Prompt) -> bytes:
    """The request body as sent: the prompt's fields, streaming with the usage event (JSON, made
    before the phase so that no measured time goes into it)."""
    body = dict(prompt.body)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


async def _one(conns: _Connections, path: str, payload: bytes, rec: RequestRecord, timeout_s: float) -> None:
    """Send one streaming request and time its server-sent events into `rec`; a failure is
    `rec.error` (a stall raises `_Stop` too: the phase ends)."""
    conn = conns.take()
    loop = asyncio.get_running_loop()
    st = time.perf_counter()
    rec.start = st
    try:
        async with asyncio.timeout(None) as limit:

            def arm() -> None:
                limit.reschedule(loop.time() + timeout_s)

            await _exchange(conn, path, payload, rec, arm)
    except TimeoutError:
        conn.close()
        rec.error = f"stalled: nothing for {timeout_s:g}s (the request timeout) after " \
                    f"{time.perf_counter() - st:.1f}s"
        raise _Stop(rec.error) from None
    except (WireError, OSError) as exc:
        conn.close()
        rec.error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
    except ValueError as exc:  # an event that is not JSON
        conn.close()
        rec.error = f"bad event: {exc}"[:ERROR_CHARS]
    finally:
        conns.give(conn)


async def _exchange(conn: Connection, path: str, payload: bytes, rec: RequestRecord, arm: Callable[[], None]) -> None:
    st = rec.start
    last = st
    first = True
    buffer = b""
    loads = json.loads
    status, headers = await conn.post(path, payload, arm)
    rec.status = status
    if status != 200:
        body = await conn.read_all(headers, arm)
        rec.error = f"HTTP {status}: {body[:ERROR_CHARS].decode(errors='replace')}"
        return
    async for data in conn.body(headers, arm):
        buffer += data
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                break
            event = buffer[start:end].strip()
            start = end + 2
            if not event.startswith(b"data:"):
                continue  # a comment (`: ping`) or an empty event
            text = event[5:].strip()
            if text == b"[DONE]":
                continue
            message = loads(text)
            if message.get("choices"):
                now = time.perf_counter()
                if first:
                    rec.ttft = now - st
                    first = False
                else:
                    rec.itl.append(now - last)
                last = now
                rec.chunks += 1
            elif usage := message.get("usage"):
                rec.output_tokens = usage.get("completion_tokens")
                rec.prompt_tokens = usage.get("prompt_tokens")
            elif error := message.get("error"):
                rec.error = f"error event: {str(error)[:ERROR_CHARS]}"
                conn.close()
                return
        buffer = buffer[start:]
    if first:
        rec.error = "no chunk with a choice came (no first token)"
        return
    rec.e2el = last - st
    rec.ok = True


@dataclass(frozen=True)
class Pace:
    """How a load point sends: at most `concurrency` in flight (None: no limit), arrivals at
    `request_rate` per second (inf: all at once) with gamma gaps of `burstiness` drawn from `seed`,
    `num_warmups` warm-ups first, and `timeout_s` without a byte before a request has stalled."""

    concurrency: int | None
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    num_warmups: int = 0
    timeout_s: float = 120.0


async def run_load(base_url: str, prompts: Sequence[Prompt], pace: Pace, *, api_key: str | None = None,
                   alive: Callable[[], bool] = lambda: True, deadline: float | None = None,
                   after_warmup: Callable[[], Any] | None = None) -> PhaseOutcome:
    """One load point: `pace.num_warmups` warm-up requests, then `after_warmup()` (the /metrics
    scrape before the measured requests), then every prompt at the pace's rate and concurrency.
    `deadline` is a `time.monotonic()` value."""
    concurrency, num_warmups, timeout_s = pace.concurrency, pace.num_warmups, pace.timeout_s
    limit = concurrency or max(1, len(prompts))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    semaphore = asyncio.Semaphore(limit)
    stopped: list[str] = []
    records = [RequestRecord(i) for i in range(len(prompts))]
    client = _Connections(base_url, headers)
    try:
        warm_failed = 0
        if num_warmups and prompts:
            payload = _payload(prompts[0])
            warm = [RequestRecord(-1 - i) for i in range(num_warmups)]

            async def warm_one(rec: RequestRecord) -> None:
                async with semaphore:
                    with contextlib.suppress(_Stop):
                        await _one(client, prompts[0].endpoint, payload, rec, timeout_s)

            await asyncio.gather(*(warm_one(r) for r in warm))
            warm_failed = sum(not r.ok for r in warm)
        if after_warmup is not None:
            after_warmup()
        arrivals = arrival_times(len(prompts), pace.request_rate, pace.burstiness, pace.seed)
        payloads = [_payload(p) for p in prompts]

        async def send(i: int, arrival: float) -> None:
            rec = records[i]
            async with semaphore:
                if stopped:
                    rec.error = f"not sent: the phase stopped ({stopped[0]})"
                    return
                rec.queue_s = time.perf_counter() - arrival
                try:
                    await _one(client, prompts[i].endpoint, payloads[i], rec, timeout_s)
                except _Stop as exc:
                    stopped.append(str(exc))
                    raise
                if not rec.ok and not alive():
                    stopped.append("the server process exited")
                    raise _Stop(stopped[-1])

        started_at = time.time()
        t0 = time.perf_counter()
        tasks: list[asyncio.Task[None]] = []
        try:
            for i, offset in enumerate(arrivals):
                if offset > 0:
                    wait = t0 + offset - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                if stopped:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    stopped.append("the deadline passed")
                    break
                tasks.append(asyncio.create_task(send(i, time.perf_counter())))
            await _wait_all(tasks, stopped, deadline)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        duration = time.perf_counter() - t0
    finally:
        client.close()
    for rec in records:
        if not rec.ok and rec.error is None:
            rec.error = f"not finished: the phase stopped ({stopped[0]})" if stopped else "not finished"
    return PhaseOutcome(tuple(records), duration, started_at, num_warmups, warm_failed,
                        stopped[0] if stopped else None, t0)


async def _wait_all(tasks: list[asyncio.Task[None]], stopped: list[str], deadline: float | None) -> None:
    """Until every task is done, the phase stops (a task raised `_Stop`), or the deadline."""
    pending = set(tasks)
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        if not done:
            stopped.append("the deadline passed")
            return
        if stopped:
            return


def run_load_sync(base_url: str, prompts: Sequence[Prompt], pace: Pace, **kwargs: Any) -> PhaseOutcome:
    """`run_load` on a new event loop (the runner is synchronous)."""
    return asyncio.run(run_load(base_url, prompts, pace, **kwargs))
