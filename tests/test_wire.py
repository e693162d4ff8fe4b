"""A server that misbehaves on the wire: each misbehaviour is a named transport verdict, bounded.

The server is `tests/wireserver.py`, a real subprocess on 127.0.0.1 that serves /health and
/v1/models normally and misbehaves on /v1/chat/completions (the request's model names how).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweeper.execute.replay import Reply, Request, run_replay
from sweeper.execute.server import free_port
from sweeper.spec.checks import Exchange, clip, parse_spec, run_checks
from sweeper.spec.status import Transport

WIRE_SERVER = Path(__file__).with_name("wireserver.py")
CHECKS = [parse_spec("http_ok", None), parse_spec("finish_reason", None), parse_spec("content_nonempty", None)]


def start_wire_server(env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(WIRE_SERVER), "serve", "m", "--host", "127.0.0.1",
                             "--port", str(port)], env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the wire server did not start")


@pytest.fixture
def wire() -> Iterator[str]:
    proc, url = start_wire_server()
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def send(url: str, behaviour: str, stream: bool, *, timeout_s: float = 5.0, max_response_mb: float = 16.0) -> Reply:
    body = {"model": behaviour, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    out = run_replay(url, "key", [Request(behaviour, 0, f"r-{behaviour}", body)], concurrency=1, timeout_s=timeout_s,
                     max_response_mb=max_response_mb)
    assert len(out.replies) == 1
    return out.replies[0]


def judged(reply: Reply) -> tuple[list[str], dict[str, str]]:
    verdicts = run_checks(CHECKS, Exchange(request=reply.request.body, http_status=reply.http_status,
                                           response=reply.response, error=reply.error, transport=reply.transport))
    failed = [v for v in verdicts if not v.passed]
    return [v.check for v in failed], {v.check: v.detail for v in failed}


# (behaviour, stream) -> the verdict, and words its detail must hold.
CASES = [
    ("cut_stream", True, Transport.CLOSED_EARLY, "closed the connection in the middle of the body"),
    ("cut_stream", False, Transport.TRUNCATED, "of the 282 bytes its Content-Length announced"),
    ("truncated", False, Transport.TRUNCATED, "bytes its Content-Length announced"),
    ("truncated", True, Transport.TRUNCATED, "bytes its Content-Length announced"),
    ("invalid_utf8", True, Transport.INVALID_UTF8, "invalid UTF-8 at byte"),
    ("invalid_utf8", False, Transport.INVALID_UTF8, "invalid UTF-8 at byte"),
    ("big", False, Transport.TOO_LARGE, "over the response cap"),
    ("big", True, Transport.TOO_LARGE, "over the response cap"),
    ("endless", False, Transport.TOO_LARGE, "grew past the response cap"),
    ("endless", True, Transport.TOO_LARGE, "grew past the response cap"),
    ("slow_drip", False, Transport.TIMEOUT_TOTAL, "was still coming"),
    ("slow_drip", True, Transport.TIMEOUT_TOTAL, "was still coming"),
    ("reset", False, Transport.RESET, "reset the connection after the status line (HTTP 200)"),
    ("reset", True, Transport.RESET, "reset the connection after the status line (HTTP 200)"),
    ("hangup", False, Transport.CLOSED_EARLY, "closed the connection without answering"),
    ("silent", False, Transport.TIMEOUT_READ, "waiting for the answer (connected, request sent, no status line)"),
    ("html", False, Transport.CONTENT_TYPE, "content type 'text/html; charset=utf-8', not application/json"),
    ("html", True, Transport.CONTENT_TYPE, "content type 'text/html; charset=utf-8', not text/event-stream"),
    ("not_json", False, Transport.NOT_JSON, "the body is not JSON"),
    ("not_json", True, Transport.NOT_JSON, "event 2 of the stream is not JSON"),
    ("bad_sse", True, Transport.BAD_SSE, "is no server-sent-events field: '<<garbage line"),
    ("no_done", True, Transport.NO_DONE, "without `data: [DONE]`"),
]


@pytest.mark.parametrize(("behaviour", "stream", "verdict", "words"), CASES,
                         ids=[f"{b}-{'stream' if s else 'plain'}" for b, s, _, _ in CASES])
def test_each_wire_failure_is_named(wire: str, behaviour: str, stream: bool, verdict: Transport, words: str) -> None:
    reply = send(wire, behaviour, stream, timeout_s=2.0 if behaviour in ("slow_drip", "silent") else 10.0,
                 max_response_mb=4)
    assert reply.transport == verdict, reply
    assert reply.error is not None and words in reply.error, reply.error
    assert reply.timed_out == verdict.timed_out
    failed, details = judged(reply)
    # The wire failure is the sample's failure, named; the checks that read the body are not judged.
    label = f"transport: {verdict.value}"
    assert label in failed and details[label] == clip(reply.error)
    assert not {"finish_reason", "content_nonempty"} & set(failed)
    # http_ok says whether a status line came, as always.
    assert ("http_ok" in failed) == (reply.http_status is None)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_control_passes(wire: str, stream: bool) -> None:
    reply = send(wire, "ok", stream)
    assert (reply.http_status, reply.transport, reply.error) == (200, None, None)
    assert judged(reply) == ([], {})
    assert reply.response is not None and reply.response["choices"][0]["message"]["content"] == "Hello there, a fine answer."


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_invalid_utf8_keeps_the_content_and_shows_where(wire: str, stream: bool) -> None:
    reply = send(wire, "invalid_utf8", stream)
    assert reply.response is not None
    # The bad bytes are U+FFFD in the content kept for triage; the error names their offset and shows them.
    assert reply.response["choices"][0]["message"]["content"] == "Hello \ufffd\ufffd there \ufffd(."
    assert reply.error is not None and "\\xff\\xfe there \\xc3(." in reply.error


def test_no_listener_is_refused_and_a_full_backlog_a_connect_timeout() -> None:
    reply = send(f"http://127.0.0.1:{free_port()}", "ok", False)
    assert reply.transport == Transport.REFUSED and reply.error.startswith("could not connect"), reply
    # A socket that listens but never accepts: once its backlog is full the kernel drops new SYNs,
    # and a connection is never made.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        fillers = []
        try:
            for _ in range(4):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(listener.getsockname())
                fillers.append(filler)
            time.sleep(0.2)
            reply = send(url, "ok", False, timeout_s=1.0)
        finally:
            for filler in fillers:
                filler.close()
    assert reply.transport == Transport.TIMEOUT_CONNECT and reply.timed_out, reply
    assert reply.error == "timeout after 1s: no connection to the server"


def test_an_error_status_with_an_html_page_says_what_came(wire: str) -> None:
    reply = send(wire, "html502", False)
    assert (reply.http_status, reply.transport) == (502, None)
    assert reply.error is not None and reply.error.startswith("HTTP 502 (text/html; charset=utf-8, body starts b'<!DOCTYPE")


MEASURE = textwrap.dedent("""
    import json, resource, sys
    from sweeper.execute.replay import Request, run_replay

    url, cap, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    def send(behaviour):
        body = {"model": behaviour, "messages": [], "stream": False}
        return run_replay(url, "key", [Request(behaviour, 0, "r", body)], concurrency=1, timeout_s=timeout,
                          max_response_mb=cap).replies[0]
    send("ok")  # everything imported and warmed up before the baseline
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reply = send("endless")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"growth_mb": (after - before) / 1024, "transport": reply.transport,
                      "latency_s": reply.latency_s}))
""")


def test_an_endless_body_is_read_only_up_to_the_cap(wire: str) -> None:
    """The replaying process's peak memory grows by the cap and a fixed overhead, not by wire speed
    times the request timeout (the endless body comes at up to ~64 MB/s, for up to 6 s)."""
    cap = 24.0
    out = subprocess.run([sys.executable, "-c", MEASURE, wire, str(cap), "6"], capture_output=True, text=True,
                         timeout=60, check=True)
    got = json.loads(out.stdout)
    assert got["transport"] == Transport.TOO_LARGE, got
    assert got["growth_mb"] < cap + 16, got


def test_samples_written_before_the_transport_column_still_read(tmp_path: Path) -> None:
    from sweeper.store.frames import load_table
    from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, open_run, parquet_bytes, table

    # A samples file as the sweeper wrote it before the column: schema version 1, no `transport`.
    old_schema = pa.schema([f for f in SAMPLE_SCHEMA if f.name != "transport"],
                           metadata={b"schema_version": b"1", b"sweeper.rows": b"1", b"sweeper.group": b"g"})
    run = open_run(tmp_path, "old", create=True)
    samples = table([{"run_id": "old", "group_id": "g", "cell_id": "c", "passed": False,
                      "failed_checks": ["http_ok"], "error": "ReadError: "}], old_schema)
    cells = table([{"run_id": "old", "group_id": "g", "cell_id": "c", "status": "ok"}], CELL_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(samples, sink)
    data = sink.getvalue()
    run.samples_path("g").write_atomic(data)
    run.cells_path("g").write_atomic(parquet_bytes(cells, {"group": "g", "samples_rows": 1,
                                                           "samples_bytes": data.size}))
    rows = load_table(run, "samples").to_pylist()
    assert [(r["cell_id"], r["error"], r["transport"]) for r in rows] == [("c", "ReadError: ", None)]


SUITE = """
name: wire
defaults:
  body: {max_tokens: 16, messages: [{role: user, content: hi}]}
  checks: [http_ok, {finish_reason: {expected: stop}}, content_nonempty]
cases:
  - id: plain
    body: {stream: false}
  - id: streamed
    body: {stream: true}
"""

# One cell (one server) per behaviour: what its plain and its streamed request must be.
GROUP = {
    "ok": (None, None),
    "cut_stream": (Transport.TRUNCATED, Transport.CLOSED_EARLY),
    "truncated": (Transport.TRUNCATED, Transport.TRUNCATED),
    "invalid_utf8": (Transport.INVALID_UTF8, Transport.INVALID_UTF8),
    "big": (Transport.TOO_LARGE, Transport.TOO_LARGE),
    "endless": (Transport.TOO_LARGE, Transport.TOO_LARGE),
    "slow_drip": (Transport.TIMEOUT_TOTAL, Transport.TIMEOUT_TOTAL),
    "reset": (Transport.RESET, Transport.RESET),
    "html": (Transport.CONTENT_TYPE, Transport.CONTENT_TYPE),
}


def test_a_sweep_of_misbehaving_servers_names_each_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through a whole sweep (in-process executor, a preinstalled install whose launcher is the wire
    server): every cell is written, each sample carries its verdict, the control passes, and the
    report's failing checks, --explain's modes and --issue name the wire failures."""
    from conftest import run_cli

    from sweeper.drivers.sweep import run_matrix
    from sweeper.execute.choice import choose
    from sweeper.store import frames as analysis

    (tmp_path / "s.yaml").write_text(SUITE)
    launch = json.dumps(["{python}", str(WIRE_SERVER), "serve"])
    (tmp_path / "m.yaml").write_text(textwrap.dedent(f"""
        name: wire
        model: m
        suite: s.yaml
        install: {{kind: preinstalled, python: {json.dumps(sys.executable)}, launch: {launch}}}
        gpus_per_cell: 0
        concurrency: 2
        max_response_mb: 1
        timeouts: {{startup_s: 60, request_s: 8}}
        axes:
          env.WIRE_BEHAVIOUR: {json.dumps(list(GROUP))}
    """))
    # request_s is not tight: on a loaded machine the 50 MB answer's status line once took over 2 s
    # to come, and a timeout is then named instead of the cap.
    runs = tmp_path / "runs"
    outcome = run_matrix(tmp_path / "m.yaml", runs_dir=runs, run_id="wire", executor=choose("local"),
                         cache_dir=tmp_path / "cache")
    samples = analysis.load_table(outcome.run, "samples").to_pylist()
    cells = {json.loads(dict(c["axes"])["env.WIRE_BEHAVIOUR"]): c for c in analysis.load_table(outcome.run, "cells").to_pylist()}
    assert set(cells) == set(GROUP)
    got: dict[str, dict[str, str | None]] = {b: {} for b in GROUP}
    by_id = {c["cell_id"]: b for b, c in cells.items()}
    for s in samples:
        got[by_id[s["cell_id"]]][s["case_id"]] = s["transport"]
        if s["transport"]:
            assert not s["passed"] and f"transport: {s['transport']}" in s["failed_checks"], s
            assert s["error"], s
    assert got == {b: {"plain": p, "streamed": st} for b, (p, st) in GROUP.items()}
    assert cells["ok"]["status"] == "ok" and cells["ok"]["n_failed"] == 0
    assert cells["slow_drip"]["status"] == "timeout"  # every slot waited a full request timeout
    assert all(c["status"] == "ok" for b, c in cells.items() if b != "slow_drip"), cells
    assert dict(cells["reset"]["failed_checks"]) == {"transport: reset": 2}
    # Latency is of answers that came whole: a 200 reset by the server has none.
    assert cells["reset"]["latency_p50_s"] is None and cells["ok"]["latency_p50_s"] is not None

    code, out, _ = run_cli(["report", "--runs-dir", str(runs), "wire"], capsys)
    assert code == 0 and "transport: invalid_utf8" in out, out  # the mode label of its row
    code, out, _ = run_cli(["report", "--runs-dir", str(runs), "wire", "--explain"], capsys)
    # One mode per wire failure, whichever case showed it (plain and streamed requests alike).
    assert code == 0 and re.search(r"transport: reset +\(2 failing samples; cases: 2\)", out), out
    assert re.search(r"transport: too_large +\(4 failing samples; cases: 2\)", out), out
    code, out, _ = run_cli(["report", "--runs-dir", str(runs), "wire", "--issue", "--mode", "transport: reset"],
                           capsys)
    assert code == 0 and "the server reset the connection after the status line" in out, out


def test_the_simulator_answers_whole_streamed_and_plain(tmp_path: Path) -> None:
    """The strict reading passes what a vLLM-like server sends: the simulator's SSE and JSON."""
    from conftest import make_sim_repo

    from sweeper.drivers.sweep import run_matrix
    from sweeper.execute.choice import choose
    from sweeper.store import frames as analysis

    (tmp_path / "s.yaml").write_text(SUITE.replace("{finish_reason: {expected: stop}}",
                                                   "{finish_reason: {expected: [stop, length]}}"))
    make_sim_repo(tmp_path / "vllm", [("good", {})])
    (tmp_path / "m.yaml").write_text("model: m\nsuite: s.yaml\ninstall: {kind: sim, repo: vllm}\nrepeats: 3\n"
                                     "axes: {commit: [good]}\n")
    outcome = run_matrix(tmp_path / "m.yaml", runs_dir=tmp_path / "runs", run_id="sim", executor=choose("local"),
                         cache_dir=tmp_path / "cache")
    samples = analysis.load_table(outcome.run, "samples").to_pylist()
    assert sorted(s["case_id"] for s in samples) == ["plain"] * 3 + ["streamed"] * 3
    assert all(s["passed"] and s["transport"] is None and s["content_tail"] for s in samples), samples
