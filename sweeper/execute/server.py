"""One server process group, owned by a context manager.

The server (real `vllm serve` or the simulator) runs in its own session, so its children (engine
core, workers) are stopped with it: TERM to the group, a grace period, KILL, then `wait()`.
Readiness polls `/health` against a monotonic deadline and fails fast when the process has exited.
Output goes to a log file that checks and the effective-config parser read.

A server never outlives the process that started it (a Ray worker, a test): the session is led by
a small guard that starts the server under a watcher, passes its exit status on, and stops the whole
group (TERM, grace, KILL) as soon as its owner is gone, whatever killed the owner or the guard, on
any node, even when the server hangs in its own shutdown.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from sweeper.errors import PortTakenError, ServerError
from sweeper.execute import guard
from sweeper.execute.transport import tls

LOG_TAIL_LINES = 40
# Starts on a fresh port after another server took this one (see ServerProcess.api_key).
PORT_ATTEMPTS = 3
# The guard (`sweeper/execute/guard.py`) runs by its path, `python -I -S guard.py <owner pid> <grace s> argv...`:
# isolated (no PYTHON* variables, no user site, not its own folder on sys.path) and without site, it
# imports the standard library only, whatever environment the server is given.
GUARD = Path(os.path.abspath(guard.__file__))


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_api_key() -> str:
    return "sk-sweep-" + secrets.token_hex(12)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class ServerProcess:
    """Start `argv` with `env` in its own process group; ready when `/health` answers 200."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, port: int, log_path: Path,
                 startup_timeout_s: float, grace_s: float = 10.0, cwd: Path | None = None,
                 api_key: str | None = None) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.port = port
        # With the key the server was given, a healthy answer is checked to be this server's: the
        # port is chosen free, then bound by the server a moment later, and on a busy node another
        # server can take it in between (whose /health answers, whose API refuses this key).
        self.api_key = api_key
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self.starts = 0  # starts made (one that never became healthy counts; one moved to a free port not)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.start()
            try:
                self.wait_ready()
                return self
            except PortTakenError as exc:
                self.stop()
                # Not a start of this server: another one answered on the port this side chose, so it
                # was stopped before it could serve (vLLM binds before it loads the model). Counted,
                # it made a sweep's starts exceed the servers it ran, and differ from a bisect's.
                self.starts -= 1
                if attempt == PORT_ATTEMPTS or not self._move_port():
                    raise
                with open(self.log_path, "a", encoding="utf-8") as log:
                    log.write(f"\n===== sweep: {exc}; starting again on port {self.port} =====\n")
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")  # the loop returns or raises

    def _move_port(self) -> bool:
        """A fresh port in the argv (`--port N`, as vLLM takes it); False if the argv names none."""
        for i, arg in enumerate(self.argv[:-1]):
            if arg == "--port" and self.argv[i + 1] == str(self.port):
                self.port = free_port()
                self.argv[i + 1] = str(self.port)
                return True
        return False

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        leader = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), str(self.grace_s)]
        # The server keeps its own copy of the descriptor: ours is closed once it has started.
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen([*leader, *self.argv], env=self.env, cwd=self.cwd,
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            except OSError as exc:
                raise ServerError(f"cannot start {self.argv[0]}: {exc}") from None
        self.starts += 1
        self._t0 = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self) -> float:
        assert self.proc is not None
        deadline = self._t0 + self.startup_timeout_s
        with httpx.Client(timeout=2.0, verify=tls()) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    # It could not bind: is another server there?
                    self._raise_if_taken(client)
                    raise ServerError(f"server exited with code {code} before it was healthy",
                                      log_tail=tail(self.log_path))
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        self._raise_if_taken(client)
                        self.startup_s = time.monotonic() - self._t0
                        return self.startup_s
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(f"server not healthy after {self.startup_timeout_s:.0f}s",
                                      log_tail=tail(self.log_path))
                time.sleep(0.1)

    def _raise_if_taken(self, client: httpx.Client) -> None:
        """PortTakenError if the port answers for a server that refuses this one's API key."""
        if self.api_key is None:
            return
        try:
            reply = client.get(f"{self.base_url}/v1/models", headers={"Authorization": f"Bearer {self.api_key}"})
        except httpx.HTTPError:
            return
        if reply.status_code == 401:
            raise PortTakenError(f"port {self.port} answers for another server (its API refuses this server's "
                                 "key)", log_tail=tail(self.log_path))

    def stop(self) -> None:
        """TERM the whole group, wait `grace_s`, KILL what is left, reap the leader."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # leader of its own session: pgid == pid
        deadline = time.monotonic() + self.grace_s
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=self.grace_s)
        # Children may outlive the leader (vLLM's engine core does): give them the rest of the
        # grace period, then KILL whatever is left of the group.
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
        self.proc.wait()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
