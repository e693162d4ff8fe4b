"""The OpenAI-compatible HTTP server: /health, /v1/models, /v1/chat/completions, /v1/completions,
/metrics.

The stdlib's ThreadingHTTPServer starts in milliseconds and gives each connection a thread, which
is enough for a replay's bounded concurrency; latency is a sleep in that thread. Without a `perf:`
section a chat answer sleeps `token_latency_s` per token (`_pace`, `_stream`); with one, every
answer is paced by the performance model (`_paced`, see `perf`): admission, prefill, then one
decode step at a time, each streamed as it is produced.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vllmsim import chat, completions
from vllmsim.behaviour import Behaviour, start_nonce
from vllmsim.chunks import ChatRender, Render, TextRender
from vllmsim.config import EngineConfig, Startup
from vllmsim.generate import Channel
from vllmsim.logs import Line, Logger
from vllmsim.metrics import Metrics
from vllmsim.perf import LegacyTiming, Performance, RequestTiming
from vllmsim.request import IGNORED_AT_DEBUG_SINCE, ChatRequest, RequestError, ignored_fields, parse
from vllmsim.tree import Bug, Effect, Tree

_ROUTES = ("/health", "/metrics", "/version", "/v1/models", "/v1/chat/completions", "/v1/completions")
_ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class EngineDied(Exception):
    """The engine died while a paced request was running."""


class Engine:
    """State shared by all request threads."""

    def __init__(self, tree: Tree, cfg: EngineConfig, log: Logger) -> None:
        self.tree, self.cfg, self.log = tree, cfg, log
        self.behaviour = Behaviour(tree, cfg)
        self.metrics = Metrics(cfg)
        # The performance model: None without a `perf:` section (then `token_latency_s` per token).
        self.perf = Performance(tree.perf, cfg, start_nonce()) if tree.perf is not None else None
        self.stopping = threading.Event()
        self.dead = threading.Event()  # the engine died: every request now fails until the process exits
        self.created = int(time.time())
        self._slots = threading.BoundedSemaphore(cfg.max_num_seqs)
        self._load_lock = threading.Lock()
        self.running = 0  # requests admitted (prefill or decode)
        self.waiting = 0  # requests queued for a slot

    @contextlib.contextmanager
    def admitted(self, *, queue: bool) -> Iterator[bool]:
        """While a request runs: counted in `vllm:num_requests_running`, after waiting for one of
        `--max-num-seqs` slots when `queue` (the performance model; without it nothing queues).
        Yields whether the request had to wait for its slot."""
        waited = False
        if queue and not self._slots.acquire(blocking=False):
            waited = True
            self._count(waiting=1)
            try:
                self._slots.acquire()
            finally:
                self._count(waiting=-1)
        self._count(running=1)
        try:
            yield waited
        finally:
            self._count(running=-1)
            if queue:
                self._slots.release()

    def _count(self, *, running: int = 0, waiting: int = 0) -> None:
        with self._load_lock:
            self.running += running
            self.waiting += waiting
            self.metrics.load(running=self.running, waiting=self.waiting)


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a hung request must not keep the process alive after TERM
    # uvicorn's listen backlog. The stdlib's 5 makes the kernel drop connections of a burst (128 new
    # ones lost 5-10 % of requests to ReadError): false failures of the configuration under test.
    request_queue_size = 2048
    engine: Engine


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as uvicorn sets it: without it a streamed chunk waits for the ACK of the one before, and
    # a client's delayed ACK (40 ms) bunches a stream's chunks into one burst (TTFT + 40 ms, ITLs of 0).
    disable_nagle_algorithm = True
    server: SimHTTPServer
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # access lines are written in uvicorn's format by _access()

    # --- routing -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200, b"", "application/json")
        elif path == "/metrics":
            self._send(200, engine.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/version":
            self._json(200, {"version": engine.tree.version})
        elif path == "/v1/models":
            if self._authorized():
                self._json(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": name,
                                "object": "model",
                                "created": engine.created,
                                "owned_by": "vllm",
                                "root": engine.cfg.model,
                                "parent": None,
                                "max_model_len": engine.cfg.max_model_len,
                            }
                            for name in engine.cfg.served_model_names
                        ],
                    },
                )
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404 if path not in _ROUTES else 405, {"detail": "Not Found"})
            return
        if not self._authorized():
            return
        if path == "/v1/completions":
            self._completions(raw)
        else:
            self._chat(raw)

    def _authorized(self) -> bool:
        key = self.server.engine.cfg.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    # --- chat ----------------------------------------------------------------------------------

    def _chat(self, raw: bytes) -> None:
        engine = self.server.engine
        start = time.monotonic()
        rid = "chatcmpl-" + (self.headers.get("X-Request-Id") or uuid.uuid4().hex)
        if engine.dead.is_set():
            self._json(500, RequestError("EngineCore encountered an issue. See stack trace (above) for the root "
                                         "cause.", status=500, kind="InternalServerError").body())
            return
        try:
            try:
                body = json.loads(raw or b"null")
            except json.JSONDecodeError as exc:
                raise RequestError(f"JSON decode error: {exc.msg}") from exc
            req = parse(body, engine.cfg)
        except RequestError as exc:
            engine.log.error_line("serving_chat.py:253", f"Error with request {rid}: {exc.message}")
            self._json(exc.status, exc.body())
            return
        if extra := ignored_fields(body):
            level = "DEBUG" if engine.cfg.release >= IGNORED_AT_DEBUG_SINCE else "WARNING"
            if level == "WARNING" or os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG":
                engine.log.emit(Line(level, "protocol.py:51",
                                     f"The following fields were present in the request but ignored: {extra}"))
        n, bugs = engine.behaviour.bites(req.canonical, req.traits())
        engine.log.info_line("async_llm.py:351", f"Added request {rid}.")
        effects = {b.effect for b in bugs}
        if Effect.CRASH in effects:
            self._crash(rid, next(b for b in bugs if b.effect is Effect.CRASH))
            return
        if Effect.HANG in effects:
            # Never answered; TERM still ends the process because request threads are daemons.
            engine.stopping.wait()
            self.close_connection = True
            return
        rng = chat.rng_for(req, n, engine.cfg.seed)
        completion = chat.build(req, engine.cfg, bugs, rng)
        if completion.fsm_error_token is not None:
            engine.log.error_line(
                "backend_xgrammar.py:167",
                f"Failed to advance FSM for request {rid} for tokens "
                f"{completion.fsm_error_token}. Please file an issue.",
            )
        completion = chat.apply_length_options(req, engine.cfg, completion, n)
        if engine.perf is not None:
            render = ChatRender(rid, engine.cfg.served_model_names[0], int(time.time()), req, completion,
                                reasoning=engine.cfg.reasoning_parser != "none")
            self._paced(rid, engine.perf.request(req.canonical, n), completion, start, render, stream=req.stream,
                        response=lambda: self._response(rid, req, completion))
            return
        with engine.admitted(queue=False):
            self._chat_unpaced(rid, req, completion, start, rng)

    def _chat_unpaced(self, rid: str, req: ChatRequest, completion: chat.Completion, start: float,
                      rng: random.Random) -> None:
        """Without a performance model: `token_latency_s` per token, the counters drawn at the end."""
        engine = self.server.engine
        if req.stream:
            try:
                ttft = self._stream(rid, req, completion, start)
            except (BrokenPipeError, ConnectionResetError):
                engine.log.info_line("async_llm.py:410", f"Aborted request {rid}.")
                self.close_connection = True
                return
        else:
            ttft = self._pace(len(completion.tokens), start)
            self._json(200, self._response(rid, req, completion))
        engine.metrics.observe(
            prompt_tokens=len(completion.prompt_token_ids),
            generation_tokens=len(completion.tokens),
            finish_reason=completion.finish_reason,
            ttft_s=ttft,
            e2e_s=time.monotonic() - start,
            rng=rng,
        )

    # --- completions ---------------------------------------------------------------------------

    def _completions(self, raw: bytes) -> None:
        engine = self.server.engine
        start = time.monotonic()
        rid = "cmpl-" + (self.headers.get("X-Request-Id") or uuid.uuid4().hex)
        if engine.dead.is_set():
            self._json(500, RequestError(_ENGINE_DEAD, status=500, kind="InternalServerError").body())
            return
        try:
            try:
                body = json.loads(raw or b"null")
            except json.JSONDecodeError as exc:
                raise RequestError(f"JSON decode error: {exc.msg}") from exc
            req = completions.parse(body, engine.cfg)
        except RequestError as exc:
            engine.log.error_line("serving_completion.py:171", f"Error with request {rid}: {exc.message}")
            self._json(exc.status, exc.body())
            return
        n, bugs = engine.behaviour.bites(req.canonical, req.traits())
        engine.log.info_line("async_llm.py:351", f"Added request {rid}.")
        effects = {b.effect for b in bugs}
        if Effect.CRASH in effects:
            self._crash(rid, next(b for b in bugs if b.effect is Effect.CRASH))
            return
        if Effect.HANG in effects:
            engine.stopping.wait()
            self.close_connection = True
            return
        completion = completions.build(req, n, engine.cfg.seed)
        render = TextRender(rid, engine.cfg.served_model_names[0], int(time.time()), req, completion)
        if engine.perf is not None:
            timing: RequestTiming | LegacyTiming = engine.perf.request(req.canonical, n)
            legacy_rng: random.Random | None = None
        else:
            timing = LegacyTiming(engine.tree.token_latency_s)
            legacy_rng = chat.rng_for(req, n, engine.cfg.seed, stream="metrics")
        self._paced(rid, timing, completion, start, render, stream=req.stream, response=render.response,
                    legacy_rng=legacy_rng)

    # --- pacing ----------------------------------------------------------------------------------

    def _paced(
        self,
        rid: str,
        timing: RequestTiming | LegacyTiming,
        c: chat.Completion,
        start: float,
        render: Render,
        *,
        stream: bool,
        response: Callable[[], dict[str, Any]],
        legacy_rng: random.Random | None = None,
    ) -> None:
        """Admission, prefill, then one decode step at a time; each step streamed as it is produced.

        The counters move as the steps happen (the performance model), or, with `legacy_rng`, are
        drawn once at the end as the unpaced chat path draws them."""
        engine = self.server.engine
        if stream:
            self._stream_headers()
        try:
            self._run_steps(timing, c, start, render, stream=stream, legacy_rng=legacy_rng)
        except (BrokenPipeError, ConnectionResetError):
            engine.log.info_line("async_llm.py:410", f"Aborted request {rid}.")
            self.close_connection = True
            return
        except EngineDied:
            engine.log.info_line("async_llm.py:410", f"Aborted request {rid}.")
            if stream:
                self.close_connection = True  # the chunked body ends unfinished: the client sees an error
            else:
                self._json(500, RequestError(_ENGINE_DEAD, status=500, kind="InternalServerError").body())
            return
        try:
            if stream:
                for body in render.tail():
                    self._write_chunk(f"data: {json.dumps(body)}\n\n".encode())
                self._write_chunk(b"data: [DONE]\n\n")
                self._write_chunk(b"")
            else:
                self._json(200, response())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _run_steps(
        self,
        timing: RequestTiming | LegacyTiming,
        c: chat.Completion,
        start: float,
        render: Render,
        *,
        stream: bool,
        legacy_rng: random.Random | None,
    ) -> None:
        engine = self.server.engine
        metrics = engine.metrics
        counting = legacy_rng is None
        total = len(c.tokens)
        prompt_tokens = len(c.prompt_token_ids)

        def send(bodies: list[dict[str, Any]]) -> None:
            if stream:
                for body in bodies:
                    self._write_chunk(f"data: {json.dumps(body)}\n\n".encode())

        with engine.admitted(queue=counting) as waited:
            # Prefill starts when the request arrived (its parsing and generation inside the prefill
            # time, so a client's TTFT is the declared one plus the HTTP round trip), or when a slot
            # freed up for a request that queued.
            deadline = (time.monotonic() if waited else start) + timing.prefill_s(prompt_tokens)
            _sleep_until(deadline)
            if engine.dead.is_set():
                raise EngineDied
            emitted = min(1, total)  # the prefill's token
            if counting:
                metrics.prompt(prompt_tokens)
                metrics.step(emitted=emitted)
            ttft = time.monotonic() - start
            send(render.first() + render.step(c.tokens[:emitted], last=emitted == total))
            while emitted < total:
                accepted, seconds = timing.step(engine.running)
                deadline += seconds
                _sleep_until(deadline)
                if engine.dead.is_set():
                    raise EngineDied
                count = min(1 + accepted, total - emitted)
                if counting:
                    metrics.step(emitted=count, accepted=accepted if timing.k else None)
                send(render.step(c.tokens[emitted : emitted + count], last=emitted + count == total))
                emitted += count
            e2e = time.monotonic() - start
            if legacy_rng is None:
                metrics.finish(finish_reason=c.finish_reason, ttft_s=ttft, e2e_s=e2e)
            else:
                metrics.observe(prompt_tokens=prompt_tokens, generation_tokens=total,
                                finish_reason=c.finish_reason, ttft_s=ttft, e2e_s=e2e, rng=legacy_rng)

    def _stream_headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._access(200)

    def _pace(self, count: int, start: float) -> float:
        latency = self.server.engine.tree.token_latency_s
        time.sleep(latency)
        ttft = time.monotonic() - start
        time.sleep(latency * max(0, count - 1))
        return ttft

    def _response(self, rid: str, req: ChatRequest, c: chat.Completion) -> dict[str, Any]:
        cfg = self.server.engine.cfg
        message: dict[str, Any] = {
            "role": "assistant",
            "content": c.content,
            "reasoning": c.text(Channel.REASONING) or None,
            "tool_calls": c.tool_calls,
        }
        if cfg.release < (0, 26, 0):
            message["reasoning_content"] = message["reasoning"]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "stop_reason": None,
        }
        out: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": cfg.served_model_names[0],
            "choices": [choice],
            "usage": self._usage(c),
        }
        if req.return_token_ids:
            choice["token_ids"] = [t.id for t in c.tokens]
            out["prompt_token_ids"] = c.prompt_token_ids
        return out

    def _usage(self, c: chat.Completion) -> dict[str, Any]:
        details = (
            {"reasoning_tokens": c.reasoning_tokens}
            if self.server.engine.cfg.reasoning_parser != "none"
            else None
        )
        return {
            "prompt_tokens": len(c.prompt_token_ids),
            "completion_tokens": len(c.tokens),
            "total_tokens": len(c.prompt_token_ids) + len(c.tokens),
            "completion_tokens_details": details,
        }

    def _stream(self, rid: str, req: ChatRequest, c: chat.Completion, start: float) -> float:
        engine = self.server.engine
        model, created = engine.cfg.served_model_names[0], int(time.time())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._access(200)

        def chunk(
            delta: dict[str, Any] | None,
            finish: str | None = None,
            token_ids: list[int] | None = None,
            usage: dict[str, Any] | None = None,
        ) -> None:
            body: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
            }
            if delta is not None:
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish,
                }
                if req.return_token_ids and token_ids is not None:
                    choice["token_ids"] = token_ids
                body["choices"].append(choice)
            if usage is not None:
                body["usage"] = usage
            self._write_chunk(f"data: {json.dumps(body)}\n\n".encode())

        chunk({"role": "assistant", "content": ""}, token_ids=[])
        ttft = 0.0
        for i, token in enumerate(c.tokens):
            time.sleep(engine.tree.token_latency_s)
            if i == 0:
                ttft = time.monotonic() - start
            if token.channel is Channel.REASONING:
                chunk({"reasoning": token.text}, token_ids=[token.id])
            elif token.channel is Channel.CONTENT or (token.channel is Channel.TOOL and not c.tool_calls):
                chunk({"content": token.text}, token_ids=[token.id])
        if c.tool_calls:
            chunk({"tool_calls": c.tool_calls}, token_ids=[])
        chunk({}, finish=c.finish_reason, token_ids=[])
        if req.include_usage:
            chunk(None, usage=self._usage(c))
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")
        return ttft

    def _crash(self, rid: str, bug: Bug) -> None:
        """The engine dies the way vLLM's does: the worker's traceback with the root cause, the engine
        core's fatal error re-raising it, the API server's EngineDeadError, a 500, then exit. Each
        line carries its process prefix and logger header, as in `tests/data/vllm/*-crash.log`."""
        self.server.engine.dead.set()
        log = self.server.engine.log
        spec = self.server.engine.cfg.spec_method != "none"
        root = bug.message or "RuntimeError: CUDA error: an illegal memory access was encountered"
        if ":" not in root:
            root = f"RuntimeError: {root}"
        site = "/usr/lib/python3/site-packages/vllm"
        inner = ([f'  File "{site}/v1/worker/gpu_model_runner.py", line 3681, in _sample',
                  "    sampler_output = self.rejection_sampler(",
                  f'  File "{site}/v1/sample/rejection_sampler.py", line 469, in rejection_sample',
                  "    _rejection_greedy_sample("] if spec else
                 [f'  File "{site}/v1/worker/gpu_model_runner.py", line 2480, in execute_model',
                  "    torch.cuda.synchronize()"])
        pid, stamp = os.getpid(), time.strftime("%m-%d %H:%M:%S")

        def block(proc: str, where: str, lines: list[str]) -> None:
            log.raw("\n".join(f"({proc} pid={pid}) ERROR {stamp} [{where}] {ln}" for ln in lines))

        block("Worker", "multiproc_executor.py:1055", [
            "WorkerProc hit an exception.", "Traceback (most recent call last):",
            f'  File "{site}/v1/executor/multiproc_executor.py", line 1047, in _execute_worker_rpc',
            "    output = func(*args, **kwargs)", *inner, root])
        block("EngineCore_DP0", "core.py:1368", [
            "EngineCore encountered a fatal error.", "Traceback (most recent call last):",
            f'  File "{site}/v1/engine/core.py", line 1352, in run_engine_core',
            "    engine_core.run_busy_loop()",
            f'  File "{site}/v1/executor/multiproc_executor.py", line 437, in get_response',
            "    raise RuntimeError(",
            (f"RuntimeError: Worker failed with error '{root.partition(': ')[2]}', please check the stack trace "
             "above for the root cause")])
        block("APIServer", "async_llm.py:843", [
            f"AsyncLLM output_handler failed while processing request {rid}.", "Traceback (most recent call last):",
            f'  File "{site}/v1/engine/core_client.py", line 1175, in get_output_async',
            "    raise self._format_exception(outputs) from None",
            ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
             "for the root cause.")])
        self._json(
            500,
            RequestError(
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                status=500,
                kind="InternalServerError",
            ).body(),
        )
        # Exit after the reply is on the wire, as the API server does once its engine is dead.
        threading.Timer(bug.exit_after_s, os._exit, args=(1,)).start()

    # --- plumbing ------------------------------------------------------------------------------

    def _json(self, status: int, body: Any) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self._access(status)

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _access(self, status: int) -> None:
        host, port = self.client_address[:2]
        phrase = HTTPStatus(status).phrase
        self.server.engine.log.uvicorn(f'{host}:{port} - "{self.requestline}" {status} {phrase}')


def run(startup: Startup, tree: Tree, log: Logger) -> int:
    """Start-up delay, bind, serve until TERM. Returns the exit code."""
    cfg = startup.config
    assert cfg is not None
    engine = Engine(tree, cfg, log)
    for line in engine.behaviour.start_lines():
        log.emit(line)
    for line in engine.perf.start_lines() if engine.perf is not None else []:
        log.emit(line)

    # The handler takes no lock: it runs in the main thread, which may hold the very lock that
    # Event.set() needs (inside Event.wait), and would then wait on itself forever. A pipe carries the
    # stop to a thread that sets the event.
    stop_r, stop_w = os.pipe()

    def stop(signum: int, frame: Any) -> None:
        os.write(stop_w, b"\0")

    def relay_stop() -> None:
        os.read(stop_r, 1)
        engine.stopping.set()

    threading.Thread(target=relay_stop, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Like vLLM, nothing listens until the engine is ready: /health is refused during start-up.
    if engine.stopping.wait(tree.startup_s):
        log.info_line("launcher.py:80", "Shutting down before start-up completed.")
        return 0
    log.info_line(
        "core.py:250",
        f"init engine (profile, create kv cache, warmup model) took {tree.startup_s:.2f} seconds",
        engine=True,
    )
    try:
        httpd = SimHTTPServer((cfg.host, cfg.port), Handler)
    except OSError as exc:
        log.raw(f"OSError: [Errno {exc.errno}] {exc.strerror}")
        return 1
    httpd.engine = engine
    log.info_line(
        "api_server.py:1971", f"Starting vLLM API server 0 on http://{cfg.host}:{httpd.server_port}"
    )
    for route in _ROUTES:
        method = "POST" if route.endswith("completions") else "GET"
        log.info_line("launcher.py:46", f"Route: {route}, Methods: {method}")
    log.uvicorn(f"Started server process [{os.getpid()}]")
    log.uvicorn("Waiting for application startup.")
    log.uvicorn("Application startup complete.")

    def shutdown_on_stop() -> None:
        engine.stopping.wait()
        httpd.shutdown()

    threading.Thread(target=shutdown_on_stop, daemon=True).start()
    httpd.serve_forever(poll_interval=0.1)
    httpd.server_close()
    log.uvicorn("Shutting down")
    log.uvicorn("Waiting for application shutdown.")
    log.uvicorn("Application shutdown complete.")
    log.uvicorn(f"Finished server process [{os.getpid()}]")
    sys.stdout.flush()
    return 0


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)
