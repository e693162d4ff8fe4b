"""A group's verdict from the facts its run gathered, on recorded server logs: real vLLM CPU builds
(`tests/data/vllm/`: 0.30.0 whose ngram speculative decoding kills the engine at the first request,
0.32.0 servers that ran or refused to start) and the simulator (`tests/data/sim/`, 0.32.0: a run
that went well, an engine that died at its third request, a hang, two refusals to start)."""

from __future__ import annotations

from pathlib import Path

from sweeper.judge.verdict import NO_TRACEBACK, Answer, Served, StartFailed, Verdict, engine_dead, judge
from sweeper.spec.status import Status
from sweeper.vllm import crash

DATA = Path(__file__).parent / "data"
DEAD = "HTTP 500: EngineCore encountered an issue. See stack trace (above) for the root cause."
OK = Answer(200, None)
ASYNC_REFUSAL = ("ValueError: Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/"
                 "DSpark/DFlash kind of speculative decoding")
EXITED = "server exited with code 1 before it was healthy"


def log(name: str) -> str:
    return (DATA / name).read_text()


def served(log_text: str, answers: tuple[Answer, ...], *, alive: bool = True, returncode: int | None = None,
           unsent: int = 0, hung: bool = False, cut_off_s: float | None = None) -> Verdict:
    return judge(Served(answers, unsent, hung=hung, cut_off_s=cut_off_s, alive=alive, returncode=returncode,
                        log_text=log_text))


def start_failed(log_text: str, message: str = EXITED, *, words: frozenset[str] = frozenset(),
                 out_of_time_s: float | None = None) -> Verdict:
    return judge(StartFailed(Status.SERVER_FAILED, message, log_text, words, out_of_time_s=out_of_time_s))


def words(values: dict[str, object]) -> frozenset[str]:
    return frozenset(crash.setting_words(values, {}, {}))


def test_servers_that_ran_are_ok_and_count_their_timed_out_requests() -> None:
    for name in ("vllm/cpu-0.32.0-ngram.log", "vllm/cpu-0.32.0-async.log", "sim/sim-ok.log"):
        assert served(log(name), (OK, OK, OK)) == Verdict(Status.OK, "")
        slow = Answer(None, "timeout after 10s", timed_out=True)
        assert served(log(name), (OK, slow, slow)) == Verdict(Status.OK, "2 requests timed out")
    # A 500 that does not say the engine died is a failed sample, not a crash.
    assert served(log("vllm/cpu-0.32.0-ngram.log"), (OK, Answer(500, "HTTP 500: Internal Server Error"))).status \
        == Status.OK


def test_a_real_engine_death_is_a_crash_named_by_its_root_cause() -> None:
    text = log("vllm/cpu-0.30.0-ngram-crash.log")
    where = "vllm/model_executor/warmup/jit_warmup_triton_helper.py"
    verdict = served(text, (Answer(500, DEAD), Answer(500, DEAD)), alive=False, returncode=1, unsent=6)
    assert verdict == Verdict(
        Status.CRASHED,
        f"engine died: TypeError: Cannot inspect kernel parameters for function; raised at {where}:238 in "
        "_kernel_arg_names; server exited with code 1 during replay; 6 requests not sent",
        f"TypeError in {where}:_kernel_arg_names")
    # Still running after the crash grace: the log says the engine is dead; the sweeper stops it.
    alive = served(text, (Answer(500, DEAD),), unsent=7)
    assert alive.status == Status.CRASHED and alive.signature == verdict.signature
    assert alive.detail.endswith("; the server still ran (stopped by the sweeper) during replay; 7 requests not sent")
    # A crash outranks a replay that also stopped for a hang or the deadline.
    assert served(text, (Answer(500, DEAD),), hung=True, cut_off_s=8).status == Status.CRASHED


def test_the_simulators_engine_death_reads_as_vllms() -> None:
    refused = Answer(None, "ConnectError: [Errno 111] Connection refused")
    answers = (OK, OK, Answer(500, DEAD), refused)  # as recorded: two answers, the 500, then nobody home
    verdict = served(log("sim/sim-crash.log"), answers, alive=False, returncode=1, unsent=2)
    assert verdict.status == Status.CRASHED
    assert verdict.signature == "IndexError in vllm/v1/sample/rejection_sampler.py:rejection_sample"
    assert verdict.detail.startswith("engine died: IndexError: index 3 is out of bounds for dimension 0 with size 3")
    assert verdict.detail.endswith("server exited with code 1 during replay; 2 requests not sent")


def test_a_death_without_a_traceback_is_still_a_crash() -> None:
    text = log("sim/sim-ok.log")
    # Only the answers say the engine died (the log has no line of it).
    assert not crash.engine_died(text) and engine_dead(text, (OK, Answer(500, DEAD)))
    assert served(text, (OK, Answer(500, DEAD)), unsent=1) == Verdict(
        Status.CRASHED, "the server still ran (stopped by the sweeper) during replay; 1 requests not sent", NO_TRACEBACK)
    # The process is gone though every answer was fine (killed from outside, say).
    assert served(text, (OK, OK), alive=False, returncode=-9) == Verdict(
        Status.CRASHED, "server exited with code -9 during replay; 0 requests not sent", NO_TRACEBACK)


def test_a_replay_that_hangs_or_runs_out_of_time_is_a_timeout() -> None:
    hang = Answer(None, "timeout after 2s", timed_out=True)
    assert served(log("sim/sim-hang.log"), (hang, hang), unsent=4, hung=True) == Verdict(
        Status.TIMEOUT, "requests stopped answering; 4 requests not sent")
    assert served(log("vllm/cpu-0.32.0-ngram.log"), (OK,), unsent=3, cut_off_s=8) == Verdict(
        Status.TIMEOUT, "timeouts.group_s (8s) ran out; 3 requests not sent or cut off")
    # Both cannot be the replay's one reason; if they were, the hang was seen first.
    assert served(log("sim/sim-hang.log"), (hang,), hung=True, cut_off_s=8).detail.startswith("requests stopped")


def test_a_refusal_naming_the_settings_is_a_failure_mode_of_its_own() -> None:
    settings = words({"spec_method": "ngram", "async_scheduling": True, "commit": "0.32.0"})
    for name in ("vllm/cpu-0.32.0-refused.log", "sim/sim-refused.log"):
        assert start_failed(log(name), words=settings) == Verdict(
            Status.SERVER_FAILED, f"{EXITED}: {ASYNC_REFUSAL}", f"refused: {ASYNC_REFUSAL}")
        # The same refusal, for a cell whose settings it does not name: the commit is untestable.
        assert start_failed(log(name), words=words({"commit": "0.32.0"})) == Verdict(
            Status.SERVER_FAILED, f"{EXITED}: {ASYNC_REFUSAL}")
    # A start the server layer calls something else than a refusal keeps its status, and is no mode.
    other = judge(StartFailed(Status.TIMEOUT, EXITED, log("sim/sim-refused.log"), settings, out_of_time_s=None))
    assert other == Verdict(Status.TIMEOUT, f"{EXITED}: {ASYNC_REFUSAL}")


def test_a_refusal_that_names_the_machine_says_nothing_of_the_settings() -> None:
    reason = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    cuda = words({"spec_method": "none", "env.CUDA_LAUNCH_BLOCKING": "1", "commit": "0.32.0"})
    verdict = start_failed(log("sim/sim-no-kernel.log"), words=cuda)
    assert verdict == Verdict(Status.SERVER_FAILED, f"{EXITED}: {reason}")
    # A port in use names no setting even when its text holds one of the cell's words.
    busy = start_failed("OSError: [Errno 98] Address already in use (async scheduling)\n",
                        words=words({"async_scheduling": True}))
    assert busy.status == Status.SERVER_FAILED and busy.signature is None


def test_a_start_without_a_reason_keeps_the_servers_message() -> None:
    # Not healthy in time: the log's start says nothing went wrong.
    start = "\n".join(log("sim/sim-ok.log").splitlines()[:8])
    assert start_failed(start, "server not healthy after 30s") == Verdict(Status.SERVER_FAILED,
                                                                       "server not healthy after 30s")
    # A reason already in the message is not repeated.
    assert start_failed("ValueError: bad flag\n", "cannot start x: ValueError: bad flag").detail == \
        "cannot start x: ValueError: bad flag"


def test_a_start_cut_short_by_the_groups_time_is_a_timeout() -> None:
    settings = words({"spec_method": "ngram", "async_scheduling": True})
    assert start_failed(log("vllm/cpu-0.32.0-refused.log"), words=settings, out_of_time_s=30) == Verdict(
        Status.TIMEOUT, f"timeouts.group_s (30s) ran out during start-up: {EXITED}: {ASYNC_REFUSAL}")
    assert start_failed("", "server not healthy after 12s", out_of_time_s=12.5) == Verdict(
        Status.TIMEOUT, "timeouts.group_s (12.5s) ran out during start-up: server not healthy after 12s")
