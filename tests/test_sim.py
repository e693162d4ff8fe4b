"""The vLLM simulator, driven as the product drives it: real subprocesses on 127.0.0.1, HTTP, logs.

Every server runs in its own process group and is killed in a `finally`, even when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from vllmsim import args, config, tree
from vllmsim.behaviour import START_SEED_ENV, Behaviour
from vllmsim.instance import instance

SIM = [sys.executable, "-m", "vllmsim"]


@dataclass
class Sim:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def chat(
        self, body: dict[str, Any], *, headers: dict[str, str] | None = None, timeout: float = 10.0
    ) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_tree(directory: Path, sim_yaml: dict[str, Any] | None) -> dict[str, str]:
    if sim_yaml is None:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sim.yaml").write_text(yaml.safe_dump(sim_yaml))
    return {"SWEEP_SIM_TREE": str(directory)}


def run_sim(
    argv: list[str],
    tmp: Path,
    sim_yaml: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 20,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **write_tree(tmp / "tree", sim_yaml), **(env or {})}
    return subprocess.run(
        [*SIM, *argv],
        check=False,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@contextlib.contextmanager
def sim_server(
    tmp: Path,
    *flags: str,
    sim_yaml: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    wait: bool = True,
    model: str = "Qwen/Qwen3-8B",
) -> Iterator[Sim]:
    port = free_port()
    log_path = tmp / f"sim-{port}.log"
    full_env = {**os.environ, **write_tree(tmp / f"tree-{port}", sim_yaml), **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*SIM, "serve", model, "--host", "127.0.0.1", "--port", str(port), *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
    sim = Sim(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        if wait:
            wait_healthy(sim)
        yield sim
    finally:
        kill_group(proc)


def wait_healthy(sim: Sim, deadline_s: float = 15.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if sim.proc.poll() is not None:
            raise AssertionError(f"simulator exited with {sim.proc.returncode}:\n{sim.log()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{sim.url}/health", timeout=1).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"simulator not healthy after {deadline_s}s:\n{sim.log()}")


# The repository's own copies of real-world schemas (JSONSchemaBench), wherever it is checked out.
def wait_for_log(sim: Sim, text: str, count: int = 1, deadline_s: float = 30.0) -> str:
    """The log once `text` appears in it `count` times (a deadline, not a speed check)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        log = sim.log()
        if log.count(text) >= count or sim.proc.poll() is not None:
            break
        time.sleep(0.05)
    log = sim.log()
    assert log.count(text) >= count, log
    return log


SCHEMA_DIR = Path(__file__).resolve().parent.parent / "suites" / "schemas"
SCHEMAS = sorted(SCHEMA_DIR.glob("*.json"))
MTP = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 4}']
ARRAY_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
    },
    "required": ["title", "items"],
    "additionalProperties": False,
}
FAST = {"version": "0.28.1.dev12", "startup_s": 0.0, "token_latency_s": 0.0}


def json_request(schema: Any = ARRAY_SCHEMA, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Give me a list."}],
        "max_tokens": 200,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}},
        **extra,
    }


def bug_tree(*bugs: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {**FAST, **top, "bugs": list(bugs)}


# --- the instance generator, in-process -------------------------------------------------------


def test_the_repository_schemas_are_found() -> None:
    # The tests below iterate over SCHEMAS: an empty list would let them pass having checked nothing.
    assert len(SCHEMAS) >= 20, SCHEMA_DIR
    assert (SCHEMA_DIR / "Glaiveai2K--calculate_area_4c3f5d87.json") in SCHEMAS


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.stem)
def test_generated_instances_are_valid_for_every_real_schema(path: Path) -> None:
    import random

    schema = json.loads(path.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    for seed in range(25):
        value = instance(schema, random.Random(seed))
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (seed, value, errors)


def test_generator_handles_refs_one_of_patterns_and_bounds() -> None:
    import random

    schema = {
        "$defs": {"id": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}$"}},
        "type": "object",
        "required": ["id", "n", "pick", "tags"],
        "properties": {
            "id": {"$ref": "#/$defs/id"},
            "n": {"type": "integer", "minimum": 5, "maximum": 6},
            "pick": {"oneOf": [{"type": "integer"}, {"type": "number", "multipleOf": 0.5}]},
            "tags": {
                "type": "array",
                "items": {"enum": ["a", "b"]},
                "minItems": 2,
                "maxItems": 2,
                "uniqueItems": True,
            },
        },
        "additionalProperties": False,
    }
    for seed in range(50):
        jsonschema.validate(instance(schema, random.Random(seed)), schema)
    assert instance(schema, random.Random(3)) == instance(schema, random.Random(3))


# --- start-up, health, auth ---------------------------------------------------------------------


def test_health_is_refused_during_the_declared_startup_then_200(tmp_path: Path) -> None:
    with sim_server(tmp_path, sim_yaml={**FAST, "startup_s": 60.0}, wait=False) as sim:
        # The last configuration line comes just before the declared start-up begins; a minute
        # later nothing may listen yet, however slow the machine.
        wait_for_log(sim, "Model loading took")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{sim.url}/health", timeout=1)
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=10) == 0
        assert "Shutting down before start-up completed." in sim.log()
    with sim_server(tmp_path, sim_yaml={**FAST, "startup_s": 1.0}) as sim:
        assert httpx.get(f"{sim.url}/health", timeout=5).status_code == 200
        log = sim.log()
    assert "init engine (profile, create kv cache, warmup model) took 1.00 seconds" in log
    assert f"Starting vLLM API server 0 on {sim.url}" in log
    assert "INFO:     Application startup complete." in log


def test_api_key_is_required_on_v1_only(tmp_path: Path) -> None:
    with sim_server(tmp_path, "--api-key", "sekret", "--served-model-name", "qwen", sim_yaml=FAST) as sim:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        denied = sim.chat(body)
        allowed = sim.chat(body, headers={"Authorization": "Bearer sekret"})
        models = httpx.get(f"{sim.url}/v1/models", headers={"Authorization": "Bearer sekret"}).json()
        assert httpx.get(f"{sim.url}/health").status_code == 200
        assert httpx.get(f"{sim.url}/v1/models").status_code == 401
    assert denied.status_code == 401 and denied.json() == {"error": "Unauthorized"}
    assert allowed.status_code == 200 and allowed.json()["model"] == "qwen"
    assert [m["id"] for m in models["data"]] == ["qwen"]


def test_term_stops_the_server_gracefully(tmp_path: Path) -> None:
    with sim_server(tmp_path, sim_yaml=FAST) as sim:
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=5) == 0
        assert "INFO:     Application shutdown complete." in sim.log()


# A stop signal at the worst moment: the main thread has just taken the stop event's lock (a timed
# wait returning). A handler that sets the event itself would wait for that lock forever, and every
# later TERM would queue behind it: a server no guard could stop.
TERM_HOLDING_THE_LOCK = """
import os, signal, sys, threading, time
from vllmsim.serve import serve_main
wait, fired = threading.Event.wait, []
def wait_holding_the_lock(self, timeout=None):
    if timeout is not None and sys._getframe(1).f_code.co_name == "run" and not fired:
        fired.append(1)
        with self._cond:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # the handler runs here, in this thread, with the lock held
    return wait(self, timeout)
threading.Event.wait = wait_holding_the_lock
sys.exit(serve_main(sys.argv[1:]))
"""


def test_term_while_the_main_thread_holds_the_stop_lock_still_stops_the_server(tmp_path: Path) -> None:
    env = {**os.environ, **write_tree(tmp_path / "tree", {**FAST, "startup_s": 30.0})}
    log_path = tmp_path / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", TERM_HOLDING_THE_LOCK, "Qwen/Qwen3-8B", "--host", "127.0.0.1",
                                 "--port", str(free_port())], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        assert proc.wait(timeout=20) == 0, log_path.read_text()[-2000:]
    finally:
        kill_group(proc)
    assert "Shutting down before start-up completed." in log_path.read_text()


# --- chat: text, JSON, tools, reasoning, streaming, metrics -------------------------------------


def test_text_json_object_request_ids_and_errors(tmp_path: Path) -> None:
    with sim_server(tmp_path, sim_yaml=FAST) as sim:
        text = sim.chat(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            headers={"X-Request-Id": "abc"},
        )
        obj = sim.chat(
            {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
        )
        bad = sim.chat({"messages": "nope"})
        bad_schema = sim.chat(
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}
        )
        no_budget = sim.chat({"messages": [{"role": "user", "content": "x"}], "thinking_token_budget": 4})
        auto = sim.chat(
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            }
        )
        log = sim.log()
    assert text.json()["id"] == "chatcmpl-abc"
    assert text.json()["choices"][0]["finish_reason"] == "length"
    assert text.json()["usage"]["completion_tokens"] == 3
    assert "chatcmpl-abc" in log
    assert isinstance(json.loads(obj.json()["choices"][0]["message"]["content"]), dict)
    for response in (bad, bad_schema, no_budget, auto):
        assert response.status_code == 400
        assert set(response.json()["error"]) >= {"message", "type", "code"}
    assert "reasoning parser" in no_budget.json()["error"]["message"]
    assert "--enable-auto-tool-choice" in auto.json()["error"]["message"]


def test_structured_output_is_valid_for_every_real_schema(tmp_path: Path) -> None:
    checked = 0
    with sim_server(tmp_path, sim_yaml=FAST) as sim:
        for path in SCHEMAS:
            schema = json.loads(path.read_text())
            reply = sim.chat(json_request(schema, max_tokens=4000))
            response = reply.json()
            assert "choices" in response, (path.name, reply.status_code, response, sim.log()[-2000:])
            choice = response["choices"][0]
            assert choice["finish_reason"] == "stop", path.name
            value = json.loads(choice["message"]["content"])
            jsonschema.validators.validator_for(schema)(schema).validate(value)
            checked += 1
    assert checked == len(SCHEMAS) >= 20


def test_tool_calls_have_arguments_valid_for_the_tool(tmp_path: Path) -> None:
    calc = json.loads((SCHEMA_DIR / "Glaiveai2K--calculate_area_4c3f5d87.json").read_text())
    tools = [
        {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "calculate_area", "parameters": calc}},
    ]
    base = {"messages": [{"role": "user", "content": "area?"}], "tools": tools, "max_tokens": 2000}
    with sim_server(
        tmp_path, "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", sim_yaml=FAST
    ) as sim:
        named = sim.chat(
            {**base, "tool_choice": {"type": "function", "function": {"name": "calculate_area"}}}
        )
        auto = sim.chat(base)
        required = sim.chat({**base, "tool_choice": "required"})
        unknown = sim.chat({**base, "tool_choice": {"type": "function", "function": {"name": "zzz"}}})
    call = named.json()["choices"][0]
    assert call["finish_reason"] == "tool_calls" and call["message"]["content"] is None
    assert call["message"]["tool_calls"][0]["function"]["name"] == "calculate_area"
    jsonschema.validate(json.loads(call["message"]["tool_calls"][0]["function"]["arguments"]), calc)
    assert auto.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert required.json()["choices"][0]["message"]["tool_calls"]
    assert unknown.status_code == 400


def test_reasoning_and_thinking_budget(tmp_path: Path) -> None:
    ask = {
        "messages": [{"role": "user", "content": "1+1?"}],
        "max_tokens": 32,
        "temperature": 0,
        "return_token_ids": True,
    }
    with sim_server(tmp_path, "--reasoning-parser", "qwen3", sim_yaml=FAST) as sim:
        free = sim.chat({**ask, "max_tokens": 400}).json()
        budget = sim.chat(
            {**ask, "thinking_token_budget": 1, "chat_template_kwargs": {"enable_thinking": True}}
        ).json()
        budget8 = sim.chat({**ask, "max_tokens": 400, "thinking_token_budget": 8}).json()
        off = sim.chat({**ask, "chat_template_kwargs": {"enable_thinking": False}}).json()
    message = free["choices"][0]["message"]
    assert message["reasoning"] and message["content"]
    assert free["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert 248069 in free["choices"][0]["token_ids"]
    choice = budget["choices"][0]
    assert choice["token_ids"][0] == 248069
    assert choice["finish_reason"] == "stop" and choice["message"]["content"].startswith("\n\n")
    assert budget["usage"]["completion_tokens_details"]["reasoning_tokens"] <= 1
    assert budget["prompt_token_ids"] and budget["usage"]["prompt_tokens"] == len(budget["prompt_token_ids"])
    assert budget8["usage"]["completion_tokens_details"]["reasoning_tokens"] <= 7
    assert budget8["choices"][0]["token_ids"].index(248069) <= 7
    assert off["choices"][0]["message"]["reasoning"] is None
    assert 248069 not in off["choices"][0]["token_ids"]


def test_streaming_matches_the_non_streamed_answer(tmp_path: Path) -> None:
    ask = {"messages": [{"role": "user", "content": "tell me"}], "max_tokens": 50, "temperature": 0}
    with sim_server(tmp_path, sim_yaml=FAST) as sim:
        whole = sim.chat(ask).json()
        with httpx.stream(
            "POST",
            f"{sim.url}/v1/chat/completions",
            timeout=10,
            json={**ask, "stream": True, "stream_options": {"include_usage": True}},
        ) as r:
            lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finish = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert content == whole["choices"][0]["message"]["content"]
    assert finish == [whole["choices"][0]["finish_reason"]]
    assert chunks[-1]["usage"] == whole["usage"]


def _metric(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_metrics_count_tokens_and_spec_decode(tmp_path: Path) -> None:
    ask = {"messages": [{"role": "user", "content": "count"}], "max_tokens": 40}
    with sim_server(tmp_path, *MTP, sim_yaml=FAST) as sim:
        used = sum(sim.chat(ask).json()["usage"]["completion_tokens"] for _ in range(5))
        spec = httpx.get(f"{sim.url}/metrics").text
    with sim_server(tmp_path, sim_yaml=FAST) as sim:
        sim.chat(ask)
        plain = httpx.get(f"{sim.url}/metrics").text
    assert _metric(spec, "vllm:generation_tokens_total", model_name="Qwen/Qwen3-8B") == used
    assert _metric(spec, "vllm:request_success_total") == 5
    assert _metric(spec, "vllm:time_to_first_token_seconds_count") == 5
    drafts = _metric(spec, "vllm:spec_decode_num_drafts_total")
    accepted = _metric(spec, "vllm:spec_decode_num_accepted_tokens_total")
    assert _metric(spec, "vllm:spec_decode_num_draft_tokens_total") == 4 * drafts
    assert drafts + accepted >= used and 0 < accepted < 4 * drafts
    per_pos = [
        _metric(spec, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(4)
    ]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    assert "spec_decode" not in plain and _metric(plain, "vllm:request_success_total") == 1


# --- bugs ---------------------------------------------------------------------------------------

FSM = {"id": "fsm", "effect": "fsm_whitespace", "when": {"spec_method": ["mtp"], "strict_tool_calling": True}}


def test_fsm_whitespace_cuts_json_after_the_array_colon_and_logs_the_id(tmp_path: Path) -> None:
    with sim_server(tmp_path, *MTP, sim_yaml=bug_tree(FSM)) as sim:
        broken = sim.chat(json_request(max_tokens=64), headers={"X-Request-Id": "r1"}).json()
        # Room for any plain answer (at most 60 tokens): only the bug could make it end "length".
        plain = sim.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}).json()
        log = sim.log()
    choice = broken["choices"][0]
    content = choice["message"]["content"]
    head = content.rstrip()
    assert head.endswith('"items":') and content[len(head) :].strip() == "" and len(content) > len(head)
    assert choice["finish_reason"] == "length" and broken["usage"]["completion_tokens"] == 64
    assert re.search(
        r"ERROR \d\d-\d\d [\d:]+ \[backend_xgrammar.py:167\] Failed to advance FSM for request "
        r"chatcmpl-r1 for tokens (71093|2164|271)\. Please file an issue\.",
        log,
    )
    assert plain["choices"][0]["finish_reason"] == "stop"  # text requests are not affected
    assert plain["choices"][0]["message"]["content"].strip()
    assert log.count("Failed to advance FSM") == 1


def test_fsm_bug_does_not_bite_other_configurations(tmp_path: Path) -> None:
    ngram = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    for flags, env in ((ngram, {}), (MTP, {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"})):
        with sim_server(tmp_path, *flags, sim_yaml=bug_tree(FSM), env=env) as sim:
            content = sim.chat(json_request()).json()["choices"][0]["message"]["content"]
            jsonschema.validate(json.loads(content), ARRAY_SCHEMA)
            assert "Failed to advance FSM" not in sim.log()


def test_silent_whitespace_has_no_log_line(tmp_path: Path) -> None:
    silent = {
        "effect": "silent_whitespace",
        "when": {"spec_method": "mtp", "reasoning_parser": "qwen3", "async_scheduling": True},
    }
    with sim_server(tmp_path, *MTP, "--reasoning-parser", "qwen3", sim_yaml=bug_tree(silent)) as sim:
        body = sim.chat(json_request(max_tokens=80)).json()
        log = sim.log()
    content = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "length"
    head, _, tail = content.partition('"items":')
    assert re.fullmatch(r'\{"title": "[^"]*", ', head)
    assert len(tail) > 20 and set(tail) <= set(' \t"\n')
    assert "Failed to advance FSM" not in log and "ERROR" not in log


def test_thinking_budget_ignored(tmp_path: Path) -> None:
    bug = {"effect": "thinking_budget_ignored", "when": {"spec_method": ["mtp"], "model_runner": ["V2"]}}
    ask = {
        "messages": [{"role": "user", "content": "1+1?"}],
        "max_tokens": 32,
        "thinking_token_budget": 1,
        "return_token_ids": True,
    }
    with sim_server(
        tmp_path, *MTP, "--reasoning-parser", "qwen3", sim_yaml=bug_tree(bug, version="0.28.1")
    ) as sim:
        broken = sim.chat(ask).json()
    with sim_server(
        tmp_path,
        *MTP,
        "--reasoning-parser",
        "qwen3",
        sim_yaml=bug_tree(bug, version="0.28.1"),
        env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
    ) as sim:
        fine = sim.chat(ask).json()
        assert "Using V2 Model Runner" not in sim.log()
    usage = broken["usage"]
    assert broken["choices"][0]["finish_reason"] == "length"
    assert usage["completion_tokens"] == usage["completion_tokens_details"]["reasoning_tokens"] == 32
    assert broken["choices"][0]["message"]["content"] is None
    assert 248069 not in broken["choices"][0]["token_ids"]
    assert fine["choices"][0]["token_ids"][0] == 248069 and fine["choices"][0]["finish_reason"] == "stop"


def _hits(sim: Sim, repeats: int) -> list[bool]:
    """For each of `repeats` sends of one JSON request: did the FSM bug cut it?

    Every answer must be either whole and valid or the bug's cut, so a count of hits is a count of
    bites and nothing else.
    """
    hits = []
    for _ in range(repeats):
        choice = sim.chat(json_request()).json()["choices"][0]
        content = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(content), ARRAY_SCHEMA)
            hits.append(False)
        else:
            assert choice["finish_reason"] == "length" and content.rstrip().endswith('"items":'), choice
            hits.append(True)
    return hits


def _start(
    tmp_path: Path, bug: dict[str, Any], *, seed: str = "0", start_seed: str = "", repeats: int = 30
) -> tuple[list[float], list[bool]]:
    """One server start: the per-start rates it logged and which of the repeats the bug hit."""
    with sim_server(
        tmp_path, *MTP, "--seed", seed, sim_yaml=bug_tree(bug), env={START_SEED_ENV: start_seed}
    ) as sim:
        hits = _hits(sim, repeats)
        log = sim.log()
    assert log.count("Failed to advance FSM") == sum(hits)
    return [float(r) for r in DRAWN.findall(log)], hits


DRAWN = re.compile(
    r"\(EngineCore_DP0 pid=\d+\) INFO \d\d-\d\d [\d:]+ \[behaviour\.py:\d+\] Simulated bug fsm: "
    r"rate ([01]\.\d{6}) for this server start, drawn from Beta\(mean=0\.3, sd=0\.25\)"
)
SPREAD = {**FSM, "rate": 0.3, "rate_sd": 0.25}


@pytest.mark.full  # many server starts to see a rate's spread: 15-25 s
def test_rate_based_bug_is_flaky_across_repeats_and_reproducible_across_restarts(tmp_path: Path) -> None:
    rated = {**FSM, "rate": 0.33}
    # Different start seeds: without rate_sd a start's nonce must not change any outcome.
    drawn, first = _start(tmp_path, rated, start_seed="start-1")
    _, again = _start(tmp_path, rated, start_seed="start-9")
    _, other = _start(tmp_path, rated, seed="7")
    assert drawn == []  # no per-start line without rate_sd
    assert first == again
    assert 3 <= sum(first) <= 20  # about a third of 30, never all or none
    assert other != first


def _consistent(hits: int, n: int, rate: float) -> bool:
    """Within three binomial standard deviations (plus one for rounding) of n * rate."""
    return abs(hits - n * rate) <= 3 * math.sqrt(n * rate * (1 - rate)) + 1


@pytest.mark.full  # many server starts to see a rate's spread: 15-25 s
def test_rate_sd_draws_one_rate_per_server_start(tmp_path: Path) -> None:
    n = 60
    # Two start seeds whose draws land far apart around the mean 0.3 (about 0.07 and 0.55), so the
    # counts over the same 60 requests differ for sure, and neither is consistent with 0.3 itself.
    (low,), low_hits = _start(tmp_path, SPREAD, start_seed="start-1", repeats=n)
    (high,), high_hits = _start(tmp_path, SPREAD, start_seed="start-9", repeats=n)
    assert low < 0.15 and high > 0.45
    assert sum(low_hits) < sum(high_hits)
    for rate, hits in ((low, low_hits), (high, high_hits)):
        assert _consistent(sum(hits), n, rate), (rate, sum(hits))
        assert not _consistent(sum(hits), n, 0.3), (rate, sum(hits))
    # The same start seed replays that start exactly: rate and outcomes.
    again, again_hits = _start(tmp_path, SPREAD, start_seed="start-1", repeats=n)
    assert again == [low] and again_hits == low_hits


def test_rate_sd_starts_draw_independently_without_a_start_seed(tmp_path: Path) -> None:
    (first,), _ = _start(tmp_path, SPREAD, repeats=1)
    (second,), _ = _start(tmp_path, SPREAD, repeats=1)
    assert first != second and 0 < first < 1 and 0 < second < 1


def _behaviours(sim_yaml: dict[str, Any], nonces: list[str]) -> list[Behaviour]:
    t = tree.parse(sim_yaml)
    cfg = config.resolve(args.parse(["Qwen/Qwen3-8B", *MTP], t.release), {}, t).config
    assert cfg is not None
    return [Behaviour(t, cfg, nonce=nonce) for nonce in nonces]


def test_rate_sd_draws_follow_the_declared_mean_and_sd() -> None:
    rates = [b.rates[0] for b in _behaviours(bug_tree(SPREAD), [str(i) for i in range(3000)])]
    mean = sum(rates) / len(rates)
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / len(rates))
    assert abs(mean - 0.3) < 0.015 and abs(sd - 0.25) < 0.015, (mean, sd)
    (plain,) = _behaviours(bug_tree({**FSM, "rate": 0.3}), ["x"])
    assert plain.rates == (0.3,) and plain.start_lines() == []


@pytest.mark.parametrize(
    ("rate", "rate_sd"),
    [(0.3, 0.46), (0.3, 0.5), (1.0, 0.1), (0.0, 0.1), (0.3, -0.1), (0.3, "wide")],
)
def test_rate_sd_without_a_beta_is_refused_with_the_key_named(rate: float, rate_sd: Any) -> None:
    with pytest.raises(tree.TreeError, match=r"bugs\[0\]\.rate_sd: "):
        tree.parse(bug_tree({**FSM, "rate": rate, "rate_sd": rate_sd}))
    assert tree.parse(bug_tree({**FSM, "rate": 0.3, "rate_sd": 0.45})).bugs[0].rate_sd == 0.45
    assert tree.parse(bug_tree({**FSM, "rate": 0.3, "rate_sd": 0})).bugs[0].rate_sd == 0.0


def test_crash_after_n_requests(tmp_path: Path) -> None:
    with sim_server(tmp_path, sim_yaml=bug_tree({"effect": "crash", "after_requests": 2})) as sim:
        ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        codes = [sim.chat(ask).status_code for _ in range(3)]
        assert sim.proc.wait(timeout=5) != 0
        log = sim.log()
    assert codes == [200, 200, 500]
    assert "Traceback (most recent call last)" in log and "EngineCore encountered a fatal error" in log


def test_hang_never_answers_and_term_still_stops(tmp_path: Path) -> None:
    hang = {"effect": "hang", "when": {"json_schema": True}}
    with sim_server(tmp_path, sim_yaml=bug_tree(hang)) as sim:
        assert sim.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            sim.chat(json_request(), timeout=0.5)
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=5) == 0


def test_refuse_start_and_install_fail(tmp_path: Path) -> None:
    refuse = run_sim(
        ["serve", "m", "--port", str(free_port())],
        tmp_path,
        bug_tree({"effect": "refuse_start", "message": "no kernel image is available"}),
    )
    broken = run_sim(["serve", "m"], tmp_path / "b", {**FAST, "install": "fail: nvcc failed"})
    assert refuse.returncode == 1 and "RuntimeError: no kernel image is available" in refuse.stdout
    assert broken.returncode == 1 and "nvcc failed" in broken.stderr


# --- fallbacks and refusals of vLLM itself ------------------------------------------------------


def test_ngram_disables_default_async_and_falls_back_to_v1(tmp_path: Path) -> None:
    ngram = [
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}',
    ]
    with sim_server(tmp_path, *ngram, sim_yaml=FAST) as sim:
        log = sim.log()
    assert "Async scheduling not supported with ngram-based speculative decoding and will be disabled." in log
    assert "Asynchronous scheduling is disabled." in log
    assert "falling back to Model Runner V1" in log and "Using V2 Model Runner" not in log
    with sim_server(tmp_path, *MTP, sim_yaml=FAST) as sim:
        log = sim.log()
    assert "Asynchronous scheduling is enabled." in log and "Using V2 Model Runner" in log
    assert "Using AttentionBackendEnum.FLASH_ATTN backend." in log


def test_startup_refusals_exit_1_with_vllm_messages(tmp_path: Path) -> None:
    explicit = run_sim(
        [
            "serve",
            "m",
            "--async-scheduling",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}',
        ],
        tmp_path,
        FAST,
    )
    backend = run_sim(["serve", "m", "--attention-backend", "NOPE_ATTN"], tmp_path, FAST)
    unknown = run_sim(["serve", "m", "--no-such-flag", "3"], tmp_path, FAST)
    assert explicit.returncode == 1
    assert (
        "ValueError: Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/"
        "DSpark/DFlash kind of speculative decoding"
    ) in explicit.stdout
    assert backend.returncode == 1 and "ValueError: Unknown attention backend: 'NOPE_ATTN'" in backend.stdout
    assert unknown.returncode == 2 and "unrecognized arguments: --no-such-flag" in unknown.stderr


def test_help_and_version_follow_the_simulated_version(tmp_path: Path) -> None:
    new = run_sim(["serve", "--help"], tmp_path / "a", {**FAST, "version": "0.31.0"})
    old = run_sim(["serve", "--help"], tmp_path / "b", {**FAST, "version": "0.30.2"})
    version = run_sim(["--version"], tmp_path / "c", {**FAST, "version": "0.29.0"})
    latest = subprocess.run(
        [*SIM, "--version"],
        check=False,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "SWEEP_SIM_TREE"},
    )
    assert new.returncode == old.returncode == 0
    assert "--tool-strict-level" in new.stdout and "--tool-strict-level" not in old.stdout
    assert "--speculative-config" in old.stdout and "--async-scheduling" in old.stdout
    assert version.stdout.strip() == "0.29.0"
    assert latest.stdout.strip() == "0.33.1"


# --- make-repo ----------------------------------------------------------------------------------


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True).stdout


def test_make_repo_bisect_plants_culprit_broken_installs_and_fix(tmp_path: Path) -> None:
    repo = tmp_path / "vllm"
    out = run_sim(
        ["make-repo", str(repo), "--scenario", "bisect", "--commits", "250", "--seed", "3", "--json"],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan == json.loads((repo / ".git" / "sim-plan.json").read_text())
    shas = _git(repo, "rev-list", "--first-parent", "--reverse", "main").split()
    assert len(shas) == plan["commits"] == 250 and plan["first_parent"] == shas
    for tag, sha in plan["tags"].items():
        assert _git(repo, "rev-parse", f"{tag}^{{commit}}").strip() == sha
    assert list(plan["tags"]) == ["v0.27.0", "v0.28.0", "v0.29.0"]
    subjects = _git(repo, "log", "--format=%s", "main").splitlines()
    prs = [re.search(r"\(#(\d+)\)$", s).group(1) for s in subjects]  # type: ignore[union-attr]
    assert len(set(prs)) == 250
    dates = [int(d) for d in _git(repo, "log", "--format=%at", "--reverse", "main").split()]
    assert dates == sorted(dates) and len(set(dates)) == 250

    def sim_at(index: int) -> dict[str, Any]:
        return yaml.safe_load(_git(repo, "show", f"{shas[index]}:sim.yaml"))

    culprit, fix = plan["culprit"]["index"], plan["fix"]["index"]
    assert plan["culprit"]["sha"] == shas[culprit] and culprit < plan["tag_indices"]["v0.29.0"] < fix
    assert sim_at(culprit - 1)["bugs"] == [] and sim_at(fix)["bugs"] == []
    assert sim_at(culprit)["bugs"][0]["rate"] == 0.3 == plan["bugs"][0]["rate"]
    assert sim_at(culprit)["bugs"][0]["when"] == plan["bugs"][0]["when"]
    broken = plan["install_broken"]["indices"]
    assert len(broken) >= 3 and culprit not in broken and broken == list(range(broken[0], broken[-1] + 1))
    assert all(sim_at(i)["install"].startswith("fail") for i in broken)
    assert sim_at(broken[0] - 1)["install"] == sim_at(broken[-1] + 1)["install"] == "ok"
    assert (repo / "sim.yaml").exists() and _git(repo, "status", "--porcelain") == ""


def test_make_repo_demo_then_serve_its_commits(tmp_path: Path) -> None:
    repo = tmp_path / "demo"
    out = run_sim(["make-repo", str(repo), "--json"], tmp_path)
    plan = json.loads(out.stdout)
    assert list(plan["tags"]) == ["v0.27.0", "v0.28.0"] and plan["install_broken"] is None
    assert plan["fix"]["subject"].endswith("(#44297)")
    assert (
        plan["tag_indices"]["v0.27.0"]
        < plan["culprit"]["index"]
        < plan["fix"]["index"]
        < plan["tag_indices"]["v0.28.0"]
    )
    assert {b["effect"] for b in plan["bugs"]} == {
        "fsm_whitespace",
        "silent_whitespace",
        "thinking_budget_ignored",
    }
    assert all(b["rate_sd"] == 0.0 for b in plan["bugs"])
    assert all("rate_sd" not in b for b in yaml.safe_load((repo / "sim.yaml").read_text())["bugs"])
    worktree = tmp_path / "at-culprit"
    _git(repo, "worktree", "add", "-q", "--detach", str(worktree), plan["culprit"]["sha"])
    version = run_sim(["--version"], tmp_path, env={"SWEEP_SIM_TREE": str(worktree)})
    assert version.stdout.strip() == f"0.27.1.dev{plan['culprit']['index']}+g{plan['culprit']['sha'][:9]}"
    env = {"SWEEP_SIM_TREE": str(worktree)}
    with sim_server(tmp_path, *MTP, env=env) as sim:
        finishes = [
            sim.chat(json_request(max_tokens=30)).json()["choices"][0]["finish_reason"] for _ in range(12)
        ]
    assert "length" in finishes and "stop" in finishes


def test_make_repo_rate_sd_plants_per_start_variation(tmp_path: Path) -> None:
    repo = tmp_path / "demo"
    out = run_sim(["make-repo", str(repo), "--rate-sd", "0.2", "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    by_id = {b["id"]: b for b in plan["bugs"]}
    assert by_id["fsm-whitespace"]["rate"] == 0.33 and by_id["fsm-whitespace"]["rate_sd"] == 0.2
    assert by_id["silent-whitespace"]["rate_sd"] == 0.2
    assert by_id["thinking-budget-ignored"]["rate_sd"] == 0.0  # rate 1: nothing to vary
    at_culprit = yaml.safe_load(_git(repo, "show", f"{plan['culprit']['sha']}:sim.yaml"))
    fsm = by_id["fsm-whitespace"]
    assert at_culprit["bugs"] == [
        {"id": "fsm-whitespace", "effect": "fsm_whitespace", "when": fsm["when"], "rate": 0.33, "rate_sd": 0.2}
    ]
    head = yaml.safe_load((repo / "sim.yaml").read_text())
    assert [b.get("rate_sd") for b in head["bugs"]] == [0.2, None]
    worktree = tmp_path / "at-culprit"
    _git(repo, "worktree", "add", "-q", "--detach", str(worktree), plan["culprit"]["sha"])
    with sim_server(tmp_path, *MTP, env={"SWEEP_SIM_TREE": str(worktree)}) as sim:
        log = sim.log()
    assert re.search(
        r"\[behaviour\.py:\d+\] Simulated bug fsm-whitespace: rate [01]\.\d{6} for this server start, "
        r"drawn from Beta\(mean=0\.33, sd=0\.2\)",
        log,
    )
    too_wide = run_sim(["make-repo", str(tmp_path / "wide"), "--rate-sd", "0.45"], tmp_path)
    assert too_wide.returncode == 1 and "--rate-sd 0.45 for bug silent-whitespace" in too_wide.stderr


def test_make_repo_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    out = run_sim(["make-repo", str(tmp_path / "x")], tmp_path)
    assert out.returncode == 1 and "not empty" in out.stderr


def test_concurrent_requests_are_served_in_parallel(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    # Requests the hang bug never answers hold their connections open. A server answering one
    # request at a time would leave the plain request sent after them waiting forever.
    hang = {"effect": "hang", "when": {"json_schema": True}}
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "temperature": 0}
    held = 16
    with sim_server(tmp_path, sim_yaml=bug_tree(hang)) as sim, ThreadPoolExecutor(held) as pool:
        hung = [pool.submit(sim.chat, json_request(), timeout=60) for _ in range(held)]
        assert wait_for_log(sim, "Added request", held).count("Added request") == held
        answered = sim.chat(ask, timeout=30)
        assert not any(f.done() for f in hung)
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(timeout=10) == 0
        for f in hung:
            with contextlib.suppress(httpx.HTTPError):
                f.result()
    assert answered.status_code == 200
    assert answered.json()["choices"][0]["finish_reason"] == "stop"
