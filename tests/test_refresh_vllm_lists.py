"""`scripts/refresh_vllm_lists.py` reads a release's lists out of its wheel by HTTP range requests,
without downloading or installing it: here a wheel built by the test, on a PEP 691 index served on
127.0.0.1 that answers byte ranges (as files.pythonhosted.org does)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent

ENVS = 'environment_variables: dict[str, object] = {\n    "VLLM_HOST_IP": lambda: "",\n' \
       '    "VLLM_BRAND_NEW_KNOB": lambda: 0,\n}\n'
PROTOCOL = "class OpenAIBaseModel:\n    pass\n\n\nclass ChatCompletionRequest(OpenAIBaseModel):\n" \
           "    messages: list[object]\n    model: str | None = None\n    brand_new_field: int = 0\n" \
           "    _private: int = 0\n"
CLI_ARGS = "class FrontendArgs:\n    host: str | None = None\n    enable_brand_new_route: bool = False\n\n\n" \
           "def make_arg_parser(parser):\n    parser.add_argument('--brand-new-served-flag', type=int)\n"
ARG_UTILS = "class EngineArgs:\n    max_model_len: int | None = None\n"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("refresh_vllm_lists", ROOT / "scripts" / "refresh_vllm_lists.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """(index URL, the Range headers the server was asked for)."""
    wheel = tmp_path / "vllm-9.9.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/envs.py", ENVS)
        z.writestr("vllm/entrypoints/openai/chat_completion/protocol.py", PROTOCOL)
        z.writestr("vllm/entrypoints/common/cli_args.py", CLI_ARGS)
        z.writestr("vllm/engine/arg_utils.py", ARG_UTILS)
        # Weight the wheel like a real one, so that reading it whole would show in the ranges asked.
        z.writestr("vllm/_C.abi3.so", bytes(range(256)) * 4096, compress_type=zipfile.ZIP_STORED)
    data = wheel.read_bytes()
    ranges: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

        def do_GET(self) -> None:
            if self.path.startswith("/simple/vllm/"):
                body = json.dumps({"files": [{"filename": wheel.name, "url": f"http://127.0.0.1:{port}/{wheel.name}"},
                                             {"filename": "vllm-9.8.0.tar.gz", "url": "unused"}]}).encode()
                self.send_response(200)
            else:
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                assert m, "the script asked for the whole wheel"
                ranges.append(m.group(0))
                body = data[int(m.group(1)):int(m.group(2)) + 1]
                self.send_response(206)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/simple", ranges
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_release_is_read_from_its_wheel_by_ranges(index: tuple[str, list[str]],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    url, ranges = index
    script = _load()
    assert script.main(["--index", url]) == 0  # the newest release on the index; nothing written
    out = capsys.readouterr().out
    assert out.startswith("vllm 9.9.0: 2 env names (1 new), 3 request fields (1 new), 4 serve flags (")
    assert "new env: VLLM_BRAND_NEW_KNOB\n" in out and "new request: brand_new_field\n" in out
    assert "--brand-new-served-flag" in out and "--enable-brand-new-route" in out and "--max-model-len" not in out
    fetched = sum(int(b) - int(a) + 1 for a, b in (r[6:].split("-") for r in ranges))
    assert fetched < 200_000, f"read {fetched} bytes of a 1 MB wheel"


def test_an_unknown_release_is_one_line(index: tuple[str, list[str]]) -> None:
    url, _ = index
    with pytest.raises(SystemExit, match=r"vllm 1\.0\.0: no wheel on .* \(newest: 9\.9\.0\)"):
        _load().main(["1.0.0", "--index", url])
