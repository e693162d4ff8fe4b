"""Files a reader never sees half-written, and per-node caches filled once.

`replacing(path)` is the one way the sweeper writes a file atomically: the caller writes a unique
temporary file in the same folder, which is flushed to disk and renamed over `path` (rename within
a folder is atomic), so a crash or a concurrent reader sees the old file or the new one, never a
part. `write_text`/`write_json` are the common cases. `cached_json` is a per-environment cache
file (vLLM's flags, the environment fingerprint) filled by the first of several concurrent callers
under a lock; a computation that fails is never cached. `orphan_dirs` finds the scratch folders of
processes that died before their own clean-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import filelock
import psutil

T = TypeVar("T")


@contextlib.contextmanager
def replacing(path: Path | str) -> Iterator[Path]:
    """A fresh temporary path beside `path` to write to; when the block ends without an error it
    is synced and renamed over `path`, otherwise removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600 whatever the umask; the file it becomes is read by others
        # (a shared runs folder, a served HTML report) as any file written plainly would be.
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename itself is durable once the folder's entry is on disk.
    with contextlib.suppress(OSError):
        _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def current_umask() -> int:
    """The process's umask: from /proc where there is one (reading it there changes nothing), else
    by setting it and putting it back (for that instant another thread's new file gets 022)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: Path | str, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path | str, data: Any, *, indent: int | None = 2) -> None:
    """`data` as JSON (sorted keys; values JSON has no type for, such as datetimes, as strings)."""
    write_text(path, json.dumps(data, indent=indent, sort_keys=True, default=str) + "\n")


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def cache_lock(cache: Path, timeout: float) -> Iterator[None]:
    """The lock beside a cache file. A holder that outlives `timeout` plus a margin is stuck: the
    waiter then fills the cache itself rather than waiting forever."""
    lock = filelock.FileLock(f"{cache}.lock", timeout=timeout + 60)
    try:
        lock.acquire()
    except filelock.Timeout:
        yield
        return
    try:
        yield
    finally:
        lock.release()


def cached_json(path: Path | None, compute: Callable[[], T], *, decode: Callable[[Any], T],
                encode: Callable[[T], Any], timeout: float, refresh: bool = False) -> T:
    """`compute()`, cached as JSON at `path` (None: not cached). Callers that start together wait
    on the lock beside the file while the first computes, then read what it wrote. An exception
    from `compute` propagates and leaves no file: a failed or timed-out probe is asked again next
    time, never remembered. A file `decode` rejects counts as absent."""
    if path is None:
        return compute()
    if not refresh and (hit := _read(path, decode)) is not None:
        return hit
    with cache_lock(path, timeout):
        if not refresh and (hit := _read(path, decode)) is not None:
            return hit
        value = compute()
        write_json(path, encode(value), indent=None)
    return value


def _read(path: Path, decode: Callable[[Any], T]) -> T | None:
    try:
        return decode(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def orphan_dirs(prefix: str | Path) -> list[Path]:
    """Folders named `<prefix><pid>-...` whose process `pid` is gone: a process killed outright
    never reaches its own clean-up, so whoever starts the next one removes what it left."""
    prefix = str(prefix)
    parent, stem = os.path.split(prefix)
    out = []
    for path in Path(parent).glob(f"{stem}*-*"):
        pid = path.name[len(stem):].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            out.append(path)
    return out
