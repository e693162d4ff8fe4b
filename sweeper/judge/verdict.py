"""A server group's verdict (status, detail, failure signature) from the facts its run gathered.

Pure: the runner does the I/O (starts the server, replays, waits out the crash grace, reads the
log) and hands over what it saw; these rules decide `ok`, `crashed`, `timeout` or `server_failed`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sweeper.spec.status import Status
from sweeper.vllm import crash
from sweeper.vllm.logs import failure_reason

NO_TRACEBACK = "engine died (no traceback in the log)"


@dataclass(frozen=True)
class Verdict:
    """What every cell of the group is recorded with."""

    status: Status
    detail: str
    signature: str | None = None  # the failure mode a crash or a refusal names (see `crash`)


@dataclass(frozen=True)
class Answer:
    """What the verdict reads of one reply."""

    http_status: int | None  # None: no HTTP answer (a timeout, a dropped connection)
    error: str | None
    timed_out: bool = False


@dataclass(frozen=True)
class StartFailed:
    """A server that never became healthy (`ServerError` from the server layer)."""

    status: Status  # the status the server layer's error implies
    message: str  # the error's message ("server exited with code 1 before it was healthy")
    log_text: str  # the server's log (its tail where the file could not be read)
    # Words by which a refusal names the cell's settings (`crash.setting_words`).
    setting_words: frozenset[str]
    # The group's `timeouts.group_s` when it had run out as start-up failed, else None.
    out_of_time_s: float | None


@dataclass(frozen=True)
class Served:
    """A server that became healthy and was replayed to."""

    answers: tuple[Answer, ...]
    unsent: int  # requests never sent, or cut off
    hung: bool  # the replay stopped: every slot waited a full request timeout
    # The replay stopped: the group's `timeouts.group_s` (these seconds) ran out. Else None.
    cut_off_s: float | None
    # The process still ran after the replay (and after the crash grace, where the runner waited it out).
    alive: bool
    returncode: int | None  # its exit code once it has exited
    log_text: str


def engine_dead(log_text: str, answers: Iterable[Answer]) -> bool:
    """The engine is dead, whether or not the API server still runs: the log or the answers say so."""
    return crash.engine_died(log_text) or any(crash.dead_engine_reply(a.http_status, a.error) for a in answers)


def judge(facts: StartFailed | Served) -> Verdict:
    """The verdict every cell of the group gets."""
    if isinstance(facts, StartFailed):
        return _start_failed(facts)
    return _served(facts)


def _start_failed(facts: StartFailed) -> Verdict:
    reason = failure_reason(facts.log_text)
    detail = f"{facts.message}: {reason}" if reason and reason not in facts.message else facts.message
    if facts.out_of_time_s is not None:
        return Verdict(Status.TIMEOUT, f"timeouts.group_s ({facts.out_of_time_s:g}s) ran out during start-up: "
                                       f"{detail}")
    # A refusal that names the cell's settings is the configuration failing (a failure mode);
    # anything else (a port in use, a full disk) says nothing about it.
    signature = None
    if reason and facts.status == Status.SERVER_FAILED and crash.refusal_names_settings(reason, facts.setting_words):
        signature = f"refused: {reason[:300]}"
    return Verdict(facts.status, detail, signature)


def _served(facts: Served) -> Verdict:
    if not facts.alive or engine_dead(facts.log_text, facts.answers):
        cause = crash.root_cause(facts.log_text)
        exited = "the server still ran (stopped by the sweeper)" if facts.alive \
            else f"server exited with code {facts.returncode}"
        detail = (f"engine died: {cause.describe()}; " if cause else "") + \
            f"{exited} during replay; {facts.unsent} requests not sent"
        return Verdict(Status.CRASHED, detail, cause.signature if cause else NO_TRACEBACK)
    if facts.hung:
        return Verdict(Status.TIMEOUT, f"requests stopped answering; {facts.unsent} requests not sent")
    if facts.cut_off_s is not None:
        return Verdict(Status.TIMEOUT, f"timeouts.group_s ({facts.cut_off_s:g}s) ran out; {facts.unsent} "
                                       "requests not sent or cut off")
    timed_out = sum(a.timed_out for a in facts.answers)
    return Verdict(Status.OK, f"{timed_out} requests timed out" if timed_out else "")
