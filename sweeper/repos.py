"""Where a matrix's vLLM repository is on the driver: a local path, a URL cloned into the runs'
cache, or a `sim:` history made by the simulator's own command line."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sweeper import gitrepo
from sweeper.errors import ConfigError
from sweeper.matrix import Matrix, resolve_path
from sweeper.storage import local_side


def sim_repo(spec: str, cache: Path) -> Path:
    """`sim:<scenario>`: a simulated vLLM history made once by the simulator's own command line."""
    scenario = spec.split(":", 1)[1] or "demo"
    target = cache / f"sim-{scenario}"
    if not (target / ".git").exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Made in a folder of its own and renamed into place: two runs starting together each make
        # one, the first rename wins and the other is dropped.
        work = Path(tempfile.mkdtemp(prefix=f".sim-{scenario}.", dir=cache))
        try:
            done = subprocess.run([sys.executable, "-m", "sweeper.sim", "make-repo", str(work / "repo"), "--scenario",
                                   scenario], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise ConfigError(f"cannot make the simulated history {spec!r}: {done.stderr.strip()[-300:]}")
            with contextlib.suppress(OSError):  # another run was first
                (work / "repo").rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def repo_for(matrix: Matrix, runs_dir: str | Path) -> Path | None:
    install = matrix.spec.install
    if install.kind == "preinstalled" or not install.repo:
        if install.kind in ("sim", "source"):
            raise ConfigError("install.repo is required for this install kind", file=matrix.path, key="install.repo")
        return None
    if install.repo.startswith("sim:"):
        return sim_repo(install.repo, local_side(runs_dir) / ".cache")
    if gitrepo.is_url(install.repo):
        return gitrepo.ensure_clone(install.repo, local_side(runs_dir) / ".cache" / "repos")
    return resolve_path(matrix.path, install.repo)
