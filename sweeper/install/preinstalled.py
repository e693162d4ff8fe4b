"""The `preinstalled` kind: the `vllm` on PATH, or the one of `install.python` (an interpreter or a
venv folder). It is one commit, whatever the matrix asks for."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.errors import InstallError
from sweeper.install import steps
from sweeper.install.kind import InstallKind, Recipe, digest, settings_of

if TYPE_CHECKING:
    from sweeper.spec.matrix import Install


class Preinstalled(InstallKind):
    name = "preinstalled"
    cost_s = (0.0, 240.0, 2.0)  # nothing to install
    default_commit = "installed"

    def commits_problem(self, commits: Sequence[str]) -> str | None:
        if len(commits) > 1:
            return f"a preinstalled vLLM is one commit, but the commit axis has {len(commits)} values"
        return None

    def uses_repo(self, install: Install) -> bool:
        return False  # what is installed is what runs: there is nothing to resolve

    def recipe(self, install: Install, commit: str, sha: str | None, *, base_dir: Path, cache: Path,
               repo: Path | None) -> Recipe:
        return Recipe(f"pre-{digest(settings_of(install), install.python or shutil.which('vllm'))}", self, commit,
                      sha, install, base_dir)

    def build(self, recipe: Recipe, root: Path) -> dict[str, Any]:
        python: str | None = None
        if recipe.install.python:
            p = Path(recipe.install.python).expanduser()
            p = p if p.is_absolute() else recipe.base_dir / p
            python = str(p / "bin" / "python") if p.is_dir() else str(p)
            if not Path(python).exists():
                raise InstallError(f"preinstalled: python {python} does not exist")
            script = Path(python).parent / "vllm"
            launch = [str(script), "serve"] if script.exists() else [python, "-m", "vllm.entrypoints.cli.main",
                                                                     "serve"]
        else:
            vllm = shutil.which("vllm")
            if vllm is None:
                raise InstallError("preinstalled: no `vllm` on PATH; set install.python to the Python that has vLLM")
            launch, python = [vllm, "serve"], steps.shebang_python(Path(vllm))
        return {"launch": launch, "env": {}, "python": python,
                "version": steps.query_version(python) if python else None}
