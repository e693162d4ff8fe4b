"""A lean HTTP/1.1 client for streamed answers: one keep-alive connection, a POST, the body as it comes.

The load generator's wire (`sweeper.execute.load`). httpx costs about a millisecond of CPU per request
(its pool, URL parsing, the anyio layers): at a few hundred requests per second that is the client
becoming the bottleneck, the one thing a load generator must never be (benchmarks/load_ceiling.py
measured httpx at a fifth of `vllm bench serve`'s aiohttp client). This speaks just what a streaming
completion needs, over asyncio streams: a request with a JSON body, the status line and headers, a
body that is chunked, of a Content-Length, or read to the end; `Connection: close` honoured; TLS when
the URL is https. Every read is bounded by the caller's `arm` (an `asyncio.timeout` rescheduled per
read: a stall is a timeout between two bytes, not over the whole answer).
"""

from __future__ import annotations

import asyncio
import socket
import ssl as ssl_module
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import urlsplit

READ_LIMIT = 2**20  # one header block or one line (a chunk size) at most this long
MAX_ERROR_BODY = 4096  # bytes of an error answer kept


class WireError(Exception):
    """The answer broke the protocol or the connection ended inside it."""


class Connection:
    """One keep-alive connection to `base_url`, opened on first use and again after a close."""

    def __init__(self, base_url: str, headers: Mapping[str, str], tls: ssl_module.SSLContext | None = None) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"expected an http(s) URL, got {base_url!r}")
        self.host = url.hostname
        self.base_path = url.path.rstrip("/")  # a server under a prefix: its paths start with it
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = (tls or ssl_module.create_default_context()) if url.scheme == "https" else None
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.fixed = (f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\n{extra}").encode("latin-1")
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reusable = False  # the last answer was read whole and the server keeps the connection

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls,
                                                                 limit=READ_LIMIT)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None
        self.reusable = False

    async def post(self, path: str, body: bytes, arm: Callable[[], None]) -> tuple[int, dict[str, str]]:
        """Send a POST and read the answer's status and headers (lower-case names). A kept connection
        the server closed meanwhile is opened again and the request sent once more (nothing of an
        answer had come)."""
        request = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % ((self.base_path + path).encode(), self.fixed,
                                                                        len(body), body)
        for attempt in (0, 1):
            fresh = self.writer is None or not self.reusable
            if fresh:
                self.close()
                arm()
                await self._open()
            assert self.reader is not None and self.writer is not None
            self.reusable = False
            try:
                self.writer.write(request)
                arm()
                head = await self.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                self.close()
                if fresh or attempt:
                    raise WireError(f"the connection ended before an answer: {type(exc).__name__}") from None
                continue
            except asyncio.LimitOverrunError:
                self.close()
                raise WireError(f"an answer's headers longer than {READ_LIMIT:,} bytes") from None
            return _status_and_headers(head)
        raise AssertionError("unreachable")

    async def body(self, headers: Mapping[str, str], arm: Callable[[], None]) -> AsyncIterator[bytes]:
        """The answer's body, as its pieces arrive. Read whole, the connection may be used again."""
        reader = self.reader
        assert reader is not None
        try:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                while True:
                    arm()
                    line = await reader.readline()
                    if not line.endswith(b"\n"):
                        raise WireError("the connection ended inside a chunked answer")
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise WireError(f"a bad chunk size line {line[:40]!r}") from None
                    if size == 0:
                        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                            arm()  # trailers: ignored
                        break
                    arm()
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in headers:
                left = int(headers["content-length"])
                while left > 0:
                    arm()
                    data = await reader.read(min(left, 65536))
                    if not data:
                        raise WireError(f"the connection ended {left:,} bytes before the answer's end")
                    left -= len(data)
                    yield data
            else:  # read to the end: the server closes the connection after it
                headers = {**headers, "connection": "close"}
                while True:
                    arm()
                    data = await reader.read(65536)
                    if not data:
                        break
                    yield data
        except asyncio.IncompleteReadError:
            self.close()
            raise WireError("the connection ended inside a chunk") from None
        except BaseException:
            self.close()
            raise
        self.reusable = "close" not in headers.get("connection", "").lower()
        if not self.reusable:
            self.close()

    async def read_all(self, headers: Mapping[str, str], arm: Callable[[], None]) -> bytes:
        """The body whole, cut at MAX_ERROR_BODY bytes kept (what an error answer says)."""
        kept = b""
        async for data in self.body(headers, arm):
            kept = (kept + data)[:MAX_ERROR_BODY]
        return kept


def _status_and_headers(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise WireError(f"not an HTTP status line: {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers
