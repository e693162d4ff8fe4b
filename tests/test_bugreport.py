"""`sweep report --issue`: the vLLM bug template filled from a run. Its `vllm serve` line and `curl`
line are run against a live simulator at the same commit and reproduce the failure; planted tokens
appear nowhere."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from reportruns import TOKEN, TOKEN_AXIS
from typer.testing import CliRunner

from sweeper.cli import app
from sweeper.execute.server import ServerProcess, free_port
from sweeper.reports.bug import Redactor
from sweeper.store.run_folder import RunDir

# The shared runs, made once per session (a plugin: fixtures imported per module would run per module).
pytest_plugins = ["reportruns"]


def blocks(markdown: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)\n```", markdown, re.DOTALL)


def issue(run: RunDir, *extra: str) -> str:
    result = CliRunner().invoke(app, ["report", run.run_id, "--runs-dir", str(run.root.parent), "--issue", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def test_issue_holds_fingerprint_argv_and_a_curl_line_that_reproduces(secret_run: RunDir, tmp_path: Path) -> None:
    md = issue(secret_run)
    assert md.startswith("### Your current environment\n")
    assert "<details>" in md and "</details>" in md and "### 🐛 Describe the bug" in md
    sha = json.loads((secret_run.root / "manifest.json").read_text())["commits"]["main"]
    env_block = blocks(md, "text")[0]
    assert "vLLM version                 : 0.28.1.dev4" in env_block and f"vLLM commit                  : {sha}" in env_block
    assert "**Minimal failing configuration:** `spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1` → 20/20" in md
    # The report names the test explain ran (per-start counts, Holm), not a plain Fisher test.
    assert "(one-sided Fisher on per-start effective counts (beta-binomial dispersion), Holm-adjusted over " in md
    assert "- `VLLM_USE_V2_MODEL_RUNNER=0`: 0/20 fail — passes" in md and "- `spec_method=none`: 0/20 fail — passes" in md

    serve, curl = blocks(md, "bash")
    words = shlex.split(serve.replace("\\\n", " "))
    env = dict(w.split("=", 1) for w in words[:words.index("vllm")])
    argv = words[words.index("vllm"):]
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3.5-35B-A3B"]
    assert "--speculative-config" in argv and json.loads(argv[argv.index("--speculative-config") + 1]) == \
        {"method": "mtp", "num_speculative_tokens": 4}
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1" and env["HF_TOKEN"] == "<redacted>"
    assert curl.startswith("curl -sS http://127.0.0.1:8000/v1/chat/completions ")

    # Run both against the simulator at that commit: the failure comes back.
    tree = tmp_path / "tree"
    tree.mkdir()
    repo = secret_run.root.parent / ".cache" / "sim-demo"
    archive = subprocess.run(["git", "-C", str(repo), "archive", sha], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    port = free_port()
    argv = [sys.executable, "-m", "vllmsim", "serve", *argv[2:]]
    argv[argv.index("--port") + 1] = str(port)
    with ServerProcess(argv, {**env, "SWEEP_SIM_TREE": str(tree), "PATH": "/usr/bin:/bin"}, port=port,
                       log_path=tmp_path / "server.log", startup_timeout_s=60) as server:
        out = subprocess.run(["bash", "-c", curl.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert server.alive()
    reply = json.loads(out)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length" and not choice["message"].get("content")
    assert reply["usage"]["completion_tokens"] == 32
    assert "Tail of the content:" in md and "finish_reason `length`" in md and "20/20 such requests failed" in md


def test_issue_keeps_secrets_out_and_names_modes(secret_run: RunDir, tmp_path: Path) -> None:
    md = issue(secret_run, "--mode", "1")
    assert TOKEN not in md and TOKEN_AXIS not in md
    assert "SWEEP_TEST_SECRET_TOKEN='<redacted>'" in md and "HF_TOKEN='<redacted>'" in md
    assert "No bisect of this failure mode" in md
    result = CliRunner().invoke(app, ["report", secret_run.run_id, "--runs-dir", str(secret_run.root.parent),
                                      "--issue", "--mode", "whitespace"])
    assert result.exit_code != 0 and "matches no mode" in str(result.exception)


def test_redactor() -> None:
    r = Redactor({"env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstu", "VLLM_LOGGING_LEVEL": "DEBUG"},
                  "serve": {"--api-key": "s3cr3t-key", "--enable-auto-tool-choice": True}})
    assert r.env({"HF_TOKEN": "x", "VLLM_LOGGING_LEVEL": "DEBUG"}) == {"HF_TOKEN": "<redacted>",
                                                                       "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert r.argv(["vllm", "serve", "m", "--api-key", "k", "--enable-auto-tool-choice", "--hf-token=t"]) == \
        ["vllm", "serve", "m", "--api-key", "<redacted>", "--enable-auto-tool-choice", "--hf-token=<redacted>"]
    assert r.text("key s3cr3t-key and hf_abcdefghijklmnopqrstu, Bearer abc.def-123456") == \
        "key <redacted> and <redacted>, Bearer <redacted>"
    assert r.text("ghp_" + "a" * 36 + " sk-" + "b" * 20) == "<redacted> <redacted>"


def test_a_server_that_failed_is_a_bug_report_with_its_reason(tmp_path: Path, tiny_suite: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A serve-flag typo: no request is answered, the cells are `server_failed`; `--explain` has the
    mode and `--issue` reports it with the server's reason and command (it used to raise on the
    mode's missing samples)."""
    from conftest import make_sim_repo, run_cli

    from sweeper.drivers.sweep import run_matrix
    from sweeper.execute.choice import choose

    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("main", {})])
    path = tmp_path / "m.yaml"
    path.write_text(f"name: t\nmodel: m\nsuite: {tiny_suite}\ninstall: {{kind: sim, repo: {repo}}}\n"
                    "serve: {--reasoning-parsr: qwen3}\ntimeouts: {startup_s: 30, request_s: 10}\n"
                    "axes: {commit: [main], spec_method: [none, mtp]}\n")
    run_matrix(path, runs_dir=tmp_path / "runs", run_id="r", executor=choose("local"), cache_dir=tmp_path / "cache")
    code, out, err = run_cli(["report", "r", "--runs-dir", str(tmp_path / "runs"), "--explain"], capsys)
    assert code == 0 and "mode 1: server_failed  (2 of 2 server starts failed)" in out
    code, out, err = run_cli(["report", "r", "--runs-dir", str(tmp_path / "runs"), "--issue"], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert "**Failure mode:** `server_failed` — 2 failing server starts." in out
    assert "--reasoning-parsr is not offered; commit main has vLLM 0.27.0" in out
    assert "vllm serve m --host 127.0.0.1 --port 8000" in out and "--reasoning-parsr qwen3" in out
