"""The sweeper's load generator (`sweeper.execute.load`) against real simulator servers with a known
performance model: vLLM's timing definitions, warm-ups kept out of the figures, seeded Poisson
arrivals, the concurrency limit, and a stalled or killed server stopping the phase with the reason.

Timings on a shared machine are noisy: the model's times are chosen large against that noise (tens of
milliseconds) and the bounds leave room for the scheduler, never for a wrong definition (TPOT with the
first token counted, ITL per token instead of per chunk, warm-ups measured: each is off by far more).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sweeper.execute import server_metrics
from sweeper.execute.bench_phase import random_token_prompts
from sweeper.execute.load import COMPLETIONS, Pace, Prompt, arrival_times, run_load, run_load_sync
from sweeper.execute.server import ServerProcess, free_port
from sweeper.judge import serving

PREFILL_S = 0.0004   # per prompt token: 200 tokens -> 80 ms
STEP_S = 0.02        # one decode step
PERF = {"prefill_s_per_token": PREFILL_S, "decode_step_s": STEP_S, "draft_s_per_token": 0.0, "batch_slowdown": 0.0,
        "start_cv": 0.0, "request_cv": 0.0}


@contextmanager
def sim(tmp_path: Path, sim_yaml: dict[str, Any], *extra: str, name: str = "sim") -> Iterator[ServerProcess]:
    """A simulator server of one `sim.yaml`, as the runner starts one (own process group, stopped after)."""
    tree = tmp_path / f"{name}-tree"
    tree.mkdir()
    (tree / "sim.yaml").write_text(yaml.safe_dump({"version": "0.32.0", "startup_s": 0.05, **sim_yaml}))
    port = free_port()
    argv = [sys.executable, "-m", "vllmsim", "serve", "m", "--port", str(port), *extra]
    server = ServerProcess(argv, {**os.environ, "SWEEP_SIM_TREE": str(tree)}, port=port,
                           log_path=tmp_path / f"{name}.log", startup_timeout_s=30)
    with server:
        yield server


def prompts(n: int, input_len: int, output_len: int, seed: int = 0) -> list[Prompt]:
    made = random_token_prompts(n, input_len=input_len, output_len=output_len, range_ratio=0.0, vocab=1000,
                                excluded=frozenset(), seed=seed)
    return [Prompt(COMPLETIONS, {"model": "m", "prompt": ids, "max_tokens": out, "min_tokens": out, "ignore_eos": True,
                                 "temperature": 0}, len(ids), out) for ids, out in made]


def successes(server: ServerProcess) -> float:
    return server_metrics.total(server_metrics.parse(server_metrics.scrape(server.base_url)), serving.SUCCESS)


# --- arrivals (pure) ------------------------------------------------------------------------------

def test_arrivals_are_seeded_poisson_scaled_to_n_over_rate() -> None:
    a = arrival_times(200, 4.0, 1.0, seed=7)
    assert a == arrival_times(200, 4.0, 1.0, seed=7)  # the same seed, the same times
    assert a != arrival_times(200, 4.0, 1.0, seed=8)
    assert a == sorted(a) and a[-1] == pytest.approx(200 / 4.0)  # vLLM's rescaling: the last at n / rate
    gaps = np.diff([0.0, *a])
    # Exponential gaps (burstiness 1): their coefficient of variation is 1; gamma with burstiness 4: 1/2.
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.2)
    smooth = np.diff([0.0, *arrival_times(200, 4.0, 4.0, seed=7)])
    assert np.std(smooth) / np.mean(smooth) == pytest.approx(0.5, abs=0.12)
    assert arrival_times(5, math.inf, 1.0, seed=1) == [0.0] * 5
    assert arrival_times(4, 2.0, math.inf, seed=1) == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_random_prompts_are_seeded_and_in_the_vocabulary() -> None:
    a = random_token_prompts(20, input_len=50, output_len=10, range_ratio=0.5, vocab=300, excluded=frozenset({0, 1}),
                             seed=3)
    assert a == random_token_prompts(20, input_len=50, output_len=10, range_ratio=0.5, vocab=300,
                                     excluded=frozenset({0, 1}), seed=3)
    assert a != random_token_prompts(20, input_len=50, output_len=10, range_ratio=0.5, vocab=300,
                                     excluded=frozenset({0, 1}), seed=4)
    ids = [t for p, _ in a for t in p]
    assert min(ids) >= 2 and max(ids) < 300
    assert all(25 <= len(p) <= 75 and 5 <= out <= 15 for p, out in a)
    assert len({len(p) for p, _ in a}) > 1  # range_ratio spreads the lengths
    fixed = random_token_prompts(5, input_len=50, output_len=10, range_ratio=0.0, vocab=300, excluded=frozenset(),
                                 seed=3)
    assert all(len(p) == 50 and out == 10 for p, out in fixed)


# --- the wire: what a server may do that the simulator does not ----------------------------------------

def _events(n: int) -> bytes:
    chunks = [b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'] * n
    return b"".join(chunks) + b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": %d}}\n\n' \
        b"data: [DONE]\n\n" % n


def test_the_wire_takes_split_events_a_closed_keep_alive_and_a_body_read_to_its_end() -> None:
    """Answers in turn: chunked with an event split across chunks (then the server closes the kept
    connection, as an idle timeout would); chunked again on a new connection; `Connection: close`
    with no length (read to the end)."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            served.append(len(served))
            body = _events(3)
            if len(served) == 3:
                writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
                await writer.drain()
                break
            cut = body.index(b"text") + 2
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (body[:cut], body[cut:]):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            if len(served) == 1:
                break  # close the kept connection: the next request finds it closed
        writer.close()

    async def run() -> Any:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await run_load(f"http://127.0.0.1:{port}", prompts(3, 4, 3), Pace(concurrency=1, timeout_s=5))

    out = asyncio.run(run())
    assert [r.ok for r in out.records] == [True, True, True], [r.error for r in out.records]
    assert all(r.chunks == 3 and r.output_tokens == 3 and r.prompt_tokens == 4 for r in out.records)
    # The first event, split, counts when its second half comes (10 ms later), not at its first byte.
    assert (out.records[0].ttft or 0) >= 0.009 and len(out.records[0].itl) == 2
    assert served == [0, 1, 2]


# --- against a simulator with a known performance model ------------------------------------------

def test_ttft_is_prefill_and_tpot_the_step_time(tmp_path: Path) -> None:
    with sim(tmp_path, {"perf": PERF}) as server:
        out = run_load_sync(server.base_url, prompts(8, 200, 11), Pace(concurrency=1, num_warmups=1))
    assert out.stopped is None and all(r.ok for r in out.records)
    row = serving.figures(out.records, out.duration, out.t0)
    assert row["completed"] == 8 and row["failed"] == 0
    assert row["total_input_tokens"] == 8 * 200 and row["total_output_tokens"] == 8 * 11  # from usage
    prefill = 200 * PREFILL_S
    assert prefill * 0.9 <= row["median_ttft_ms"] / 1000 <= prefill + 0.06
    # TPOT excludes the first token: (e2el - ttft) / 10 is one step; counting it would give 10/11 of one.
    assert row["median_tpot_ms"] / 1000 == pytest.approx(STEP_S, rel=0.12)
    # One chunk per step without speculation: ITL is the step too, 10 gaps per request.
    assert row["median_itl_ms"] / 1000 == pytest.approx(STEP_S, rel=0.2)
    assert all(len(r.itl) == 10 and r.chunks == 11 for r in out.records)
    assert row["median_e2el_ms"] / 1000 == pytest.approx(prefill + 10 * STEP_S, abs=0.06)
    # Closed loop at concurrency 1: throughput is one request per E2EL (up to the gaps between them).
    assert row["request_throughput"] == pytest.approx(1000 / row["mean_e2el_ms"], rel=0.25)
    # Concurrency 1: each request is sent after the one before it finished.
    spans = sorted((r.start, r.start + r.e2el) for r in out.records)
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    for se in ("mean_ttft_ms_se", "mean_tpot_ms_se", "request_throughput_se", "output_throughput_se"):
        assert row[se] is not None and row[se] >= 0


def test_speculative_chunks_carry_several_tokens_and_itl_is_per_chunk(tmp_path: Path) -> None:
    accept = [1.0, 1.0]  # every draft accepted: each step emits 3 tokens in one chunk
    spec = '{"method": "mtp", "num_speculative_tokens": 2}'
    with sim(tmp_path, {"perf": {**PERF, "acceptance": {"mtp": accept}}}, "--speculative-config", spec) as server:
        out = run_load_sync(server.base_url, prompts(6, 20, 31), Pace(concurrency=2))
    row = serving.figures(out.records, out.duration, out.t0)
    assert all(r.ok and r.output_tokens == 31 and r.chunks == 11 for r in out.records)  # 1 + 10 steps of 3
    assert row["median_itl_ms"] / 1000 == pytest.approx(STEP_S, rel=0.2)  # a gap per chunk, not per token
    # TPOT per token: a step over the 3 tokens its chunk carries (the sim paces steps to deadlines from
    # the first token, so a first chunk sent late shortens the rest: the bound is loose, not the definition).
    assert row["mean_tpot_ms"] / 1000 == pytest.approx(STEP_S / 3, rel=0.3)


def test_warmups_are_sent_first_and_never_measured(tmp_path: Path) -> None:
    seen: list[float] = []
    with sim(tmp_path, {"perf": PERF}) as server:
        out = run_load_sync(server.base_url, prompts(5, 10, 3), Pace(concurrency=2, num_warmups=3),
                            after_warmup=lambda: seen.append(successes(server)))
        total = successes(server)
    assert seen == [3.0]  # the scrape before the measured requests comes after the warm-ups are done
    assert total == 8.0
    assert len(out.records) == 5 and [r.index for r in out.records] == list(range(5))
    assert out.warmups == 3 and out.warmups_failed == 0
    first_send = min(r.start for r in out.records)
    assert first_send >= out.t0  # the measured phase (its duration) starts after the warm-ups


def test_concurrency_is_a_limit_and_a_rate_paces_the_sends(tmp_path: Path) -> None:
    with sim(tmp_path, {"perf": PERF}) as server:
        limited = run_load_sync(server.base_url, prompts(12, 10, 6), Pace(concurrency=3))
        paced = run_load_sync(server.base_url, prompts(10, 10, 2), Pace(concurrency=None, request_rate=20.0, seed=5))
    events = sorted([(r.start, 1) for r in limited.records] + [(r.start + r.e2el, -1) for r in limited.records])
    assert int(np.cumsum([step for _, step in events]).max()) == 3  # in flight at once, at most the limit
    arrivals = arrival_times(10, 20.0, 1.0, seed=5)
    sent = [r.start - paced.t0 for r in paced.records]
    assert all(s >= a - 1e-3 for s, a in zip(sent, arrivals, strict=True))  # never before its arrival
    assert all(s - a < 0.1 for s, a in zip(sent, arrivals, strict=True))  # and not much after (no limit)
    assert paced.duration >= arrivals[-1]


def test_an_error_answer_fails_its_request_and_the_phase_goes_on(tmp_path: Path) -> None:
    good = prompts(3, 10, 2)
    wrong = Prompt(COMPLETIONS, {**good[0].body, "model": "not-served"})
    with sim(tmp_path, {"perf": PERF}) as server:
        out = run_load_sync(server.base_url, [good[0], wrong, good[1], wrong, good[2]], Pace(concurrency=1))
    assert [r.ok for r in out.records] == [True, False, True, False, True]
    assert out.stopped is None
    assert out.records[1].status == 404 and "does not exist" in (out.records[1].error or "")
    reason = serving.judge_phase(out.records, stopped=out.stopped, alive=True, metrics_problem=None)
    assert reason is not None and reason.startswith("2 of 5 requests failed: HTTP 404")


def test_a_stalled_server_stops_the_phase_with_the_reason(tmp_path: Path) -> None:
    hang = {"perf": PERF, "bugs": [{"id": "hang", "effect": "hang", "when": {"stream": True}, "rate": 1.0}]}
    with sim(tmp_path, hang) as server:
        t = time.monotonic()
        out = run_load_sync(server.base_url, prompts(20, 10, 3), Pace(concurrency=2, timeout_s=1.0))
        took = time.monotonic() - t
    assert took < 5  # not 20 requests x the timeout
    assert out.stopped is not None and out.stopped.startswith("stalled")
    assert not any(r.ok for r in out.records)
    reason = serving.judge_phase(out.records, stopped=out.stopped, alive=True, metrics_problem=None)
    assert reason is not None and "stopped early: stalled" in reason


def test_a_server_killed_mid_phase_fails_its_requests_and_says_so(tmp_path: Path) -> None:
    with sim(tmp_path, {"perf": PERF}) as server:
        assert server.proc is not None
        pgid = server.proc.pid
        threading.Timer(0.5, lambda: os.killpg(pgid, signal.SIGKILL)).start()
        out = run_load_sync(server.base_url, prompts(40, 10, 10), Pace(concurrency=2, timeout_s=5.0),
                            alive=server.alive)
        alive = server.alive()
    done = [r for r in out.records if r.ok]
    assert 0 < len(done) < 40 and not alive
    assert out.stopped == "the server process exited"
    reason = serving.judge_phase(out.records, stopped=out.stopped, alive=alive, metrics_problem=None)
    assert reason is not None and reason.startswith("the server exited during the load phase")
