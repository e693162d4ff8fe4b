"""What every install kind is: the questions the planner, the executors and the environment cache
ask of one (its rules on a matrix, its cache key, its install), with the answers most kinds share.

A kind is one subclass and one `sweeper.install.registry.register(...)`; nothing else in the product names
a kind.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from sweeper.spec.matrix import Install


@dataclass(frozen=True)
class Recipe:
    """One environment to make on this node: its cache key and what its install needs."""

    key: str  # the environment's folder name in the cache: what changes the installed files
    kind: InstallKind
    commit: str  # as requested (a ref)
    sha: str | None  # resolved, where known
    install: Install
    base_dir: Path  # the matrix folder: relative paths of the install settings start here
    repo: Path | None = None  # this node's repository of the commits, for kinds that build from one
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class Availability:
    """Whether a commit's vLLM can be had before any install starts: where that was asked, and why
    not (None: it is there)."""

    where: str
    problem: str | None = None


class InstallKind:
    """One way of getting vLLM (or a stand-in) at a commit."""

    name: ClassVar[str]
    # The commit of a cell when the matrix has no commit axis.
    default_commit: ClassVar[str] = "main"
    # Builds from the repository on the worker: jobs carry the repository (a URL or a bundle).
    ships_repo: ClassVar[bool] = False
    # Needs no real GPU: a local executor may declare logical GPU slots for it (never for real vLLM).
    logical_gpus: ClassVar[bool] = False
    # The stated cost where a run has measured nothing yet (`sweeper.plan.cost`): seconds per install,
    # per server start (to healthy) and per request, for a 27B-class model on one GPU. An install is
    # a cached environment's first build on a node; a start is weights loaded, compiled, warmed up.
    cost_s: ClassVar[tuple[float, float, float]] = (90.0, 240.0, 2.0)
    # The module of an installed environment whose `environment_variables` names every VLLM_* variable
    # the version reads (vllm/envs.py); asked by running the environment's python, never imported here.
    env_module: ClassVar[str] = "vllm.envs"

    # --- rules on a matrix (checked by the loader and the planner, before anything starts) --------

    def commits_problem(self, commits: Sequence[str]) -> str | None:
        """Why the commit axis can never be installed by this kind, or None."""
        return None

    def repo_problem(self, install: Install) -> str | None:
        """Why `install.repo` (or its absence) does not suit this kind, or None."""
        return None

    def uses_repo(self, install: Install) -> bool:
        """Whether the driver resolves the commits in `install.repo`."""
        return bool(install.repo)

    def unresolved_problem(self, ref: str) -> str | None:
        """Why `ref` cannot be installed when no repository resolves it, or None."""
        return None

    def release_package(self, install: Install) -> str | None:
        """The package whose published versions are the commit axis (a release history), if any."""
        return None

    def availability(self, install: Install, sha: str | None) -> Availability | None:
        """Asks where the kind gets vLLM from whether the commit (resolved to `sha`, None when not)
        is there; None: the kind has no such place to ask (`sweep matrix --check-wheels`)."""
        return None

    # --- the environment ------------------------------------------------------------------------

    def recipe(self, install: Install, commit: str, sha: str | None, *, base_dir: Path, cache: Path,
               repo: Path | None) -> Recipe:
        """The environment `commit` needs: its cache key (checked here: ConfigError when it cannot be made)."""
        raise NotImplementedError

    def build(self, recipe: Recipe, root: Path) -> dict[str, Any]:
        """Install into the empty folder `root`; the environment's meta: `launch` (argv before the
        model), `env`, `python`, `version`, and a resolved `sha` where the install learns it."""
        raise NotImplementedError


def settings_of(install: Install) -> dict[str, Any]:
    """The install settings that change the installed files (what names an environment): `versions`
    only limits a bisect, and an empty `pip_args` is left out so that environments made before it
    existed keep their names."""
    settings = install.model_dump(exclude={"cache_dir", "cache_max_gb", "launch", "versions"})
    if not settings["pip_args"]:
        del settings["pip_args"]
    return settings


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:8]


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", text)[:24]
