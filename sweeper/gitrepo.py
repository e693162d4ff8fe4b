"""The vLLM repository: refs as users type them, first-parent ranges, commit metadata, clones.

`v0.27` means the `v0.27.0` release tag when no ref `v0.27` exists; `main`, tags, short and full
shas work as in git. Everything runs `git` in a subprocess; failures become one-line `GitError`s.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from sweeper.errors import GitError

_PR = re.compile(r"\(#(\d+)\)\s*$")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    pr: int | None
    date: str  # ISO 8601 author date


def git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    if done.returncode != 0:
        msg = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise GitError(f"git {' '.join(args[:2])} in {repo}: {msg}")
    return done.stdout.strip()


def is_full_sha(ref: str) -> bool:
    return bool(_FULL_SHA.match(ref))


def _rev(repo: Path, ref: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def resolve(repo: Path, ref: str) -> str:
    """A ref as a user types it -> a full sha."""
    if not (Path(repo) / ".git").exists() and not (Path(repo) / "HEAD").exists():
        raise GitError(f"{repo} is not a git repository")
    sha = _rev(repo, ref)
    if sha is None and re.fullmatch(r"v?\d+\.\d+", ref):
        sha = _rev(repo, f"{ref if ref.startswith('v') else 'v' + ref}.0")
    if sha is None:
        raise GitError(f"unknown ref {ref!r} in {repo} (expected a branch, a tag such as v0.27.0, or a sha)")
    return sha


def first_parent_range(repo: Path, good: str, bad: str) -> list[str]:
    """The good endpoint, then the first-parent commits after it up to bad, oldest first."""
    if good == bad:
        raise GitError(f"good and bad are the same commit {good[:12]}")
    merge_base = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good, bad],
                                capture_output=True, check=False)
    if merge_base.returncode != 0:
        raise GitError(f"good {good[:12]} is not an ancestor of bad {bad[:12]}")
    line = git(repo, "rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()
    if not line:
        raise GitError(f"no commits between {good[:12]} and {bad[:12]}")
    ancestors = set(git(repo, "rev-list", "--first-parent", bad).split())
    if good not in ancestors:
        raise GitError(f"good {good[:12]} is not on the first-parent line of bad {bad[:12]}")
    return [good, *line]


def first_parent_ancestor(repo: Path, sha: str, distance: int) -> str | None:
    """The commit `distance` steps back on the first-parent line of `sha` (the oldest one if shorter)."""
    line = git(repo, "rev-list", "--first-parent", sha).split()
    if not line:
        return None
    return line[min(distance, len(line) - 1)]


def commit_info(repo: Path, sha: str) -> CommitInfo:
    out = git(repo, "show", "-s", "--format=%H%x00%s%x00%aI", sha)
    full, subject, date = out.split("\x00")
    m = _PR.search(subject)
    return CommitInfo(full, subject, int(m.group(1)) if m else None, date)


def ensure_clone(url: str, cache: Path) -> Path:
    """A local mirror of a remote repository, cloned once and fetched on later use."""
    cache.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").removesuffix(".git"))[-80:]
    target = cache / f"{name}.git"
    with FileLock(str(target) + ".lock"):
        if target.exists():
            git(target, "fetch", "--quiet", "--tags", "origin", "+refs/heads/*:refs/heads/*")
        else:
            done = subprocess.run(["git", "clone", "--quiet", "--bare", url, str(target)], capture_output=True,
                                  text=True, check=False)
            if done.returncode != 0:
                raise GitError(f"cannot clone {url}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return target
