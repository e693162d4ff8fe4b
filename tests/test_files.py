"""Atomic writes and per-environment caches: real files, real subprocesses standing in for vLLM."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweeper.errors import ConfigError
from sweeper.execute import fingerprint
from sweeper.install.cache import Installed
from sweeper.install.supported import supported_flags
from sweeper.store import files

HELP = "usage: vllm serve [-h] [--port PORT] [--max-model-len MAX_MODEL_LEN]\n"


def script(path: Path, body: str) -> str:
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "meta.json"
    files.write_json(target, {"a": 1})
    with pytest.raises(RuntimeError), files.replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_concurrent_writers_never_share_a_temporary(tmp_path: Path) -> None:
    target = tmp_path / "x.txt"
    with files.replacing(target) as first, files.replacing(target) as second:
        assert first != second and first.parent == second.parent == tmp_path
        first.write_text("first")
        second.write_text("second")
    assert target.read_text() == "first"  # the outer block ends last: its file is the one left


def test_a_fingerprint_probe_that_times_out_is_not_cached(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    slow = script(tmp_path / "slow", "time.sleep(30)")
    got = fingerprint.fingerprint(Installed(commit="c", sha=None, kind="preinstalled", launch=("x",), python=slow, root=str(root)),
                                  timeout=0.5)
    assert got.torch_version is None and not (root / fingerprint.CACHE_FILE).exists()
    broken = script(tmp_path / "broken", "sys.exit(3)")
    fingerprint.fingerprint(Installed(commit="c", sha=None, kind="preinstalled", launch=("x",), python=broken, root=str(root)))
    assert not (root / fingerprint.CACHE_FILE).exists()
    # The next group asks again, and a good answer is kept.
    good = script(tmp_path / "good", 'print(\'{"torch": "2.9.0", "cuda": "13.0"}\')')
    got = fingerprint.fingerprint(Installed(commit="c", sha=None, kind="preinstalled", launch=("x",), python=good, root=str(root)))
    assert got.torch_version == "2.9.0"
    assert json.loads((root / fingerprint.CACHE_FILE).read_text()) == {"torch": "2.9.0", "cuda": "13.0"}


def test_a_help_that_fails_or_times_out_is_not_cached(tmp_path: Path) -> None:
    root = tmp_path / "env"
    root.mkdir()
    slow = script(tmp_path / "slow", "time.sleep(30)")
    with pytest.raises(ConfigError, match="timed out"):
        supported_flags(Installed(commit="c", sha=None, kind="preinstalled", launch=(slow,), root=str(root)), timeout=0.5)
    failing = script(tmp_path / "failing", "print('ImportError: no torch'); sys.exit(1)")
    with pytest.raises(ConfigError, match="no --port flag"):
        supported_flags(Installed(commit="c", sha=None, kind="preinstalled", launch=(failing,), root=str(root)))
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == []
    good = script(tmp_path / "good", f"print({HELP!r})")
    assert "--max-model-len" in supported_flags(Installed(commit="c", sha=None, kind="preinstalled", launch=(good,), root=str(root)))
    assert (root / "flags.json").exists()


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("uri", [False, True], ids=["folder", "file-uri"])
def test_every_file_of_a_run_is_readable_as_the_umask_says(tmp_path: Path, uri: bool) -> None:
    """A shared runs folder or a served report: under umask 022 each file the store writes is 0644,
    as a plain write would make it (not the 0600 of a temporary file)."""
    from sweeper.spec.matrix import canonical
    from sweeper.store.manifest import SweepManifest
    from sweeper.store.run_folder import CELL_SCHEMA, SAMPLE_SCHEMA, RunDir, table

    root = tmp_path / "runs" / "r"
    run = RunDir(f"file://{root}" if uri else root)
    run.write_manifest(SweepManifest(run_id="r", matrix={"axes": {}}))
    common = {"run_id": "r", "group_id": "g", "cell_id": "c", "server_key": "g", "commit": "v1",
              "axes": [("commit", canonical("v1"))]}
    run.write_group("g", table([{**common, "case_id": "a", "repeat": 0, "passed": True}], SAMPLE_SCHEMA),
                    table([{**common, "status": "ok", "n_samples": 1, "n_failed": 0}], CELL_SCHEMA))
    run.write_log("c", "log line\n")
    run.write_json("bisect.json", {"a": 1})
    files.write_text(root / "report.html", "<p>")
    written = sorted(p for p in root.rglob("*") if p.is_file())
    assert {p.relative_to(root).as_posix() for p in written} >= {
        "manifest.json", "catalogue.json", "samples/g.parquet", "cells/g.parquet", "logs/c.log", "bisect.json",
        "report.html"}
    assert {p.relative_to(root).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == \
        {p.relative_to(root).as_posix(): "0o644" for p in written}


def test_an_atomic_write_follows_a_stricter_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        files.write_text(tmp_path / "private.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "private.txt").stat().st_mode) == 0o600
