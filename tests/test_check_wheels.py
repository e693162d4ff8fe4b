"""`sweep matrix FILE --check-wheels`: each commit's wheel asked of the index for the matrix's variant,
against a local index laid out like wheels.vllm.ai (`<sha>/<variant>/vllm/`) on 127.0.0.1."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli

PRESENT = ["1" * 40, "2" * 40]
ABSENT = "3" * 40
OTHER_VARIANT = "4" * 40  # a wheel of another variant only


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = tmp_path / "index"
    for sha, variant in [*((s, "cu130") for s in PRESENT), (OTHER_VARIANT, "cu129")]:
        pkg = root / sha / variant / "vllm"
        pkg.mkdir(parents=True)
        wheel = f"vllm-0.28.1.dev4+g{sha[:9]}-cp38-abi3-manylinux1_x86_64.whl"
        (pkg / "index.html").write_text(f'<a href="../../{wheel}">{wheel}</a>\n')
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _matrix(tmp_path: Path, tiny_suite: Path, index: str, commits: list[str], kind: str = "wheels") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"""
name: wheels
model: Qwen/Qwen3-8B
suite: {tiny_suite}
install: {{kind: {kind}, index_url: "{index}", variant: cu130}}
axes:
  commit: [{", ".join(repr(c) for c in commits)}]
  spec_method: [none, mtp]
""")
    return path


def test_each_commit_is_found_or_missing_and_a_missing_one_exits_1(
        tmp_path: Path, tiny_suite: Path, index: str, capsys: pytest.CaptureFixture[str]) -> None:
    m = _matrix(tmp_path, tiny_suite, index, [*PRESENT, ABSENT, OTHER_VARIANT])
    code, out, err = run_cli(["matrix", str(m), "--dry-run", "--check-wheels", "--runs-dir", str(tmp_path / "runs")],
                             capsys)
    assert code == 1
    lines = [line for line in out.splitlines() if line.startswith("wheel for ")]
    assert lines == [
        f"wheel for {PRESENT[0]}, variant cu130: found at {index}/{PRESENT[0]}/cu130/vllm/",
        f"wheel for {PRESENT[1]}, variant cu130: found at {index}/{PRESENT[1]}/cu130/vllm/",
        f"wheel for {ABSENT}, variant cu130: missing at {index}/{ABSENT}/cu130/vllm/ (HTTP 404)",
        f"wheel for {OTHER_VARIANT}, variant cu130: missing at {index}/{OTHER_VARIANT}/cu130/vllm/ (HTTP 404)",
    ]
    assert err.splitlines()[-1] == (
        f"error: 2 of 4 commits have no wheel on the index ({ABSENT}, {OTHER_VARIANT}); a fresh commit's wheel "
        "can take an hour to appear, or try another install.variant")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_every_wheel_there_is_exit_0(tmp_path: Path, tiny_suite: Path, index: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    m = _matrix(tmp_path, tiny_suite, index, PRESENT)
    code, out, err = run_cli(["matrix", str(m), "--dry-run", "--check-wheels"], capsys)
    assert (code, err) == (0, "")
    assert sum(line.endswith("/cu130/vllm/") and ": found at " in line for line in out.splitlines()) == 2


def test_a_kind_without_an_index_is_one_line(tmp_path: Path, tiny_suite: Path, index: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    m = _matrix(tmp_path, tiny_suite, index, ["main"], kind="preinstalled")
    code, out, err = run_cli(["matrix", str(m), "--dry-run", "--check-wheels"], capsys)
    assert (code, out) == (1, "")
    assert err == ("error: --check-wheels: install kind preinstalled installs no per-commit wheels, so there is no index "
                   "to ask (--check-wheels is for install kind wheels)\n")
