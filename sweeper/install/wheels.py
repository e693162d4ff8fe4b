"""The `wheels` kind: a uv venv per commit from vLLM's per-commit wheel index
(`<index_url>/<full sha>[/<variant>]`). A commit must be a full sha, or resolved to one in
`install.repo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.errors import ConfigError, InstallError
from sweeper.install import git as gitrepo
from sweeper.install import steps
from sweeper.install.kind import Availability, InstallKind, Recipe, digest, settings_of

if TYPE_CHECKING:
    from sweeper.spec.matrix import Install

INDEX_TIMEOUT_S = 30  # one question to the index


class Wheels(InstallKind):
    name = "wheels"

    def unresolved_problem(self, ref: str) -> str | None:
        return None if gitrepo.is_full_sha(ref) else f"commit {ref!r} needs install.repo to resolve it to a full sha"

    def recipe(self, install: Install, commit: str, sha: str | None, *, base_dir: Path, cache: Path,
               repo: Path | None) -> Recipe:
        full = sha or commit
        if not gitrepo.is_full_sha(full):
            raise ConfigError(f"install kind wheels needs a full 40-hex commit sha, got {full!r} "
                              "(resolve the ref first)", key="install")
        return Recipe(f"wheels-{full[:12]}-{digest(settings_of(install), full)}", self, commit, full, install,
                      base_dir)

    def build(self, recipe: Recipe, root: Path) -> dict[str, Any]:
        assert recipe.sha is not None
        install = recipe.install
        index = index_for(install, recipe.sha)
        _check_wheel_index(index, recipe.sha)
        venv = root / "venv"
        uv = steps.uv()
        steps.run([*uv, "venv", "--seed", "--python", sys.executable, str(venv)], root)
        python = str(venv / "bin" / "python")
        steps.run([*uv, "pip", "install", "-p", python, "vllm", *install.extra_packages, "--torch-backend=auto",
                   "--extra-index-url", index], root)
        version = steps.query_version(python)
        # An index without this commit's wheel lets uv fall back to a release from PyPI: refuse that.
        if version and "+g" in version and not recipe.sha.startswith(version.rsplit("+g", 1)[1][:7]):
            raise InstallError(f"wheels: {index} gave vllm {version}, which is not commit {recipe.sha[:12]}")
        return {"launch": steps.default_launch(venv), "env": {}, "python": python, "version": version}


    def availability(self, install: Install, sha: str | None) -> Availability:
        if sha is None or not gitrepo.is_full_sha(sha):
            return Availability("", "not resolved to a full sha (install.repo resolves refs)")
        url = package_url(index_for(install, sha))
        return Availability(url, _index_problem(url))


def index_for(install: Install, sha: str) -> str:
    """The commit's index: `<index_url>/<full sha>[/<variant>]`."""
    return "/".join(x.strip("/") if i else x.rstrip("/")
                    for i, x in enumerate([install.index_url, sha, install.variant or ""]) if x)


def package_url(index: str) -> str:
    """The index's page of the vllm package: what uv reads, and what says whether the wheel is there."""
    return index.rstrip("/") + "/vllm/"


def _index_problem(url: str) -> str | None:
    """Why the package page `url` holds no vllm (a folder for a file:// index), or None."""
    if url.startswith("file://"):
        folder = Path(url[len("file://"):])
        return None if folder.is_dir() and any(folder.iterdir()) else f"{folder} does not exist"
    import httpx  # only the wheels kind talks HTTP here

    try:
        resp = httpx.get(url, follow_redirects=True, timeout=INDEX_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None if resp.status_code == 200 else f"HTTP {resp.status_code}"


def _check_wheel_index(index: str, sha: str) -> None:
    """Fail before uv runs when the index has no vllm for this commit (uv would silently use PyPI's)."""
    url = package_url(index)
    reason = _index_problem(url)
    if reason is not None:
        raise InstallError(f"no vLLM wheel for commit {sha[:12]} at {url} ({reason}); "
                           "a fresh commit's wheel can take an hour to appear, or try another variant")
