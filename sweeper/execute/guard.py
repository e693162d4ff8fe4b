"""The guard of one server: leads the server's session and stops it when its owner is gone.

Run as `python -I -S guard.py <owner pid> <grace s> argv...` (by `server.ServerProcess`). It imports
os, signal, sys and time only (ctypes in the server's child) and nothing from `sweeper`, so it runs
under any node's interpreter and starts in a fraction of the server's own start.

Two processes, each watching its parent: the outer one (the owner's direct child, which Ray
SIGKILLs when a worker exits) and a watcher under it that nothing outside kills. Whichever sees its
parent gone stops the group: TERM, the grace period, then KILL, so a server that hangs in its
shutdown goes too. TERM and INT reach the whole group: both ignore them and wait for the server,
whose exit status (or signal) they repeat as their own. The server also gets TERM the moment the
watcher dies.
"""

from __future__ import annotations

import os
import signal
import sys
import time

# typing costs this process more than the rest of its imports together: named for the checker only
# (mypy reads a constant of this name as typing's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

POLL_S = 0.05
# Signals whose action the server gets back to the default: as from a shell.
_RESET = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ)
_PR_SET_PDEATHSIG = 1


def watch(child: int, parent: int, who: str, grace: float) -> int:
    """Wait for `child`; if our parent changes from `parent` first, stop the group. Its wait status."""
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return status
        if os.getppid() != parent:
            os.write(1, f"sweep: {who} is gone: stopping this server\n".encode())
            os.killpg(0, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while not os.waitpid(child, os.WNOHANG)[0] and time.monotonic() < deadline:
                time.sleep(0.05)
            os.killpg(0, signal.SIGKILL)
        time.sleep(POLL_S)


def repeat(status: int) -> NoReturn:
    """End this process the way the child ended: its exit code, or the signal that killed it."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:  # noqa: SIM105  (contextlib is one more import on the path of every server start)
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP: their action is the default one already
        os.kill(os.getpid(), -code)
        time.sleep(1)
    sys.exit(code if code >= 0 else 128 - code)


def exec_server(argv: list[str], watcher: int) -> NoReturn:
    """In the watcher's child: die with the watcher, reset the signals, become the server."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # Linux
    except (OSError, AttributeError):
        pass
    if os.getppid() != watcher:  # the watcher died before that took effect
        os._exit(1)
    # The server starts as from a shell: the worker's blocked and ignored signals (a Ray worker
    # blocks SIGINT; Python ignores SIGPIPE; the guard ignores TERM) would otherwise reach it
    # through exec, and a blocked TERM would make the death signal above wait forever.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in _RESET:
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"cannot start {argv[0]}: {exc}\n".encode())
        os._exit(127)


def main(args: list[str]) -> NoReturn:
    owner, grace, argv = int(args[0]), float(args[1]), args[2:]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    outer = os.getpid()
    watcher = os.fork()
    if watcher == 0:
        me = os.getpid()
        server = os.fork()
        if server == 0:
            exec_server(argv, me)
        repeat(watch(server, outer, f"the guard of this server ({outer})", grace))
    repeat(watch(watcher, owner, f"the process that started this server ({owner})", grace))


if __name__ == "__main__":
    main(sys.argv[1:])
