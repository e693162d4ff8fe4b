"""The `sim` kind: the simulator (package `vllmsim`) as the server, for tests and demos.

The product reaches the simulator only through its command line and the `SWEEP_SIM_TREE` variable,
both owned here: an environment materialises the sim repository's tree at the commit into the cache
and names it to the simulator; `install: "fail: ..."` in that commit's sim.yaml is an install error.
A `sim:<scenario>` repository is a simulated history the simulator's `make-repo` makes.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from sweeper.errors import ConfigError, InstallError
from sweeper.install import git as gitrepo
from sweeper.install import steps
from sweeper.install.kind import InstallKind, Recipe, digest, settings_of, slug

if TYPE_CHECKING:
    from sweeper.spec.matrix import Install

# The simulator's own interface: its executable, and the variable naming the tree it simulates.
COMMAND = (sys.executable, "-m", "vllmsim")
TREE_ENV = "SWEEP_SIM_TREE"

# What the simulator plants in its `sim:` histories, as a version: a history cached by an older one is
# made again (the demo gained its performance model and planted metric changes in "2").
HISTORY_FORMAT = "2"


class Sim(InstallKind):
    name = "sim"
    cost_s = (2.0, 1.0, 0.05)  # what a demo on a laptop costs
    env_module = "vllmsim.envs"  # the simulator lists its variables as vLLM does
    ships_repo = True
    logical_gpus = True
    # `sim:<name>`: the histories `python -m vllmsim make-repo --scenario` makes.
    HISTORIES: ClassVar[tuple[str, ...]] = ("demo", "bisect")

    def repo_problem(self, install: Install) -> str | None:
        return None if install.repo else "install.repo is required for this install kind"

    def recipe(self, install: Install, commit: str, sha: str | None, *, base_dir: Path, cache: Path,
               repo: Path | None) -> Recipe:
        repo = repo or (steps.local_repo(install.repo, base_dir, cache) if install.repo else None)
        if repo is not None and sha is None:
            sha = gitrepo.resolve(repo, commit)
        ident = sha or commit
        return Recipe(f"sim-{slug(ident)}-{digest(settings_of(install), ident)}", self, commit, sha, install,
                      base_dir, repo)

    def build(self, recipe: Recipe, root: Path) -> dict[str, Any]:
        env: dict[str, str] = {}
        version = None
        if recipe.repo is not None:
            tree = root / "tree"
            tree.mkdir()
            with tarfile.open(fileobj=io.BytesIO(gitrepo.archive(recipe.repo, str(recipe.sha)))) as tar:
                tar.extractall(tree, filter="data")
            spec = _sim_yaml(tree)
            install = str(spec.get("install", "ok"))
            if install.startswith("fail"):
                msg = install.partition(":")[2].strip() or install
                raise InstallError(f"installing the simulator at {recipe.commit} ({(recipe.sha or '')[:12]}) "
                                   f"failed: {msg}")
            version = str(spec["version"]) if "version" in spec else None
            env[TREE_ENV] = str(tree)
        return {"launch": [*COMMAND, "serve"], "env": env, "python": sys.executable, "version": version}

    @classmethod
    def make_history(cls, spec: str, cache: Path) -> Path:
        """`sim:<scenario>`: a simulated vLLM history made once by the simulator's own command line."""
        scenario = spec.split(":", 1)[1] or "demo"
        target = cache / f"sim-{scenario}"
        stamp = target / ".git" / "sweep-history-format"
        if (target / ".git").exists() and (not stamp.exists() or stamp.read_text().strip() != HISTORY_FORMAT):
            # Made by an older simulator (without what its histories plant now): moved aside, made again.
            aside = cache / f".stale-sim-{scenario}.{os.getpid()}"
            with contextlib.suppress(OSError):
                target.rename(aside)
                shutil.rmtree(aside, ignore_errors=True)
        if not (target / ".git").exists():
            cache.mkdir(parents=True, exist_ok=True)
            # Made in a folder of its own and renamed into place: two runs starting together each
            # make one, the first rename wins and the other is dropped.
            work = Path(tempfile.mkdtemp(prefix=f".sim-{scenario}.", dir=cache))
            try:
                done = subprocess.run([*COMMAND, "make-repo", str(work / "repo"), "--scenario", scenario],
                                      capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise ConfigError(f"cannot make the simulated history {spec!r}: {done.stderr.strip()[-300:]}")
                (work / "repo" / ".git" / "sweep-history-format").write_text(HISTORY_FORMAT + "\n")
                with contextlib.suppress(OSError):  # another run was first
                    (work / "repo").rename(target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return target


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
