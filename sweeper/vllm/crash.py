"""Engine death and its root cause, read from a vLLM server log and its answers.

When vLLM's engine dies while serving, the log holds, in this order (vLLM 0.30, CPU, verbatim in
`tests/data/vllm/cpu-0.30.0-ngram-crash.log`): the worker's traceback with the exception that
started it, each line under the process prefix and logger header
(`(Worker pid=N) ERROR 11-29 16:25:58 [multiproc_executor.py:1055] Traceback ...`); the engine
core's `EngineCore encountered a fatal error.` with a `RuntimeError: Worker failed ...` that only
repeats it; the API server's `EngineDeadError`; a 500 per request in flight
("EngineCore encountered an issue. See stack trace (above) for the root cause."); then the API
server shuts down. Older versions print tracebacks without the header; both are read.

The root cause is the first traceback that is not a consequence (not `EngineDeadError`, not the
engine core's re-raise of a worker failure): its last line is the exception, its last frame is
where it was raised, and its innermost frame inside the `vllm` package names the code at fault.
A crash's signature, exception type plus that vLLM frame, tells two crashes apart across commits
while staying the same when only line numbers move.

A server that refuses to start is judged by its reason: a refusal that names one of the cell's
settings (a flag, its value, an env var) is that configuration failing, a failure mode like any
other; anything else (a port in use, a full disk, a missing library) says nothing about the
settings and makes the commit untestable for the cell.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sweeper.vllm.logs import LINE

_PROC = re.compile(r"^\((?P<proc>[\w.-]+) pid=\d+\) ")
_DEATH = re.compile(r"EngineDeadError|EngineCore encountered a fatal error|Engine core proc \S+ died unexpectedly"
                    r"|EngineCore encountered an issue")
_DEAD_REPLY = re.compile(r"EngineCore encountered an issue|EngineDeadError|[Ee]ngine (?:core )?(?:is )?dead")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Fault))(?::\s?(?P<msg>.*))?$")
# Re-raises that only point back at the real exception.
_CONSEQUENCE = re.compile(r"EngineDeadError|Worker failed with error|See stack trace \(above\)|"
                          r"EngineCore encountered an issue")
_PACKAGE_PATH = re.compile(r"(?:site-packages|dist-packages)/(?P<rel>.+)$")
# Start failures that say nothing about the cell's settings: the machine, not the configuration.
_INFRASTRUCTURE = re.compile(r"Address already in use|No space left on device|Errno 28|Too many open files|"
                             r"Permission denied|Read-only file system|Cannot allocate memory|"
                             r"cannot open shared object file|No module named|ImportError|"
                             r"ModuleNotFoundError|Connection refused|Killed", re.IGNORECASE)


@dataclass(frozen=True)
class Frame:
    file: str  # the path inside its package (`vllm/v1/sample/rejection_sampler.py`), else as printed
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


@dataclass(frozen=True)
class Cause:
    """The exception that killed the engine."""

    exc_type: str  # as printed: `TypeError`, `torch.OutOfMemoryError`
    message: str
    raised_at: Frame | None  # the traceback's last frame
    vllm_frame: Frame | None  # its innermost frame inside the vllm package
    process: str | None  # `Worker`, `EngineCore_DP0`, ... where the traceback was printed

    @property
    def line(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type

    @property
    def signature(self) -> str:
        """Exception type + innermost vLLM frame (file and function, no line number)."""
        frame = self.vllm_frame or self.raised_at
        where = f" in {frame.file}:{frame.func}" if frame else ""
        return f"{self.exc_type.rsplit('.', 1)[-1]}{where}"

    def describe(self) -> str:
        parts = [self.line[:300]]
        if self.raised_at is not None:
            parts.append(f"raised at {self.raised_at}")
        if self.vllm_frame is not None and self.vllm_frame != self.raised_at:
            parts.append(f"in vLLM at {self.vllm_frame}")
        return "; ".join(parts)


def _content(line: str) -> tuple[str | None, str]:
    """(process, the line without vLLM's process prefix and logger header)."""
    parsed = LINE.match(line)
    if parsed:
        return parsed.group("proc"), parsed.group("msg")
    m = _PROC.match(line)
    if m:
        return m.group("proc"), line[m.end():]
    return None, line


def _package_path(path: str) -> str:
    m = _PACKAGE_PATH.search(path)
    if m:
        return m.group("rel")
    i = path.rfind("/vllm/")
    return path[i + 1:] if i >= 0 else path.rsplit("/", 1)[-1]


@dataclass
class _Traceback:
    process: str | None
    frames: list[Frame]
    exc: tuple[str, str] | None = None


def tracebacks(log_lines: Iterable[str]) -> list[_Traceback]:
    """Every complete traceback in the log, in order, each read within its own process's lines
    (processes print concurrently; their lines interleave)."""
    open_: dict[str | None, _Traceback] = {}
    done: list[_Traceback] = []
    for raw in log_lines:
        proc, text = _content(raw.rstrip("\n"))
        if text.startswith("Traceback (most recent call last)"):
            open_[proc] = _Traceback(proc, [])
            continue
        tb = open_.get(proc)
        if tb is None:
            continue
        frame = _FRAME.match(text)
        if frame:
            tb.frames.append(Frame(_package_path(frame.group("file")), int(frame.group("line")), frame.group("func")))
            continue
        if text.startswith((" ", "\t")) or not text.strip():
            continue  # source lines and carets under a frame
        exc = _EXC.match(text.strip())
        if exc:
            tb.exc = (exc.group("type"), (exc.group("msg") or "").strip())
            done.append(tb)
        # An exception line ends the traceback; anything else unexpected ends it too.
        del open_[proc]
    return done


def root_cause(log_text: str) -> Cause | None:
    """The first traceback's exception that is not a consequence of another, or None."""
    found = [tb for tb in tracebacks(log_text.splitlines()) if tb.exc is not None]
    if not found:
        return None
    primary = [tb for tb in found if not _CONSEQUENCE.search(f"{tb.exc[0]}: {tb.exc[1]}")]  # type: ignore[index]
    tb = (primary or found)[0]
    assert tb.exc is not None
    vllm_frames = [f for f in tb.frames if f.file.startswith("vllm/")]
    return Cause(tb.exc[0], tb.exc[1], tb.frames[-1] if tb.frames else None,
                 vllm_frames[-1] if vllm_frames else None, tb.process)


def engine_died(log_text: str) -> bool:
    """The log says the engine is dead (whether or not the process has exited yet)."""
    return bool(_DEATH.search(log_text))


def dead_engine_reply(http_status: int | None, body: Any) -> bool:
    """A 5xx answer whose body says the engine died."""
    if http_status is None or http_status < 500 or body is None:
        return False
    return bool(_DEAD_REPLY.search(body if isinstance(body, str) else str(body)))


def setting_words(values: Mapping[str, Any], serve: Mapping[str, Any], env: Mapping[str, str]) -> set[str]:
    """Words by which a refusal can name a cell's settings: flags in their spellings, env names,
    and the values that are names (a spec method, an attention backend)."""
    words: set[str] = set()
    for key, value in values.items():
        if key == "commit" or key.startswith("request."):
            continue
        name = key.split(".", 1)[-1].lstrip("-")
        words |= {name, name.replace("-", "_"), name.replace("_", " ").replace("-", " ")}
        if isinstance(value, str) and len(value) >= 3 and value.lower() not in ("none", "true", "false"):
            words.add(value)
    for flag in serve:
        name = flag.lstrip("-")
        words |= {name, name.replace("-", "_"), name.replace("-", " ")}
    words |= set(env)
    if values.get("spec_method") not in (None, "none"):
        words |= {"speculative", "spec decod", "draft"}
    if values.get("async_scheduling"):
        words |= {"async scheduling", "asynchronous scheduling"}
    if "attention_backend" in values:
        words.add("attention backend")
    return {w for w in words if len(w) >= 3}


def refusal_names_settings(reason: str | None, words: Iterable[str]) -> bool:
    """A start failure is the configuration failing when vLLM's reason names one of its settings
    and nothing points at the machine instead."""
    if not reason or _INFRASTRUCTURE.search(reason):
        return False
    low = reason.lower()
    return any(w.lower() in low for w in words)
