"""A vLLM-like server that starts normally and then misbehaves on the wire (a test program).

`python wireserver.py serve <model> --host H --port P [--api-key K] [...]`, as `vllm serve` is
called: `/health` and `/v1/models` answer normally; `/v1/chat/completions` misbehaves the way
`WIRE_BEHAVIOUR` (the environment) says, or the way the request's `model` says when it names a
behaviour (one server for every behaviour in a test). `--help` prints the flags it takes.
Standard library only: it runs under any Python the sweeper launches.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTENT = "Hello there, a fine answer."
# Bytes that are not UTF-8 (0xff never is; 0xc3 opens a two-byte sequence that 0x28 does not continue).
BAD = b"Hello \xff\xfe there \xc3(."
HTML = (b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
        b"<body><h1>Bad Gateway</h1><p>The upstream server is unavailable.</p></body></html>\n")
BIG_BYTES = 50 * 2**20
DRIP_EVERY_S = 0.3
ENDLESS_PIECE = 64 * 1024
# Endless bodies are paced (about 64 MB/s at most): a client that keeps everything grows fast, not
# without bound on the test machine.
ENDLESS_PAUSE_S = 0.001

BEHAVIOURS = ("ok", "cut_stream", "truncated", "invalid_utf8", "big", "endless", "slow_drip", "reset",
              "html", "html502", "hangup", "silent", "not_json", "bad_sse", "no_done")

HELP = """usage: wireserver serve [-h] [--host HOST] [--port PORT] [--api-key API_KEY]
                        [--max-model-len MAX_MODEL_LEN] [--served-model-name NAME]

options:
  --host HOST
  --port PORT
  --api-key API_KEY
  --max-model-len MAX_MODEL_LEN
  --served-model-name NAME
"""


def completion(content: str = CONTENT) -> dict[str, Any]:
    return {"id": "chatcmpl-wire", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}}


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"id": "chatcmpl-wire", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def stream_events(content: str = CONTENT) -> list[bytes]:
    words = content.split(" ")
    pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    return [event({"role": "assistant", "content": ""}), *(event({"content": p}) for p in pieces),
            event({}, "stop")]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        sys.stdout.write(f"INFO: {self.address_string()} - {format % args}\n")
        sys.stdout.flush()

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b"", "application/json")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode(),
                       "application/json")
        else:
            self._send(404, b'{"detail": "Not Found"}', "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/v1/chat/completions":
            self._send(404, b'{"detail": "Not Found"}', "application/json")
            return
        model = body.get("model")
        behaviour = model if model in BEHAVIOURS else os.environ.get("WIRE_BEHAVIOUR", "ok")
        stream = bool(body.get("stream"))
        # The client gave up (a cap, a timeout), or the behaviour closed the socket itself.
        with contextlib.suppress(OSError):
            getattr(self, f"_{behaviour}")(stream)
        self.close_connection = True

    def finish(self) -> None:
        with contextlib.suppress(OSError):  # the socket is closed already (a reset, a cut)
            super().finish()

    # --- plumbing ------------------------------------------------------------------------------

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _head(self, content_type: str, length: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _sse_head(self) -> None:
        self._head("text/event-stream; charset=utf-8")

    def _cut(self) -> None:
        """Close the connection in the middle of the answer (a FIN, no end of the body)."""
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)

    # --- behaviours ----------------------------------------------------------------------------

    def _ok(self, stream: bool) -> None:
        if stream:
            self._sse_head()
            for e in stream_events():
                self._chunk(e)
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        else:
            self._send(200, json.dumps(completion()).encode(), "application/json")

    def _cut_stream(self, stream: bool) -> None:
        if stream:
            self._sse_head()
            for e in stream_events()[:3]:
                self._chunk(e)
        else:
            data = json.dumps(completion()).encode()
            self._head("application/json", len(data))
            self.wfile.write(data[: len(data) // 2])
        self._cut()

    def _truncated(self, stream: bool) -> None:
        data = b"".join(stream_events()) + b"data: [DONE]\n\n" if stream else json.dumps(completion()).encode()
        self._head("text/event-stream" if stream else "application/json", len(data) + 1000)
        self.wfile.write(data[: len(data) - 10])
        self._cut()

    def _invalid_utf8(self, stream: bool) -> None:
        if stream:
            self._sse_head()
            self._chunk(event({"role": "assistant", "content": ""}))
            self._chunk(b'data: {"id": "chatcmpl-wire", "choices": [{"index": 0, "delta": {"content": "'
                        + BAD + b'"}, "finish_reason": null}]}\n\n')
            self._chunk(event({}, "stop"))
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        else:
            data = json.dumps(completion("@@")).encode().replace(b"@@", BAD)
            self._send(200, data, "application/json")

    def _big(self, stream: bool) -> None:
        if stream:
            one = event({"content": "x" * 8000})
            self._head("text/event-stream", len(one) * (BIG_BYTES // len(one)))
            for _ in range(BIG_BYTES // len(one)):
                self.wfile.write(one)
        else:
            data = json.dumps(completion("x" * BIG_BYTES)).encode()
            self._send(200, data, "application/json")

    def _endless(self, stream: bool) -> None:
        if stream:
            self._sse_head()
            piece = event({"content": "y" * ENDLESS_PIECE})
        else:
            self._head("application/json")
            self._chunk(b'{"id": "chatcmpl-wire", "choices": [{"message": {"content": "')
            piece = b"y" * ENDLESS_PIECE
        while True:
            self._chunk(piece)
            time.sleep(ENDLESS_PAUSE_S)

    def _slow_drip(self, stream: bool) -> None:
        self._sse_head() if stream else self._head("application/json")
        data = b"".join(stream_events()) if stream else json.dumps(completion()).encode()
        for i in range(len(data)):
            self._chunk(data[i:i + 1])
            time.sleep(DRIP_EVERY_S)

    def _reset(self, stream: bool) -> None:
        self._sse_head() if stream else self._head("application/json")
        # SO_LINGER with a zero timeout: close() sends a RST instead of a FIN.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def _html(self, stream: bool) -> None:
        self._send(200, HTML, "text/html; charset=utf-8")

    def _html502(self, stream: bool) -> None:
        self._send(502, HTML, "text/html; charset=utf-8")

    def _hangup(self, stream: bool) -> None:
        """Close the connection without a status line."""
        self.connection.shutdown(socket.SHUT_RDWR)

    def _silent(self, stream: bool) -> None:
        """Read the request, never answer (until the client goes)."""
        self.connection.settimeout(60)
        self.connection.recv(1)

    def _not_json(self, stream: bool) -> None:
        if stream:
            self._sse_head()
            self._chunk(event({"role": "assistant", "content": ""}))
            self._chunk(b"data: {'content': not json}\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        else:
            self._send(200, b"Internal error: {'content': not json}", "application/json")

    def _bad_sse(self, stream: bool) -> None:
        self._sse_head()
        self._chunk(event({"role": "assistant", "content": ""}))
        self._chunk(b"<<garbage line, not an SSE field>>\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _no_done(self, stream: bool) -> None:
        self._sse_head()
        for e in stream_events():
            self._chunk(e)
        self._chunk(b"")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(HELP)
        return 0
    args = dict(itertools.pairwise(argv))
    host, port = args.get("--host", "127.0.0.1"), int(args.get("--port", "8000"))
    server = Server((host, port), Handler)
    print(f"INFO: wire server on http://{host}:{port} ({os.environ.get('WIRE_BEHAVIOUR', 'ok')})", flush=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with contextlib.suppress(KeyboardInterrupt):
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
