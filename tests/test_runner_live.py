"""The runner judges replies while the replay runs, from the server log as far as it is written;
the complete log has the last word. Real matrix, suite, checks and log file; no server needed.
A whole group in-process (a real simulator server) for what the runner counts and bounds."""

from __future__ import annotations

import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import make_sim_repo

from sweeper.drivers.sweep import jobs_for, make_plan
from sweeper.execute.replay import Reply, Request
from sweeper.execute.runner import GroupJob, _CellBase, _LiveJudge, build_requests, run_group
from sweeper.execute.server import ServerProcess, free_port, new_api_key
from sweeper.install.sim import COMMAND
from sweeper.spec.status import Status
from sweeper.store import frames as analysis
from sweeper.store.run_folder import open_run

FSM = "ERROR 11-29 08:16:41 [backend_xgrammar.py:167] Failed to advance FSM for request chatcmpl-{rid}-94bfdfc6 for tokens 7."


CONTENT = {"invoice": '{"customer": "Dana", "items": []}', "event": '{"title": "Offsite", "attendees": []}'}


def reply_for(req: Request) -> Reply:
    body = {"id": f"chatcmpl-{req.request_id}", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": CONTENT[req.case_id]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 12}}
    return Reply(req, 200, body, None, 0.01, None, datetime.now(UTC))


def _group_job(tmp_path: Path, suite: Path, sim: dict[str, object] | None = None, extra: str = "",
               axes: str = "{commit: [good], spec_method: [none], request.temperature: [0, 0.5]}") -> GroupJob:
    """The one server group of a matrix over a one-commit simulated history."""
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("good", sim or {})])
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"name: t\nmodel: m\nsuite: {suite}\ninstall: {{kind: sim, repo: {repo}}}\n{extra}axes: {axes}\n")
    runs = tmp_path / "runs"
    run = open_run(runs, "r", create=True)
    (job,) = jobs_for(make_plan(matrix, runs), run, tmp_path / "cache")
    return job


def test_a_log_line_written_after_the_reply_changes_the_verdict(tmp_path: Path, tiny_suite: Path) -> None:
    job = _group_job(tmp_path, tiny_suite, axes="{commit: [good], spec_method: [mtp], num_speculative_tokens: [2]}")
    cells = list(job.group.cells)
    requests = build_requests(job, cells)
    first, second = requests[0][2], requests[1][2]
    log = tmp_path / "server.log"
    log.write_text("".join(f"INFO 11-29 08:16:40 [async_llm.py:351] Added request chatcmpl-{req.request_id}.\n"
                           for _, _, req in requests))
    replies = [reply_for(req) for _, _, req in requests]
    with _LiveJudge(_CellBase(job, cells), requests, log) as live:
        for reply in replies:
            live.on_reply(reply)
        judged_live = {rid: sample for rid, (sample, _) in live.judged.items()}
        assert all(s["passed"] for s in judged_live.values())
        # The engine reports the first request's FSM failure only after its answer went out; a
        # partial last line is no line yet.
        with log.open("a") as f:
            f.write(FSM.format(rid=first.request_id) + "\n" + "INFO 11-29 08:16:42 [x.py:1] partial")
        samples = live.finish(replies, log.read_text())
    assert not samples[first.request_id]["passed"]
    assert samples[first.request_id]["failed_checks"] == ["log_absent"]
    assert "Failed to advance FSM" in samples[first.request_id]["log_errors"][0]
    # A request whose lines did not change keeps the verdict reached during the replay.
    assert samples[second.request_id] is judged_live[second.request_id]
    assert len(samples) == len(requests)


def _holding(folder: Path) -> list[int]:
    """Processes with a file under `folder` open (a server writes its log there)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if any(f.path.startswith(str(folder)) for f in proc.open_files()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_server_starts_are_counted_per_group(tmp_path: Path, tiny_suite: Path) -> None:
    job = _group_job(tmp_path, tiny_suite)
    result = run_group(job)
    cells = result.cells.to_pylist()
    # Two cells (request.temperature) on one server: the group made one start, each row says so.
    assert [c["status"] for c in cells] == [Status.OK, Status.OK]
    assert [c["server_starts"] for c in cells] == [1, 1]
    assert len({c["group_id"] for c in cells}) == 1
    # Counted once per group, never summed over its cells.
    assert analysis.server_starts(result.cells.to_pandas()) == 1


def test_a_group_past_group_s_ends_as_timeout_with_its_server_stopped(tmp_path: Path, tiny_suite: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Every answer takes over a minute (64 tokens at 1 s); the group may take 8 s in all. Where the
    # time runs out (usually in the replay; on a loaded machine maybe in start-up) the group ends there.
    job = _group_job(tmp_path, tiny_suite, {"token_latency_s": 1.0}, "timeouts: {group_s: 8}\n")
    node_tmp = tmp_path / "node-tmp"  # where the group writes its server's log on this node
    node_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(node_tmp))
    t0 = time.monotonic()
    result = run_group(job)
    took = time.monotonic() - t0
    cells = result.cells.to_pylist()
    assert {c["status"] for c in cells} == {Status.TIMEOUT}
    assert all(c["status_detail"].startswith("timeouts.group_s (8s) ran out") for c in cells)
    assert result.samples.num_rows == 0  # requests cut off by the deadline are not samples
    assert took < 60  # not the minute a single answer would take
    assert _holding(node_tmp) == [] and list(node_tmp.iterdir()) == []  # server gone, its folder too


def test_a_port_another_server_took_is_left_for_a_fresh_one(tmp_path: Path) -> None:
    """The port is chosen free and bound a moment later: another server can take it in between. Its
    /health answers, its API refuses this server's key: the start moves to a fresh port instead of
    replaying against a stranger (which answered 401 to every request of a cell)."""
    def serve(port: int, key: str, name: str) -> ServerProcess:
        argv = [*COMMAND, "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", str(port), "--api-key", key]
        return ServerProcess(argv, dict(os.environ), port=port, log_path=tmp_path / f"{name}.log",
                             startup_timeout_s=30, grace_s=2, api_key=key)

    port = free_port()
    with serve(port, new_api_key(), "stranger"):
        mine = serve(port, new_api_key(), "mine")
        with mine:
            assert mine.port != port and mine.starts == 1  # the moved start is not a second start
            models = httpx.get(f"{mine.base_url}/v1/models", headers={"Authorization": f"Bearer {mine.api_key}"})
            assert models.status_code == 200
        assert f"port {port} answers for another server" in mine.log_text()
