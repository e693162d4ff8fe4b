"""Read one answer off the wire, bounded and strictly, and name how it failed.

The body is capped while it is read (memory per request is bounded whatever the server sends),
decoded as strict UTF-8, and its content type checked; a stream's server-sent-events framing and
its closing `data: [DONE]` are checked too. Every way the wire can fail is a `Transport` verdict
with what came: bytes received and expected, the offset of a bad byte, the content type and the
first bytes, the phase a timeout hit. A failure is data: `exchange` never raises for the wire.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from sweeper.spec.status import Transport


@functools.cache
def tls() -> ssl.SSLContext:
    """The one client TLS context of this process, for every httpx client the sweeper opens. httpx
    builds a context per client, loading the CA bundle each time: with a client per health poll, per
    scrape and per replay that was a twentieth of a sweep's CPU, though every URL here is plain http."""
    return httpx.create_ssl_context()

HEAD_BYTES = 80  # the first bytes of an unexpected body shown in a verdict's detail
_AROUND = 24  # bytes shown either side of a byte that is not UTF-8
# What the replay treats as the wire failing (never a bug of the sweeper: those keep their traceback).
WIRE_ERRORS = (httpx.HTTPError, OSError)
_LENGTHS = re.compile(r"received (\d+) bytes, expected (\d+)")


def max_bytes(megabytes: float) -> int:
    """The response cap in bytes for a matrix's `max_response_mb`."""
    return int(megabytes * 2**20)


@dataclass(frozen=True)
class Fault:
    kind: Transport
    detail: str


@dataclass(frozen=True)
class Answer:
    """What came back for one request: the status line (None when none came), the parsed body of a
    plain answer or of an error status, and the first thing that went wrong on the wire."""

    status: int | None
    response: Mapping[str, Any] | None
    fault: Fault | None
    timed_out: bool = False
    # An error status whose body is not a JSON object: its content type and first bytes.
    note: str = ""


class WireFault(Exception):
    """Raised while an answer is read; `exchange` turns it into the answer's fault."""

    def __init__(self, kind: Transport, detail: str) -> None:
        super().__init__(detail)
        self.fault = Fault(kind, detail)


class _Wire:
    """What reading one answer has seen so far: how far it got is what names a failure."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.connected = False
        self.status: int | None = None
        self.content_type = ""
        self.expected: int | None = None  # Content-Length, when announced
        self.received = 0
        self.fault: Fault | None = None  # the first fault seen (a bad byte does not stop the reading)

    async def trace(self, name: str, info: Mapping[str, Any]) -> None:
        # httpcore's trace events: a TCP connect completed, or a request went out on a kept-alive one.
        if name == "connection.connect_tcp.complete" or name.startswith(("http11.", "http2.")):
            self.connected = True

    def headers(self, r: httpx.Response) -> None:
        self.status = r.status_code
        self.content_type = r.headers.get("content-type", "")
        length = r.headers.get("content-length", "")
        self.expected = int(length) if length.isdigit() else None
        if self.expected is not None and self.expected > self.cap:
            raise WireFault(Transport.TOO_LARGE, f"the body announces {self.expected:,} bytes (Content-Length), "
                                                 f"over the response cap of {self.cap:,} (max_response_mb)")

    def count(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.cap:
            raise WireFault(Transport.TOO_LARGE, f"the body grew past the response cap of {self.cap:,} bytes "
                                                 "(max_response_mb); reading stopped there")

    def note(self, fault: Fault) -> None:
        self.fault = self.fault or fault

    def decode(self, data: bytes, where: str, base: int = 0) -> str:
        """`data` as text; bytes that are not UTF-8 are a fault (its offset in the body or stream),
        and the text keeps U+FFFD where they were, so the content shows where."""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            around = data[max(0, exc.start - _AROUND):exc.end + _AROUND]
            self.note(Fault(Transport.INVALID_UTF8, f"invalid UTF-8 at byte {base + exc.start:,} of the {where} "
                                                    f"({exc.reason}): {around!r}"))
            return data.decode("utf-8", "replace")

    def timeout(self, seconds: float) -> Fault:
        if not self.connected:
            return Fault(Transport.TIMEOUT_CONNECT, f"timeout after {seconds:g}s: no connection to the server")
        if self.status is None:
            return Fault(Transport.TIMEOUT_READ, f"timeout after {seconds:g}s waiting for the answer "
                                                 "(connected, request sent, no status line)")
        return Fault(Transport.TIMEOUT_TOTAL, f"timeout after {seconds:g}s: the answer (HTTP {self.status}) was "
                                              f"still coming, {self.received:,} bytes received")

    def failure(self, exc: BaseException) -> Fault:
        text = str(exc)
        if _caused_by(exc, ConnectionResetError):
            where = "before answering" if self.status is None else \
                f"after the status line (HTTP {self.status}) and {self.received:,} bytes of the body"
            return Fault(Transport.RESET, f"the server reset the connection {where}")
        if isinstance(exc, httpx.ConnectError):
            return Fault(Transport.REFUSED, f"could not connect to the server: {text or type(exc).__name__}")
        if isinstance(exc, httpx.RemoteProtocolError):
            lengths = _LENGTHS.search(text)
            if lengths:
                got, expected = int(lengths[1]), int(lengths[2])
                return Fault(Transport.TRUNCATED, f"the body ended after {got:,} of the {expected:,} bytes its "
                                                  "Content-Length announced: the server closed the connection")
            if self.status is None:
                return Fault(Transport.CLOSED_EARLY, f"the server closed the connection without answering ({text})")
            return Fault(Transport.CLOSED_EARLY, f"the server closed the connection in the middle of the body "
                                                 f"(HTTP {self.status}, {self.received:,} bytes received: {text})")
        return Fault(Transport.ERROR, f"{type(exc).__name__}: {text}"[:500])


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kind):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


async def _expect_type(wire: _Wire, r: httpx.Response, wanted: str) -> None:
    media = _media_type(wire.content_type)
    if media == wanted or (wanted == "application/json" and media.endswith("+json")):
        return
    head = bytearray()
    async for chunk in r.aiter_bytes():
        wire.count(chunk)
        head += chunk
        if len(head) >= HEAD_BYTES:
            break
    raise WireFault(Transport.CONTENT_TYPE, f"HTTP {wire.status} with content type "
                                            f"{wire.content_type or '(none)'!r}, not {wanted}: the body starts "
                                            f"{bytes(head[:HEAD_BYTES])!r}")


async def _read_json(wire: _Wire, r: httpx.Response) -> tuple[Mapping[str, Any] | None, str]:
    """A plain answer's body as a JSON object. On a 200 anything else is a fault; on an error status
    the body is only context (None, and its type and first bytes when it is no JSON object)."""
    ok = r.status_code == 200
    if ok:
        await _expect_type(wire, r, "application/json")
    body = bytearray()
    async for chunk in r.aiter_bytes():
        wire.count(chunk)
        body += chunk
    data = bytes(body)
    text = wire.decode(data, "body")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        if ok:
            raise WireFault(Transport.NOT_JSON, f"the body is not JSON: {exc.msg} at char {exc.pos} "
                                                f"({len(data):,} bytes, starts {data[:HEAD_BYTES]!r})") from None
        parsed = None
    if isinstance(parsed, dict):
        return parsed, ""
    if ok:
        raise WireFault(Transport.NOT_JSON, f"the body is JSON but not an object: {type(parsed).__name__}")
    return None, f"{wire.content_type or 'no content type'}, body starts {data[:HEAD_BYTES]!r}" if data else ""


class _Events:
    """Server-sent events from a byte stream: lines split on LF (never inside a UTF-8 sequence, so each
    line decodes alone), `data` fields joined per event, comments and the other fields skipped."""

    def __init__(self, wire: _Wire, on_event: Callable[[Mapping[str, Any]], None]) -> None:
        self.wire, self.on_event = wire, on_event
        self.buffer = bytearray()
        self.offset = 0  # stream offset of buffer[0]
        self.data: list[str] = []
        self.lines = 0
        self.events = 0

    def feed(self, chunk: bytes) -> bool:
        """True once `data: [DONE]` is read."""
        self.buffer += chunk
        start = 0
        while (end := self.buffer.find(b"\n", start)) >= 0:
            done = self._line(bytes(self.buffer[start:end]), self.offset + start)
            start = end + 1
            if done:
                break
        else:
            done = False
        del self.buffer[:start]
        self.offset += start
        return done

    def end(self) -> None:
        """The stream ended: an event still open counts only if it is `[DONE]`."""
        if self.buffer and self._line(bytes(self.buffer), self.offset):
            return
        if self._dispatch():
            return
        raise WireFault(Transport.NO_DONE, f"the stream ended after {self.events} events and "
                                           f"{self.wire.received:,} bytes without `data: [DONE]`")

    def _line(self, raw: bytes, at: int) -> bool:
        self.lines += 1
        text = self.wire.decode(raw, "stream", at).removesuffix("\r")
        if not text:
            return self._dispatch()
        if text.startswith(":"):
            return False  # a comment (a keep-alive)
        name, colon, value = text.partition(":")
        if name == "data" and colon:
            self.data.append(value.removeprefix(" "))
        elif name not in ("event", "id", "retry"):
            raise WireFault(Transport.BAD_SSE, f"line {self.lines} of the stream (byte {at:,}) is no "
                                               f"server-sent-events field: {text[:HEAD_BYTES]!r}")
        return False

    def _dispatch(self) -> bool:
        if not self.data:
            return False
        data, self.data = "\n".join(self.data), []
        if data.strip() == "[DONE]":
            return True
        self.events += 1
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise WireFault(Transport.NOT_JSON, f"event {self.events} of the stream is not JSON: {exc.msg} at "
                                                f"char {exc.pos}: {data[:HEAD_BYTES]!r}") from None
        if not isinstance(event, dict):
            raise WireFault(Transport.NOT_JSON, f"event {self.events} of the stream is JSON but not an object: "
                                                f"{data[:HEAD_BYTES]!r}")
        self.on_event(event)
        return False


async def _read_stream(wire: _Wire, r: httpx.Response, on_event: Callable[[Mapping[str, Any]], None]) -> None:
    await _expect_type(wire, r, "text/event-stream")
    events = _Events(wire, on_event)
    async for chunk in r.aiter_bytes():
        wire.count(chunk)
        if events.feed(chunk):
            return
    events.end()


async def exchange(client: httpx.AsyncClient, url: str, body: Mapping[str, Any], headers: Mapping[str, str], *,
                   timeout_s: float, max_bytes: int,
                   on_event: Callable[[Mapping[str, Any]], None] | None = None) -> Answer:
    """POST `body`; read the answer within `timeout_s` and `max_bytes`. With `on_event` the answer is
    a stream: each event of a 200 goes to it (a fault keeps the events read before it)."""
    wire = _Wire(max_bytes)
    response: Mapping[str, Any] | None = None
    note, timed_out = "", False
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=dict(body), headers=dict(headers),
                                     extensions={"trace": wire.trace}) as r:
                wire.headers(r)
                if on_event is not None and r.status_code == 200:
                    await _read_stream(wire, r, on_event)
                else:
                    response, note = await _read_json(wire, r)
    except (TimeoutError, httpx.TimeoutException):
        timed_out = True
        wire.note(wire.timeout(timeout_s))
    except WireFault as exc:
        wire.note(exc.fault)
    except WIRE_ERRORS as exc:
        wire.note(wire.failure(exc))
    return Answer(wire.status, response, wire.fault, timed_out, note)
