"""One error tree. `SweepError`s are expected failures: the CLI prints one line and exits 1.

Anything else escaping to the CLI is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any

from sweeper.spec.status import Status

# An error is one line of readable size, whatever the input held: a key with newlines or a
# megabyte value must not flood the terminal (or leak a file's contents into a log).
MAX_SHOWN = 80
MAX_MESSAGE = 400
MAX_FILE_SHOWN = 200


def clip(value: Any, limit: int = MAX_SHOWN) -> str:
    """`repr(value)` on one line, cut to `limit` characters."""
    return _cut(one_line(repr(value)), limit)


def one_line(text: str) -> str:
    """Control characters (newlines included) escaped, so the text stays on one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _cut_middle(text: str, limit: int) -> str:
    # Paths: the start says where, the end says which file.
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return text[:half] + "…" + text[-half:]


class SweepError(Exception):
    """A failure the user can act on; its message is one line."""


class ConfigError(SweepError):
    """Bad input in a matrix, suite or other file: names the file, line and key."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.file, self.line, self.key, self.message = file, line, key, message
        where = ""
        if file:
            shown = _cut_middle(one_line(file), MAX_FILE_SHOWN)
            where = f"{shown}:{line}: " if line else f"{shown}: "
        what = f"{_cut(one_line(key), MAX_SHOWN)}: " if key else ""
        super().__init__(f"{where}{what}{_cut(one_line(message), MAX_MESSAGE)}")


class InstallError(SweepError):
    """vLLM (or the simulator) could not be installed for a commit."""


class ServerError(SweepError):
    """A server did not become healthy, or died. `status` is the cell status it implies."""

    def __init__(self, message: str, *, status: Status = Status.SERVER_FAILED, log_tail: str = "") -> None:
        self.status, self.log_tail = status, log_tail
        super().__init__(message)


class PortTakenError(ServerError):
    """The server's port answers for another server: taken between choosing it and binding it."""


class MetricsError(SweepError):
    """A server's /metrics could not be read (unreachable, refused, not 200)."""


class GitError(SweepError):
    """A ref or range could not be resolved in a repository."""


class StoreError(SweepError):
    """Results on disk are missing, of another schema version, or inconsistent."""


class RecordError(StoreError):
    """A stored record (a run's manifest) that fits no version this sweeper reads: damage."""


class BisectError(SweepError):
    """A bisect cannot start or continue (bad endpoints, ambiguous cell, ...)."""


class ClusterError(SweepError):
    """Ray could not be reached, or a cell can never be scheduled."""


class Interrupted(SweepError):
    """The user stopped a run (Ctrl-C). Every finished group or probe is stored whole; the ones under
    way are not stored at all (their servers are stopped with their workers). The CLI names the
    command that goes on from there (`resume`), since only it knows how the run was started."""

    def __init__(self, run_uri: str, run_id: str, resume: str = "") -> None:
        self.run_uri, self.run_id, self.resume = run_uri, run_id, resume
        super().__init__(self._text())

    def _text(self) -> str:
        then = f"continue with `{self.resume}`" if self.resume else f"continue it with --resume {self.run_id}"
        return f"interrupted: {self.run_uri} keeps what finished, nothing that was under way; {then}"

    def with_resume(self, command: str) -> Interrupted:
        return Interrupted(self.run_uri, self.run_id, command)
