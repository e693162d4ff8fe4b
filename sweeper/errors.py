"""One error tree. `SweepError`s are expected failures: the CLI prints one line and exits 1.

Anything else escaping to the CLI is a bug and keeps its traceback.
"""

from __future__ import annotations


class SweepError(Exception):
    """A failure the user can act on; its message is one line."""


class ConfigError(SweepError):
    """Bad input in a matrix, suite or other file: names the file, line and key."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.file, self.line, self.key, self.message = file, line, key, message
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        what = f"{key}: " if key else ""
        super().__init__(f"{where}{what}{message}")


class InstallError(SweepError):
    """vLLM (or the simulator) could not be installed for a commit."""


class ServerError(SweepError):
    """A server did not become healthy, or died. `status` is the cell status it implies."""

    def __init__(self, message: str, *, status: str = "server_failed", log_tail: str = "") -> None:
        self.status, self.log_tail = status, log_tail
        super().__init__(message)


class GitError(SweepError):
    """A ref or range could not be resolved in a repository."""


class StoreError(SweepError):
    """Results on disk are missing, of another schema version, or inconsistent."""


class BisectError(SweepError):
    """A bisect cannot start or continue (bad endpoints, ambiguous cell, ...)."""


class ClusterError(SweepError):
    """Ray could not be reached, or a cell can never be scheduled."""
