"""The `source` kind: a git worktree of `install.repo` at the sha, installed editable into a uv venv
with `VLLM_USE_PRECOMPILED=1` (vLLM's Python at the commit over a precompiled build)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.errors import ConfigError
from sweeper.install import git as gitrepo
from sweeper.install import steps
from sweeper.install.kind import InstallKind, Recipe, digest, settings_of

if TYPE_CHECKING:
    from sweeper.spec.matrix import Install


class Source(InstallKind):
    name = "source"
    cost_s = (600.0, 240.0, 2.0)  # a build with precompiled kernels
    ships_repo = True

    def repo_problem(self, install: Install) -> str | None:
        return None if install.repo else "install.repo is required for this install kind"

    def recipe(self, install: Install, commit: str, sha: str | None, *, base_dir: Path, cache: Path,
               repo: Path | None) -> Recipe:
        if not install.repo:
            raise ConfigError("install kind source needs install.repo", key="install.repo")
        repo = repo or steps.local_repo(install.repo, base_dir, cache)
        full = sha or gitrepo.resolve(repo, commit)
        return Recipe(f"source-{full[:12]}-{digest(settings_of(install), full)}", self, commit, full, install,
                      base_dir, repo)

    def build(self, recipe: Recipe, root: Path) -> dict[str, Any]:
        assert recipe.repo is not None and recipe.sha is not None
        src = root / "src"
        steps.log_step(root, ["git", "-C", str(recipe.repo), "worktree", "add", "--detach", str(src), recipe.sha])
        gitrepo.worktree_add(recipe.repo, recipe.sha, src)
        venv = root / "venv"
        uv = steps.uv()
        steps.run([*uv, "venv", "--seed", "--python", sys.executable, str(venv)], root)
        python = str(venv / "bin" / "python")
        env = {**os.environ, "VLLM_USE_PRECOMPILED": "1"}
        steps.run([*uv, "pip", "install", "-p", python, "--editable", str(src), *recipe.install.extra_packages],
                  root, env=env)
        # `repo`: the environment's folder holds a worktree of it, which removal tells git to forget.
        return {"launch": steps.default_launch(venv), "env": {}, "python": python,
                "version": steps.query_version(python), "repo": str(recipe.repo)}
