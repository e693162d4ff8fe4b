"""The per-node cache of environments: one per (install settings, commit), made by its install kind
(`sweeper.install`), and the `Installed` environment a server starts from.

The cache is safe for several cells on a node at once: a `filelock` per environment lets one process
install while the others wait; an environment is complete once its `meta.json` exists. While a server
runs from an environment, `in_use()` holds a shared lock on it, and eviction (least recently used,
down to `install.cache_max_gb`) skips environments that are in use or being installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import filelock

from sweeper.errors import GitError
from sweeper.install import git as gitrepo
from sweeper.install.kind import Recipe
from sweeper.install.registry import kind_of
from sweeper.install.steps import INSTALL_TIMEOUT_S
from sweeper.spec.matrix import Install
from sweeper.store import files
from sweeper.store.env_record import EnvInfo

META = "meta.json"


@dataclass(frozen=True)
class Installed:
    """An environment ready to start servers from."""

    commit: str  # as requested (a ref)
    sha: str | None  # resolved, where known
    # argv before the model; a tuple ending in "--model" takes the model as that flag's value.
    launch: tuple[str, ...]
    kind: str  # the install kind's name: no default, nothing defaults to the simulator
    env: Mapping[str, str] = field(default_factory=dict)  # extra server environment
    python: str | None = None  # the environment's interpreter (version and fingerprint queries)
    version: str | None = None  # vLLM version string
    root: str | None = None  # this environment's cache folder (flag and fingerprint caches live here)

    def __hash__(self) -> int:
        return hash((self.commit, self.sha, self.launch, tuple(sorted(self.env.items())), self.root))


def default_cache_dir() -> Path:
    return Path(os.environ.get("SWEEP_CACHE") or Path.home() / ".cache" / "sweep" / "envs").expanduser()


def cache_dir_for(install: Install, base_dir: Path, cache_dir: Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    if install.cache_dir:
        p = Path(install.cache_dir).expanduser()
        return p if p.is_absolute() else base_dir / p
    return default_cache_dir()


# --- the entry point -----------------------------------------------------------------------------

def prepare(install: Install, commit: str, sha: str | None, *, base_dir: Path,
            cache_dir: Path | None = None, repo: Path | None = None) -> Installed:
    """The environment for `commit`, installed once per node; raises InstallError with the installer's tail.

    `repo`: this node's copy of the repository (a job's shipped history, `sweeper.install.portable`);
    without it `install.repo` is read here (a URL is cloned into this node's cache)."""
    cache = cache_dir_for(install, Path(base_dir), cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    recipe = kind_of(install.kind).recipe(install, commit, sha, base_dir=Path(base_dir), cache=cache, repo=repo)
    root = cache / recipe.key
    with filelock.FileLock(str(_lock_path(cache, recipe.key)), timeout=INSTALL_TIMEOUT_S):
        meta = _read_meta(root)
        if meta is None:
            if root.exists():  # an install that died half-way
                _remove_root(root)
            root.mkdir(parents=True)
            try:
                meta = _build(recipe, root)
            except BaseException:
                _remove_root(root)
                raise
            meta["size_bytes"] = _du(root)
            files.write_json(root / META, meta)  # last: the environment is complete once it exists
        else:
            os.utime(root / META)  # least-recently-used bookkeeping
    installed = with_launch(_installed(meta, root), install.launch)
    evict(cache, max_bytes=int(install.cache_max_gb * 1e9), keep={recipe.key})
    return installed


@contextlib.contextmanager
def in_use(installed: Installed) -> Iterator[None]:
    """Mark an environment as in use (a server runs from it) so eviction and `clear` leave it alone."""
    if not installed.root or not Path(installed.root).exists():
        yield
        return
    with open(Path(installed.root) / ".in-use", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)  # released by the kernel if this process dies
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(recipe: Recipe, root: Path) -> dict[str, Any]:
    meta = recipe.kind.build(recipe, root)
    return {"key": recipe.key, "kind": recipe.kind.name, "commit": recipe.commit, "sha": meta.pop("sha", recipe.sha),
            "created": time.time(), **meta}


# --- building an Installed -------------------------------------------------------------------------

def _installed(meta: Mapping[str, Any], root: Path) -> Installed:
    return Installed(commit=meta["commit"], sha=meta.get("sha"), launch=tuple(meta["launch"]), kind=meta["kind"],
                     env=dict(meta.get("env") or {}), python=meta.get("python"), version=meta.get("version"),
                     root=str(root))


def with_launch(installed: Installed, launch: Sequence[str] | None) -> Installed:
    """Apply `install.launch`: `{python}`, `{bin}` and `{root}` name the environment's parts."""
    if not launch:
        return installed
    python = installed.python or sys.executable
    subs = {"python": python, "bin": str(Path(python).parent), "root": installed.root or ""}
    argv = tuple(a.format(**subs) if "{" in a else a for a in launch)
    return Installed(**{**asdict(installed), "launch": argv})


# --- listing, clearing, eviction ---------------------------------------------------------------------

def list_environments(cache_dir: Path | None = None) -> list[EnvInfo]:
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if not cache.is_dir():
        return []
    out = []
    for root in sorted(p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")):
        meta = _read_meta(root)
        stamp = (root / META).stat().st_mtime if meta else root.stat().st_mtime
        out.append(EnvInfo(key=root.name, kind=(meta or {}).get("kind", "?"), commit=(meta or {}).get("commit", "?"),
                           sha=(meta or {}).get("sha"), version=(meta or {}).get("version"), root=str(root),
                           size_bytes=int((meta or {}).get("size_bytes", 0)), created=float((meta or {}).get(
                               "created", stamp)), last_used=stamp, in_use=_in_use(root), complete=meta is not None))
    return out


def clear(cache_dir: Path | None = None, *, older_than: float | None = None, commit: str | None = None) -> list[str]:
    """Remove environments not used for `older_than` seconds and/or of `commit` (a ref or sha prefix).

    Environments in use or being installed are kept. Returns the keys removed.
    """
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    now = time.time()
    removed = []
    for info in list_environments(cache):
        if older_than is not None and now - info.last_used < older_than:
            continue
        if commit is not None and not (info.commit == commit or (info.sha or "").startswith(commit)):
            continue
        if _remove_if_idle(cache, info.key):
            removed.append(info.key)
    return removed


def evict(cache_dir: Path, *, max_bytes: int, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Remove least-recently-used idle environments until the cache holds at most `max_bytes`."""
    with filelock.FileLock(str(Path(cache_dir) / ".locks" / "evict.lock"), timeout=600):
        envs = sorted(list_environments(cache_dir), key=lambda e: e.last_used)
        total = sum(e.size_bytes for e in envs)
        removed = []
        for e in envs:
            if total <= max_bytes:
                break
            if e.key in keep or not e.complete:
                continue
            if _remove_if_idle(Path(cache_dir), e.key):
                removed.append(e.key)
                total -= e.size_bytes
        return removed


def _remove_if_idle(cache: Path, key: str) -> bool:
    lock = filelock.FileLock(str(_lock_path(cache, key)))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False  # being installed or prepared right now
    try:
        root = cache / key
        if _in_use(root):
            return False
        _remove_root(root)
        return True
    finally:
        lock.release()


def _in_use(root: Path) -> bool:
    marker = root / ".in-use"
    if not marker.exists():
        return False
    with open(marker, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def _remove_root(root: Path) -> None:
    meta = _read_meta(root) or {}
    src = root / "src"
    if meta.get("repo") and src.exists():  # a worktree: let git forget it too
        with contextlib.suppress(GitError):
            gitrepo.worktree_remove(meta["repo"], src)
    with contextlib.suppress(FileNotFoundError):
        (root / META).unlink()  # first, so a half-removed folder never looks complete
    shutil.rmtree(root, ignore_errors=True)


# --- small helpers ------------------------------------------------------------------------------------

def _lock_path(cache: Path, key: str) -> Path:
    (cache / ".locks").mkdir(parents=True, exist_ok=True)
    return cache / ".locks" / f"{key}.lock"


def _read_meta(root: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((root / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _du(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
