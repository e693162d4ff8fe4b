"""Environments per commit: real git repositories, real uv venvs, a real local wheel index, real locks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from sweeper.errors import InstallError
from sweeper.install import cache as environments
from sweeper.install import git as gitrepo
from sweeper.install import steps
from sweeper.install.cache import Installed, clear, evict, in_use, list_environments, prepare
from sweeper.spec.matrix import Install

needs_uv = pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")

SETUP_PY = '''
from setuptools import setup
setup(name="vllm", version=open("VERSION").read().strip(), py_modules=["fake_vllm"],
      entry_points={"console_scripts": ["vllm=fake_vllm:main"]})
'''
MODULE = '''
import sys
VERSION = "{version}"
def main():
    print(VERSION)
'''


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture(scope="module")
def fake_vllm_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A pip-installable package with a `vllm` console script printing its version; three commits."""
    repo = tmp_path_factory.mktemp("fake-vllm")
    git(repo, "init", "-q", "-b", "main")
    (repo / "setup.py").write_text(SETUP_PY)
    shas = []
    for version in ("0.27.0", "0.28.0", "0.29.0"):
        (repo / "VERSION").write_text(version)
        (repo / "fake_vllm.py").write_text(MODULE.format(version=version))
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"release {version}")
        git(repo, "tag", f"v{version}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return repo, shas


@needs_uv
def test_source_kind_installs_the_commit_editable(fake_vllm_repo, tmp_path: Path) -> None:
    repo, shas = fake_vllm_repo
    install = Install(kind="source", repo=str(repo))
    first = prepare(install, "v0.27.0", None, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert first.sha == shas[0] and first.version == "0.27.0"
    assert Path(first.launch[0]).name == "vllm" and first.launch[1:] == ("serve",)
    assert subprocess.run([first.launch[0]], capture_output=True, text=True, check=False).stdout.strip() == "0.27.0"
    # A second commit is a second environment; the first one's worktree is untouched.
    second = prepare(install, shas[2], shas[2], base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert second.version == "0.29.0" and second.root != first.root
    assert subprocess.run([first.launch[0]], capture_output=True, text=True, check=False).stdout.strip() == "0.27.0"
    listed = {e.sha: e for e in list_environments(tmp_path / "cache")}
    assert set(listed) == {shas[0], shas[2]} and all(e.complete and e.size_bytes > 0 for e in listed.values())
    # Cached: the same request returns the same environment and installs nothing.
    log = (Path(first.root) / "install.log").read_text()
    assert prepare(install, "v0.27.0", None, base_dir=tmp_path, cache_dir=tmp_path / "cache") == first
    assert (Path(first.root) / "install.log").read_text() == log
    # clear by commit removes the worktree from git's list too.
    assert clear(tmp_path / "cache", commit=shas[0][:10]) == [Path(first.root).name]
    assert str(Path(first.root) / "src") not in git(repo, "worktree", "list")


def test_an_install_steps_scratch_stays_in_its_environment_and_goes_with_the_step(tmp_path: Path) -> None:
    # uv's build backend leaves lock files in the temp folder; on a shared node they would pile up there.
    root = tmp_path / "env"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    out = steps.run(["sh", "-c", 'touch "$TMPDIR/scratch-$$" && echo "$TMPDIR" && echo $$'], root,
                    env={**os.environ, "TMPDIR": str(tmp_path / "elsewhere")})
    scratch, pid = out.split()
    assert Path(scratch) == root / ".tmp"
    assert not (root / ".tmp").exists() and not any((tmp_path / "elsewhere").iterdir())
    assert not (Path(tempfile.gettempdir()) / f"scratch-{pid}").exists()


@needs_uv
def test_launch_override_names_the_environment_python(fake_vllm_repo, tmp_path: Path) -> None:
    repo, _ = fake_vllm_repo
    install = Install(kind="source", repo=str(repo), launch=("{python}", "-m", "fake_vllm", "--model"))
    env = prepare(install, "v0.28.0", None, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert env.launch[0] == env.python and env.launch[-1] == "--model"
    out = subprocess.run([*env.launch[:3]], capture_output=True, text=True, check=False).stdout
    assert out == ""  # the module has no __main__ block: it imports and exits cleanly


def _build_wheel(folder: Path, version: str) -> Path:
    """A minimal valid wheel of `vllm` with a console script (written by hand: no build backend needed)."""
    name = f"vllm-{version}-py3-none-any.whl"
    dist = f"vllm-{version}.dist-info"
    files = {
        "fake_vllm.py": MODULE.format(version=version),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": "[console_scripts]\nvllm = fake_vllm:main\n",
    }
    record = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", record)
    return folder / name


@needs_uv
def test_wheels_kind_uses_the_commits_index_and_refuses_a_missing_wheel(tmp_path: Path) -> None:
    sha = "a" * 40
    missing = "b" * 40
    index = tmp_path / "index"
    wheel = _build_wheel(index / sha / "vllm", f"0.30.0.dev5+g{sha[:9]}")
    (index / sha / "vllm" / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    install = Install(kind="wheels", index_url=index.as_uri())
    env = prepare(install, "main", sha, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert env.version == f"0.30.0.dev5+g{sha[:9]}" and env.sha == sha
    assert subprocess.run([env.launch[0]], capture_output=True, text=True, check=False).stdout.strip() == env.version
    with pytest.raises(InstallError, match=f"no vLLM wheel for commit {missing[:12]}"):
        prepare(install, "main", missing, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert [e.sha for e in list_environments(tmp_path / "cache")] == [sha]


@needs_uv
def test_concurrent_prepares_install_once(fake_vllm_repo, tmp_path: Path) -> None:
    repo, _ = fake_vllm_repo
    install = Install(kind="source", repo=str(repo))
    results: list[Installed] = []
    errors: list[Exception] = []

    def go() -> None:
        try:
            results.append(prepare(install, "v0.29.0", None, base_dir=tmp_path, cache_dir=tmp_path / "cache"))
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(results) == 3 and len(set(results)) == 1
    # Every installer step is logged once: the waiting prepares found the finished environment.
    log = (Path(results[0].root) / "install.log").read_text()
    assert log.count("worktree add") == 1 and log.count("pip install") == 1


def _fake_env(cache: Path, key: str, *, size: int, last_used: float) -> Path:
    root = cache / key
    root.mkdir(parents=True)
    (root / "blob").write_bytes(b"x" * size)
    (root / environments.META).write_text(json.dumps({"key": key, "kind": "sim", "commit": key, "sha": None,
                                                       "launch": ["x"], "created": last_used, "size_bytes": size}))
    os.utime(root / environments.META, (last_used, last_used))
    return root


def test_lru_eviction_skips_environments_in_use(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    now = time.time()
    oldest = _fake_env(cache, "oldest", size=1000, last_used=now - 300)
    busy = _fake_env(cache, "busy", size=1000, last_used=now - 200)
    middle = _fake_env(cache, "middle", size=1000, last_used=now - 100)
    newest = _fake_env(cache, "newest", size=1000, last_used=now)
    user = Installed(commit="busy", sha=None, kind="preinstalled", launch=("x",), root=str(busy))
    with in_use(user):
        assert [e.key for e in list_environments(cache) if e.in_use] == ["busy"]
        removed = evict(cache, max_bytes=2500, keep={"newest"})
    # Least recently used first; "busy" is older than "middle" but serves a cell: kept.
    assert removed == ["oldest", "middle"]
    assert not oldest.exists() and not middle.exists() and busy.exists() and newest.exists()
    # Once released it can go.
    assert evict(cache, max_bytes=1000, keep={"newest"}) == ["busy"]
    assert clear(cache, older_than=3600) == [] and clear(cache) == ["newest"]


def test_eviction_skips_an_environment_being_installed(tmp_path: Path) -> None:
    import filelock

    cache = tmp_path / "cache"
    _fake_env(cache, "installing", size=1000, last_used=time.time() - 100)
    with filelock.FileLock(str(environments._lock_path(cache, "installing"))):
        assert evict(cache, max_bytes=0) == []
    assert evict(cache, max_bytes=0) == ["installing"]


@pytest.fixture
def sim_repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "simrepo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "sim.yaml").write_text('version: "0.27.0"\n')
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "good")
    good = git(repo, "rev-parse", "HEAD")
    (repo / "sim.yaml").write_text('version: "0.27.1.dev3"\ninstall: "fail: no wheel for this commit (CUDA 13 only)"\n')
    git(repo, "commit", "-q", "-am", "broken install")
    return repo, good, git(repo, "rev-parse", "HEAD")


def test_sim_kind_materialises_the_tree_and_reports_install_failures(sim_repo, tmp_path: Path) -> None:
    _, good, bad = sim_repo
    install = Install(kind="sim", repo="simrepo")  # relative to the matrix folder
    env = prepare(install, good[:8], None, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert env.sha == good and env.version == "0.27.0"
    assert env.launch == (sys.executable, "-m", "vllmsim", "serve")
    tree = Path(env.env["SWEEP_SIM_TREE"])
    assert (tree / "sim.yaml").read_text() == 'version: "0.27.0"\n' and not (tree / ".git").exists()
    with pytest.raises(InstallError, match=r"failed: no wheel for this commit \(CUDA 13 only\)"):
        prepare(install, "main", bad, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    # A failed install leaves nothing behind; the good one stays.
    assert [e.sha for e in list_environments(tmp_path / "cache")] == [good]


def test_a_repository_url_is_cloned_once_per_node_by_gitrepo(sim_repo, tmp_path: Path) -> None:
    _, good, _ = sim_repo
    url = (tmp_path / "simrepo").resolve().as_uri()
    install = Install(kind="sim", repo=url)
    env = prepare(install, "main~1", None, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert env.sha == good and env.version == "0.27.0"
    clones = list((tmp_path / "cache" / ".repos").glob("*.git"))
    assert len(clones) == 1 and (clones[0] / "HEAD").exists()
    # The node's clone is the one `sweep matrix` makes on the driver (gitrepo.ensure_clone).
    assert gitrepo.ensure_clone(url, tmp_path / "cache" / ".repos") == clones[0]


def test_sim_without_repo_is_the_latest_simulator(tmp_path: Path) -> None:
    env = prepare(Install(kind="sim"), "main", None, base_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert env.env == {} and env.launch[-2:] == ("vllmsim", "serve")


def test_preinstalled_finds_the_python_and_its_vllm(fake_vllm_repo, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    dist = site / "vllm-0.31.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.2\n")
    env = prepare(Install(kind="preinstalled", python=str(venv)), "installed", None, base_dir=tmp_path,
                  cache_dir=tmp_path / "cache")
    assert env.version == "0.31.2" and env.python == str(venv / "bin" / "python")
    # No console script in this venv: the module form of the vllm CLI is used.
    assert env.launch == (env.python, "-m", "vllm.entrypoints.cli.main", "serve")
