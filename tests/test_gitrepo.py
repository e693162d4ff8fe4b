"""gitrepo against real repositories built in tmp_path: no network."""

from __future__ import annotations

import http.server
import subprocess
import threading
from pathlib import Path

import pytest

from sweeper.errors import GitError
from sweeper.install import git as gitrepo


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": "2026-08-11T10:00:00+00:00",
           "GIT_COMMITTER_DATE": "2026-08-11T10:00:00+00:00", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _commit(repo: Path, subject: str, file: str = "f.txt") -> str:
    (repo / file).write_text(subject)
    _git(repo, "add", file)
    _git(repo, "commit", "-q", "-m", subject)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, str | Path]:
    """main: c0 .. c5 with a merged side branch after c3; tags v0.27.0 (c1), v0.28 (c4)."""
    path = tmp_path / "vllm"
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    shas = {f"c{i}": _commit(path, f"Change {i} (#{100 + i})") for i in range(4)}
    _git(path, "checkout", "-q", "-b", "side", "HEAD~1")
    shas["side"] = _commit(path, "Side work", "side.txt")
    _git(path, "checkout", "-q", "main")
    _git(path, "merge", "-q", "--no-ff", "-m", "Merge side (#200)", "side")
    shas["merge"] = _git(path, "rev-parse", "HEAD")
    shas["c4"] = _commit(path, "Change 4 (#104)")
    shas["c5"] = _commit(path, "No PR number here")
    _git(path, "tag", "v0.27.0", shas["c1"])
    _git(path, "tag", "-a", "-m", "release", "v0.28", shas["c4"])
    _git(path, "tag", "v0.28.0", shas["c3"])
    return {"path": path, **shas}


def test_resolve_refs_as_users_type_them(repo: dict) -> None:
    path = repo["path"]
    assert gitrepo.resolve(path, "v0.27") == repo["c1"]  # falls back to the release tag
    assert gitrepo.resolve(path, "0.27") == repo["c1"]
    assert gitrepo.resolve(path, "v0.28") == repo["c4"]  # an exact ref wins over v0.28.0
    assert gitrepo.resolve(path, "v0.27.0") == repo["c1"]
    assert gitrepo.resolve(path, "main") == repo["c5"]
    assert gitrepo.resolve(path, repo["c2"][:9]) == repo["c2"]
    assert gitrepo.resolve(path, repo["c2"]) == repo["c2"]


def test_unknown_ref_and_not_a_repo(repo: dict, tmp_path: Path) -> None:
    with pytest.raises(GitError, match=r"unknown ref 'v0.99'"):
        gitrepo.resolve(repo["path"], "v0.99")
    with pytest.raises(GitError, match="invalid ref"):
        gitrepo.resolve(repo["path"], "--all")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(GitError, match="is not a git repository"):
        gitrepo.resolve(plain, "main")
    with pytest.raises(GitError, match="no such directory"):
        gitrepo.resolve(tmp_path / "missing", "main")


def test_first_parent_range(repo: dict) -> None:
    path = repo["path"]
    shas = gitrepo.first_parent_range(path, "v0.27", "main")
    assert shas == [repo["c1"], repo["c2"], repo["c3"], repo["merge"], repo["c4"], repo["c5"]]
    infos = gitrepo.first_parent_commits(path, "v0.27", "v0.28")
    assert [i.sha for i in infos] == [repo["c1"], repo["c2"], repo["c3"], repo["merge"], repo["c4"]]
    assert [i.pr for i in infos] == [101, 102, 103, 200, 104]
    assert infos[0].author_date.year == 2026 and infos[0].date.startswith("2026-08-11")


def test_range_errors(repo: dict) -> None:
    path = repo["path"]
    with pytest.raises(GitError, match=r"good 'main' .* is not an ancestor of bad 'v0.27'"):
        gitrepo.first_parent_range(path, "main", "v0.27")
    with pytest.raises(GitError, match="not on the first-parent line"):
        gitrepo.first_parent_range(path, "side", "main")
    with pytest.raises(GitError, match="same commit"):
        gitrepo.first_parent_range(path, "v0.28", repo["c4"])


def test_commit_info_and_pr_numbers(repo: dict) -> None:
    info = gitrepo.commit_info(repo["path"], "v0.27")
    assert (info.sha, info.subject, info.pr) == (repo["c1"], "Change 1 (#101)", 101)
    assert gitrepo.commit_info(repo["path"], "main").pr is None
    assert gitrepo.pr_number("Fix foo (#44297)") == 44297
    assert gitrepo.pr_number("Revert (#12) partially") is None


def test_first_parent_ancestor_clamps(repo: dict) -> None:
    path = repo["path"]
    assert gitrepo.first_parent_ancestor(path, "main", 2) == repo["merge"]
    assert gitrepo.first_parent_ancestor(path, "main", 100) == repo["c0"]


def test_worktree_add_and_remove(repo: dict, tmp_path: Path) -> None:
    wt = gitrepo.worktree_add(repo["path"], "v0.27", tmp_path / "wt")
    assert (wt / "f.txt").read_text() == "Change 1 (#101)"
    gitrepo.worktree_remove(repo["path"], wt)
    assert not wt.exists()


def test_ensure_clone_from_a_local_url(repo: dict, tmp_path: Path) -> None:
    url = f"file://{repo['path']}"
    clone = gitrepo.ensure_clone(url, tmp_path / "cache")
    assert gitrepo.resolve(clone, "v0.27") == repo["c1"]
    new = _commit(repo["path"], "Later (#300)")
    assert gitrepo.ensure_clone(url, tmp_path / "cache") == clone
    assert gitrepo.resolve(clone, "main") == new
    assert gitrepo.is_url(url) and gitrepo.is_url("git@github.com:vllm-project/vllm.git")
    assert not gitrepo.is_url("/src/vllm")


class _AuthRequired(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="private"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.timeout(60)
def test_a_private_url_fails_at_once_and_never_prompts(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AuthRequired)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(GitError) as info:
            gitrepo.ensure_clone(f"http://127.0.0.1:{server.server_address[1]}/private.git", tmp_path / "cache")
    finally:
        server.shutdown()
        server.server_close()
    # git's own words for GIT_TERMINAL_PROMPT=0, in the C locale.
    assert "terminal prompts disabled" in str(info.value)
