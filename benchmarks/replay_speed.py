"""P5: the replay client against a bare httpx loop, at concurrency 16, on one simulator server.

    .venv/bin/python benchmarks/replay_speed.py [--requests 2000] [--rounds 3]

Both send the same chat requests (X-Request-Id, API key, JSON body) with 16 workers over one
httpx.AsyncClient; the bare loop only parses the JSON, the replay also builds its samples' replies.
Rounds alternate (replay, bare, replay, ...) so that drift in the machine's load hits both alike;
the ratio is of the median throughputs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from sweeper.execute.replay import Request, run_replay

BODY = {"model": "m", "messages": [{"role": "user", "content": "Extract the invoice as JSON."}], "max_tokens": 64}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def sim(tmp: Path) -> Iterator[str]:
    (tmp / "sim.yaml").write_text(yaml.safe_dump({"version": "0.28.0", "startup_s": 0.0, "token_latency_s": 0.0002}))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vllmsim", "serve", "m", "--host", "127.0.0.1", "--port",
                             str(port), "--api-key", "k"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "SWEEP_SIM_TREE": str(tmp)}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def bare(url: str, n: int, concurrency: int) -> int:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    ok = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits, headers={"Authorization": "Bearer k"}) as client:

        async def worker() -> None:
            nonlocal ok
            while not queue.empty():
                i = queue.get_nowait()
                r = await client.post(f"{url}/v1/chat/completions", json=BODY, headers={"X-Request-Id": f"bare-{i}"})
                ok += r.status_code == 200 and isinstance(json.loads(r.content), dict)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    n, c = args.requests, args.concurrency
    rates: dict[str, list[float]] = {"replay": [], "bare": []}
    with tempfile.TemporaryDirectory() as d, sim(Path(d)) as url:
        run_replay(url, "k", [Request("w", i, f"warm-{i}", BODY) for i in range(100)], concurrency=c, timeout_s=30)
        for r in range(args.rounds):
            t0 = time.perf_counter()
            out = run_replay(url, "k", [Request("c", i, f"rp-{r}-{i}", BODY) for i in range(n)],
                             concurrency=c, timeout_s=30)
            rates["replay"].append(n / (time.perf_counter() - t0))
            assert sum(x.http_status == 200 for x in out.replies) == n
            t0 = time.perf_counter()
            assert asyncio.run(bare(url, n, c)) == n
            rates["bare"].append(n / (time.perf_counter() - t0))
    replay, plain = statistics.median(rates["replay"]), statistics.median(rates["bare"])
    print(f"| client | requests/s (median of {args.rounds}, {n} requests each, concurrency {c}) |\n|---|---|")
    print(f"| sweeper replay | {replay:.0f} |\n| bare httpx loop | {plain:.0f} |")
    print(f"\nP5 replay ÷ bare httpx: {replay / plain:.2f} (rounds: "
          + ", ".join(f"{a / b:.2f}" for a, b in zip(rates["replay"], rates["bare"], strict=True))
          + f"; 1-minute load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
