"""Where a matrix's vLLM repository is on the driver: a local path, a URL cloned into the runs'
cache, or a `sim:` history made by the simulator's own command line (the sim install kind)."""

from __future__ import annotations

from pathlib import Path

from sweeper.errors import ConfigError
from sweeper.install import git as gitrepo
from sweeper.install.registry import kind_of
from sweeper.install.sim import Sim
from sweeper.spec.matrix import Matrix, resolve_path
from sweeper.store.location import local_side


def repo_for(matrix: Matrix, runs_dir: str | Path) -> Path | None:
    install = matrix.spec.install
    kind = kind_of(install.kind)
    if problem := kind.repo_problem(install):
        raise ConfigError(problem, file=matrix.path, key="install.repo")
    if not install.repo or not kind.uses_repo(install):
        return None
    if install.repo.startswith("sim:"):
        return Sim.make_history(install.repo, local_side(runs_dir) / ".cache")
    if gitrepo.is_url(install.repo):
        return gitrepo.ensure_clone(install.repo, local_side(runs_dir) / ".cache" / "repos")
    return resolve_path(matrix.path, install.repo)
