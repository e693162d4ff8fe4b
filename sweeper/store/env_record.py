"""What `sweep cache list` shows of one cached environment: a plain record, so that a reader can
print it without importing the install machinery (`sweeper.install.cache` makes these)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvInfo:
    """One cached environment, for `sweep cache list`."""

    key: str
    kind: str
    commit: str
    sha: str | None
    version: str | None
    root: str
    size_bytes: int
    created: float
    last_used: float
    in_use: bool
    complete: bool
