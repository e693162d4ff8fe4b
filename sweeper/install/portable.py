"""What a job carries instead of driver paths: the repository of its commits, made portable.

A worker node sees none of the driver's disk. A repository given as a URL travels as that URL and
is cloned on each node into the node's environment cache. A local repository, or a `sim:` history
the driver made, travels as a git bundle: made once per run on the driver, shipped once through
the cluster's object store, and fetched per node into one bare repository of that node's cache
(`<cache>/.repos/shipped.git`), where every shipped history shares its objects. A history already
fetched on a node (same refs, same commits) is never fetched again.

Pure git and files: the cluster layer decides how the bundle's bytes travel (`fetch`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import filelock

from sweeper.errors import InstallError
from sweeper.install import git as gitrepo
from sweeper.install.registry import kind_of
from sweeper.spec.matrix import Install, Matrix, MatrixFile, resolve_path

SHIPPED = "shipped.git"
LOCK_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class RepoSource:
    """Where a worker gets the repository: a URL to clone, or a bundle (exactly one of them)."""

    url: str | None = None
    # The bundle's identity: a digest of the refs it holds (commits are content-addressed, so the
    # same refs at the same shas are the same history).
    digest: str | None = None
    # The bundle itself: its bytes on the driver; in a job, whatever handle `fetch` turns into
    # those bytes (the cluster layer puts them in its object store once).
    bundle: Any = None

    @classmethod
    def of_url(cls, url: str) -> RepoSource:
        return cls(url=url)

    @classmethod
    def bundle_of(cls, repo: Path) -> RepoSource:
        """A git bundle of every ref of `repo` (branches, tags, HEAD), made on the driver; the last
        one is kept, so the rounds of a bisect make it once while the repository does not change."""
        digest = refs_digest(repo)
        key = (str(Path(repo).resolve()), digest)
        if key not in _LAST_BUNDLE:
            _LAST_BUNDLE.clear()  # one kept: a bundle of a large history is large
            _LAST_BUNDLE[key] = cls(digest=digest, bundle=_bundle_bytes(repo))
        return _LAST_BUNDLE[key]

    def with_bundle(self, handle: Any) -> RepoSource:
        return replace(self, bundle=handle)

    def __repr__(self) -> str:  # never print a bundle's bytes
        return f"RepoSource(url={self.url!r}, digest={self.digest!r})"


_LAST_BUNDLE: dict[tuple[str, str], RepoSource] = {}


def refs_digest(repo: Path) -> str:
    """Names a history: its refs and HEAD with their commits (content-addressed)."""
    refs = gitrepo.git(repo, "for-each-ref", "--format=%(objectname) %(refname)")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()
    return hashlib.sha256(f"{refs}\nHEAD {head}".encode()).hexdigest()[:20]


def _bundle_bytes(repo: Path) -> bytes:
    with tempfile.TemporaryDirectory(prefix="sweep-bundle-") as tmp:
        path = Path(tmp) / "repo.bundle"
        proc = subprocess.run(["git", "-C", str(repo), "bundle", "create", "--quiet", str(path), "--all"],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise InstallError(f"git bundle of {repo} failed: {proc.stderr.strip()[-500:]}")
        return path.read_bytes()


def node_repo(source: RepoSource | None, cache: Path, fetch: Callable[[Any], bytes]) -> Path | None:
    """This node's repository for `source`: None for a URL (the environment clones it into this
    node's cache) or no source; for a bundle, the node's shared bare repository once the bundle's
    refs are in it. `fetch(handle)` gives the bundle's bytes, asked only when this node lacks them."""
    if source is None or source.digest is None:
        return None
    repos = Path(cache) / ".repos"
    shared = repos / SHIPPED
    marker = repos / "shipped.d" / source.digest
    if marker.exists():
        return shared
    repos.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(repos / "shipped.lock"), timeout=LOCK_TIMEOUT_S):
        if marker.exists():
            return shared
        if not (shared / "HEAD").exists():
            tmp = Path(tempfile.mkdtemp(prefix=".shipped-", dir=repos))
            _git(tmp, "init", "--quiet", "--bare")
            os.replace(tmp, shared)
        with tempfile.NamedTemporaryFile(prefix=".bundle-", dir=repos) as f:
            f.write(fetch(source.bundle))
            f.flush()
            heads = _git(shared, "bundle", "list-heads", f.name).split("\n")
            names = [line.split(" ", 1)[1] for line in heads if " " in line]
            refspecs = [f"+{name}:refs/shipped/{source.digest}/{name.removeprefix('refs/')}" for name in names]
            if refspecs:
                _git(shared, "fetch", "--quiet", "--no-tags", f.name, *refspecs)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return shared


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InstallError(f"git {' '.join(args[:2])} on this node failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def model_path(matrix_path: str, value: str) -> str:
    """A model named by a local folder becomes an absolute path: next to the matrix file first, else
    from the working directory. Anything else (a hub id such as `Qwen/Qwen3-8B`) is left as written."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return value
    for candidate in (Path(matrix_path).parent / p, p):
        if candidate.is_dir():
            return str(candidate.resolve())
    return value


def with_model_paths(spec: MatrixFile, matrix_path: str) -> MatrixFile:
    """`model:` and every `spec_config.<method>.model` resolved by `model_path`, for the servers.
    Cell identities keep the names as written."""
    spec_config = {method: ({**conf, "model": model_path(matrix_path, conf["model"])}
                            if isinstance(conf.get("model"), str) else conf)
                   for method, conf in spec.spec_config.items()}
    return spec.model_copy(update={"model": model_path(matrix_path, spec.model), "spec_config": spec_config})


def portable_spec(matrix: Matrix) -> MatrixFile:
    """The settings workers get. Paths that name a place on every node (model paths, install.cache_dir,
    install.python) become absolute, as the matrix meant them; nothing else names the driver's disk.
    `install.repo` stays as written: a worker reads the repository only from its `RepoSource`."""
    spec = with_model_paths(matrix.spec, matrix.path)
    install = spec.install
    update = {k: str(resolve_path(matrix.path, v)) for k, v in (("cache_dir", install.cache_dir),
                                                                  ("python", install.python)) if v}
    if not update:
        return spec
    return spec.model_copy(update={"install": install.model_copy(update=update)})


def repo_source(install: Install, repo: Path | None) -> RepoSource | None:
    """How workers get the repository: a URL is cloned on each node; a local repository or a `sim:`
    history travels as a git bundle (made once per state of the repository). Only
    the kinds that build from the repository on the node (`ships_repo`: sim, source) need one."""
    if repo is None or not kind_of(install.kind).ships_repo or not install.repo:
        return None
    if gitrepo.is_url(install.repo):
        return RepoSource.of_url(install.repo)
    return RepoSource.bundle_of(Path(repo))
