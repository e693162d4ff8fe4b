"""Git, through `git` subprocesses: resolve refs the way users type them, list the
first-parent commits a bisect walks, read commit metadata, make worktrees, export a tree, and
keep a cached clone of a repository given as a URL.

The one place that runs git: every call has the C locale (messages are parsed into errors) and
no terminal prompt (a private URL fails instead of hanging a worker at a password prompt).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from sweeper.errors import GitError

_PR = re.compile(r"\(#(\d+)\)\s*$")
# `v0.27` means the v0.27.0 release when no ref is spelled exactly that way.
_SHORT_RELEASE = re.compile(r"^v?\d+\.\d+$")
# A URL (`https://`, `ssh://`, `git+ssh://`, `file://`, ...) or scp-like `user@host:path`.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|^[\w.-]+@[\w.-]+:")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    pr: int | None
    date: str  # ISO 8601 author date; a string so that the record stays JSON-able

    @property
    def author_date(self) -> datetime:
        """`date` as a datetime, for a caller that compares or formats it."""
        return datetime.fromisoformat(self.date)

    @property
    def short(self) -> str:
        return self.sha[:12]


def is_full_sha(ref: str) -> bool:
    return bool(_FULL_SHA.match(ref))


def pr_number(subject: str) -> int | None:
    """The PR number of a subject ending in `(#NNNN)`, as vLLM's squash merges do."""
    m = _PR.search(subject)
    return int(m.group(1)) if m else None


def _run(repo: Path | str, args: tuple[str, ...], *, text: bool) -> subprocess.CompletedProcess[Any]:
    # C locale: messages are parsed into errors; no prompt: a private URL must fail, not hang.
    env = {**os.environ, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=text, env=env,
                              stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed") from None


def _failed(repo: Path | str, args: tuple[str, ...], stderr: str | bytes) -> GitError:
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    last = (text.strip().splitlines() or ["failed"])[-1]
    return GitError(f"git {' '.join(args[:2])} in {repo}: {last}")


def _git(repo: Path | str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = _run(repo, args, text=True)
    if check and proc.returncode != 0:
        raise _failed(repo, args, proc.stderr)
    return proc


def git(repo: Path | str, *args: str) -> str:
    """Run git in `repo`; its stdout, stripped, or a one-line GitError."""
    return _git(repo, *args).stdout.strip()


def ensure_repo(repo: Path | str) -> Path:
    """The repository's path, or a GitError when it is not a git repository."""
    path = Path(repo)
    if not path.is_dir():
        raise GitError(f"{path}: no such directory")
    if _git(path, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise GitError(f"{path} is not a git repository")
    return path


def _try_resolve(repo: Path, ref: str) -> str | None:
    proc = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}",
                check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def resolve(repo: Path | str, ref: str) -> str:
    """The full sha of `ref`: a branch, tag, short or full sha; `v0.27` falls back to the
    `v0.27.0` tag when nothing is called `v0.27`."""
    path = ensure_repo(repo)
    if not ref or ref.startswith("-"):
        raise GitError(f"invalid ref {ref!r}")
    sha = _try_resolve(path, ref)
    if sha is None and _SHORT_RELEASE.match(ref):
        release = ref if ref.startswith("v") else f"v{ref}"
        sha = _try_resolve(path, f"refs/tags/{release}.0")
    if sha is None:
        raise GitError(f"unknown ref {ref!r} in {path} (not a branch, tag or commit)")
    return sha


def is_ancestor(repo: Path | str, older: str, newer: str) -> bool:
    return _git(repo, "merge-base", "--is-ancestor", older, newer, check=False).returncode == 0


_FORMAT = "%H%x00%s%x00%aI"


def _parse_log(text: str) -> list[CommitInfo]:
    out = []
    for line in text.splitlines():
        if not line:
            continue
        sha, subject, date = line.split("\x00")
        out.append(CommitInfo(sha, subject, pr_number(subject), date))
    return out


def commit_info(repo: Path | str, ref: str) -> CommitInfo:
    sha = resolve(repo, ref)
    return _parse_log(_git(repo, "show", "-s", f"--format={_FORMAT}", sha).stdout)[0]


def first_parent_range(repo: Path | str, good: str, bad: str) -> list[str]:
    """The bisect's candidates as full shas, oldest first: the good endpoint, then the
    first-parent commits after it up to and including the bad endpoint."""
    return [c.sha for c in first_parent_commits(repo, good, bad)]


def first_parent_commits(repo: Path | str, good: str, bad: str) -> list[CommitInfo]:
    """`first_parent_range` with each commit's metadata."""
    good_sha, bad_sha = resolve(repo, good), resolve(repo, bad)
    if good_sha == bad_sha:
        raise GitError(f"good {good!r} and bad {bad!r} are the same commit {good_sha[:12]}")
    if not is_ancestor(repo, good_sha, bad_sha):
        base = _git(repo, "merge-base", good_sha, bad_sha, check=False).stdout.strip()
        hint = f"; their merge base is {base[:12]}" if base else ""
        raise GitError(f"good {good!r} ({good_sha[:12]}) is not an ancestor of bad {bad!r} "
                       f"({bad_sha[:12]}){hint}")
    line = _git(repo, "rev-list", "--first-parent", bad_sha).stdout.split()
    if good_sha not in line:
        # Reachable only through a merged side branch: the first-parent walk would not
        # stop at good, so the candidates would not start at a known-good commit.
        raise GitError(f"good {good!r} ({good_sha[:12]}) is not on the first-parent line of "
                       f"bad {bad!r} ({bad_sha[:12]})")
    log = _git(repo, "log", "--first-parent", "--reverse", f"--format={_FORMAT}",
               f"{good_sha}..{bad_sha}").stdout
    return [commit_info(repo, good_sha), *_parse_log(log)]


def first_parent_ancestor(repo: Path | str, ref: str, distance: int) -> str | None:
    """The commit `distance` first-parent steps before `ref`, or the oldest one when the
    line is shorter: how a driver widens a bisect whose good endpoint already fails
    (double the distance from bad, try again)."""
    line = _git(repo, "rev-list", "--first-parent", resolve(repo, ref)).stdout.split()
    if not line:
        return None
    return line[min(distance, len(line) - 1)]


def worktree_add(repo: Path | str, sha: str, path: Path | str) -> Path:
    """A detached worktree of `sha` at `path` (which must not exist yet). Worktrees whose folders
    are gone (an environment removed by hand) are pruned first, so their paths can be reused."""
    full = resolve(repo, sha)
    _git(repo, "worktree", "prune", check=False)
    _git(repo, "worktree", "add", "--detach", "--force", str(path), full)
    return Path(path)


def worktree_remove(repo: Path | str, path: Path | str) -> None:
    _git(repo, "worktree", "remove", "--force", str(path))
    _git(repo, "worktree", "prune", check=False)


def is_url(source: str) -> bool:
    return bool(_URL.match(source))


def archive(repo: Path | str, ref: str) -> bytes:
    """The tree of `ref` as an uncompressed tar (`git archive`)."""
    args = ("archive", "--format=tar", resolve(repo, ref))
    proc = _run(repo, args, text=False)
    if proc.returncode != 0:
        raise _failed(repo, args, proc.stderr)
    return bytes(proc.stdout)


def ensure_clone(url: str, cache: Path | str) -> Path:
    """A bare clone of `url` under `cache`, cloned once and fetched on later use; a file
    lock keeps concurrent runs on one host from cloning into the same directory."""
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").removesuffix(".git"))[-80:]
    target = cache / f"{slug}.git"
    with FileLock(str(target) + ".lock"):
        if target.exists():
            # A failed fetch keeps the clone as it was: refs it already has still resolve, and one
            # it lacks fails later with its own message.
            _git(target, "fetch", "--quiet", "--prune", "--tags", "origin",
                 "+refs/heads/*:refs/heads/*", check=False)
        else:
            proc = _git(cache, "clone", "--quiet", "--bare", url, str(target), check=False)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
                raise GitError(f"cannot clone {url}: {last}")
    return target
