"""Bisect over published releases: a local package index (a folder of wheels the test builds) holds
versions of a small fake `vllm` package; `install: pip` with `vllm=={commit}` installs each into its
own venv with real pip, and `sweep bisect --good A --bad C` walks the index's versions in order.

The fake package is a real wheel with a `vllm` console script that starts the simulator with the
behaviour its release declares (its own `sim.yaml`), so each version serves vLLM's API like the
real package would, and pip, the index listing and the environment cache are the real ones.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.drivers.bisect import BisectOptions, BisectScope, run_bisect
from sweeper.drivers.sweep import make_plan
from sweeper.errors import BisectError
from sweeper.install.history import history_for, index_versions
from sweeper.install.matrix_loader import load_matrix
from sweeper.reports.bisect import render
from sweeper.spec.matrix import Install

CLI = '''import os, sys
from pathlib import Path

PYTHON = {python!r}  # the simulator's interpreter


def main() -> None:
    # The simulator, with this release's declared behaviour: what `vllm serve` of this version does.
    os.environ["SWEEP_SIM_TREE"] = str(Path(__file__).parent)
    python = PYTHON
    os.execv(python, [python, "-m", "vllmsim", *sys.argv[1:]])
'''
BUG = {"id": "fsm", "effect": "fsm_whitespace", "when": {"json_schema": True}, "rate": 1.0}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(index: Path, version: str, sim: dict[str, Any]) -> Path:
    dist = f"vllm-{version}.dist-info"
    files = {
        "vllm/__init__.py": f'__version__ = "{version}"\n'.encode(),
        "vllm/cli.py": CLI.format(python=sys.executable).encode(),
        "vllm/sim.yaml": yaml.safe_dump({"version": version, "startup_s": 0.1, "token_latency_s": 0.0002,
                                         **sim}).encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sweep-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": b"[console_scripts]\nvllm = vllm.cli:main\n",
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = index / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("index")
    build_wheel(folder, "0.1.0", {})
    build_wheel(folder, "0.2.0", {"bugs": [BUG]})
    build_wheel(folder, "0.3.0", {"bugs": [BUG]})
    build_wheel(folder, "0.4.0rc1", {})  # a pre-release: not a candidate between two releases
    return folder


def matrix_file(tmp_path: Path, index: Path, suite: Path, extra: str = "") -> Path:
    path = tmp_path / "releases.yaml"
    path.write_text(f"""
name: releases
model: Qwen/Qwen3-8B
suite: {suite}
install:
  kind: pip
  packages: ["vllm=={{commit}}"]
  pip_args: ["--no-index", "--find-links", "{index}"]
{extra}
concurrency: 4
timeouts: {{startup_s: 60, request_s: 20}}
axes:
  commit: ["0.1.0", "0.3.0"]
""")
    return path


def test_the_index_lists_the_releases_in_version_order(index: Path) -> None:
    install = Install(kind="pip", packages=("vllm=={commit}",), pip_args=("--no-index", "--find-links", str(index)))
    assert index_versions("vllm", install) == ["0.1.0", "0.2.0", "0.3.0"]
    assert index_versions("vllm", install, pre=True) == ["0.1.0", "0.2.0", "0.3.0", "0.4.0rc1"]
    history = history_for(install, None, good="0.1.0", bad="0.3.0")
    assert history.range("0.1.0", "v0.3.0") == ["0.1.0", "0.2.0", "0.3.0"]
    with pytest.raises(BisectError, match=r"'0.2.5' is not a published version of vllm"):
        history.resolve("0.2.5")
    with pytest.raises(BisectError, match="newer than bad"):
        history.range("0.3.0", "0.1.0")


def test_a_versions_list_in_the_matrix_needs_no_index(tmp_path: Path, index: Path, tiny_suite: Path) -> None:
    path = matrix_file(tmp_path, tmp_path / "no-such-index", tiny_suite)
    data = yaml.safe_load(path.read_text())
    data["install"]["versions"] = ["0.3.0", "0.1.0", "0.2.0"]
    path.write_text(yaml.safe_dump(data))
    history = history_for(load_matrix(path).spec.install, None)
    assert history.range("0.1.0", "0.3.0") == ["0.1.0", "0.2.0", "0.3.0"]
    # The rows of a sweep over releases are keyed by the version itself.
    assert make_plan(path, tmp_path / "runs").shas == {"0.1.0": "0.1.0", "0.3.0": "0.3.0"}


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("ray_cluster")
def test_bisect_over_the_index_names_the_first_bad_release(tmp_path: Path, index: Path, tiny_suite: Path) -> None:
    path = matrix_file(tmp_path, index, tiny_suite)
    outcome = run_bisect(BisectScope(good="0.1.0", bad="0.3.0", matrix_path=path),
                         BisectOptions(parallel=2, runs_dir=tmp_path / "runs", run_id="b", cache_dir=tmp_path / "cache"))
    summary = outcome.summary
    (cell,) = summary["cells"]
    assert cell["bad_endpoint"] == "fails"
    (change,) = [c for c in cell["changes"] if c["found"]]
    assert change["commit"]["sha"] == "0.2.0" and change["direction"] == "regression"
    assert summary["range"]["good"] == "0.1.0" and summary["range"]["bad"] == "0.3.0"
    text = render(summary)
    assert "0.2.0" in text and "(vllm release)" in text
    # Each probed release ran its own installed version.
    cells = outcome.run.root / "cells"
    import pyarrow.parquet as pq

    versions = {r["commit_sha"]: r["vllm_version"] for f in cells.glob("*.parquet")
                for r in pq.read_table(f, columns=["commit_sha", "vllm_version"]).to_pylist()}
    assert versions == {v: v for v in versions} and set(versions) <= {"0.1.0", "0.2.0", "0.3.0"}
