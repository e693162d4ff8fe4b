"""Pure parsing of what vLLM prints: help text, start-up logs, per-request lines, /metrics.

The data files are logs and help of the real vLLM 0.32.0 CPU build (`tests/data/vllm/`; paths
shortened), so these tests pin the parsers to real lines without starting anything.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from sweeper.errors import ConfigError
from sweeper.execute import server_metrics as metrics
from sweeper.install.cache import Installed
from sweeper.spec.matrix import Install, MatrixFile, make_cell
from sweeper.vllm import (
    FlagSet,
    diff,
    effective_config,
    error_lines,
    failure_reason,
    non_default_args,
    parse_help,
    request_log_lines,
    serve_command,
)
from sweeper.vllm.logs import LogIndex

DATA = Path(__file__).parent / "data" / "vllm"


def real(name: str) -> str:
    return (DATA / name).read_text()


def cell(**axes: Any):
    spec = MatrixFile(model="m", suite="s.yaml", install=Install(kind="sim"),
                      axes={k: [v] for k, v in axes.items()},
                      spec_config={"ngram": {"prompt_lookup_max": 3}})
    return make_cell(spec, axes, list(axes))


INSTALLED = Installed(commit="v0.32.0", sha=None, kind="preinstalled", version="0.32.0",
                      launch=("/env/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model"),
                      env={"VLLM_CACHE_ROOT": "/c"})


# --- help ---------------------------------------------------------------------------------------

def test_help_of_the_real_cpu_build_lists_the_flags_the_sweeper_uses() -> None:
    flags = parse_help(real("cpu-0.32.0-help.txt"))
    for flag in ("--speculative-config", "--async-scheduling", "--no-async-scheduling", "--attention-backend",
                 "--structured-outputs-config", "--reasoning-parser", "--tool-strict-level", "--port",
                 "--max-model-len", "--enforce-eager", "--no-enforce-eager", "--api-key", "--model"):
        assert flag in flags, flag
    assert "--help" not in flags and len(flags.flags) > 300
    assert flags.choices["--tool-strict-level"] == ("auto", "function", "parameter")
    # "{...} or name registered in --tool-parser-plugin" is open-ended: no closed choice list.
    assert "--tool-call-parser" not in flags.choices
    assert "--tool_strict_level" in flags  # vLLM accepts underscores


def test_help_option_lines_with_aliases() -> None:
    text = ("options:\n  -h, --help            show this help\n"
            "  --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE\n"
            "  --async-scheduling, --no-async-scheduling\n")
    assert parse_help(text).flags == {"--tensor-parallel-size", "--async-scheduling", "--no-async-scheduling"}


# --- serve command --------------------------------------------------------------------------------

def test_serve_command_renders_every_kind_of_value() -> None:
    c = cell(spec_method="ngram", num_speculative_tokens=3, async_scheduling=False, attention_backend="FLASH_ATTN",
             **{"serve.--enforce-eager": True, "serve.--max-model-len": 512,
                "serve.--structured-outputs-config": {"backend": "xgrammar", "disable_any_whitespace": True},
                "env.VLLM_CPU_KVCACHE_SPACE": "1"})
    launch = serve_command(c, model="/models/tiny", spec_config={"ngram": {"prompt_lookup_max": 3}},
                           installed=INSTALLED, host="127.0.0.1", port=8000, api_key="k",
                           supported=parse_help(real("cpu-0.32.0-help.txt")))
    argv = list(launch.argv)
    # The launch ends in --model: the model is that flag's value.
    assert argv[:6] == [*INSTALLED.launch, "/models/tiny", "--host"]
    assert argv[argv.index("--speculative-config") + 1] == json.dumps(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, separators=(",", ":"))
    assert "--no-async-scheduling" in argv and "--async-scheduling" not in argv
    assert argv[argv.index("--attention-backend") + 1] == "FLASH_ATTN"
    assert argv[argv.index("--enforce-eager") + 1].startswith("--")  # a bare flag
    assert argv[argv.index("--max-model-len") + 1] == "512"
    assert json.loads(argv[argv.index("--structured-outputs-config") + 1]) == {
        "backend": "xgrammar", "disable_any_whitespace": True}
    assert argv[argv.index("--api-key") + 1] == "k"
    assert launch.env == {"VLLM_CACHE_ROOT": "/c", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_a_missing_flag_is_refused_before_any_server_starts() -> None:
    old = FlagSet(frozenset({"--port", "--host", "--api-key", "--speculative-config"}), version="0.29.0")
    c = cell(**{"serve.--tool-strict-level": "parameter"})
    with pytest.raises(ConfigError, match=r"--tool-strict-level needs vLLM >= 0\.31; commit main has vLLM 0\.29\.0"):
        serve_command(c, model="m", spec_config=None, installed=INSTALLED, host="h", port=1, api_key=None,
                      supported=old)


def test_renamed_flags_are_translated_for_old_versions() -> None:
    old = FlagSet(frozenset({"--port", "--host", "--async-scheduling", "--guided-decoding-backend",
                             "--guided-decoding-disable-any-whitespace"}), version="0.9.2")
    c = cell(async_scheduling=False, attention_backend="FLASHINFER",
             **{"serve.--structured-outputs-config": {"backend": "xgrammar", "disable_any_whitespace": True}})
    launch = serve_command(c, model="m", spec_config=None, installed=INSTALLED, host="h", port=1, api_key=None,
                           supported=old)
    assert launch.env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"
    assert "--attention-backend" not in launch.argv and "--no-async-scheduling" not in launch.argv
    tail = list(launch.argv[launch.argv.index("--port") + 2:])
    assert tail == ["--guided-decoding-backend", "xgrammar", "--guided-decoding-disable-any-whitespace"]


def test_a_value_outside_the_versions_choices_is_refused() -> None:
    c = cell(**{"serve.--tool-strict-level": "everything"})
    with pytest.raises(ConfigError, match="not one of auto, function, parameter"):
        serve_command(c, model="m", spec_config=None, installed=INSTALLED, host="h", port=1, api_key=None,
                      supported=parse_help(real("cpu-0.32.0-help.txt")))


# --- effective configuration ------------------------------------------------------------------------

def test_effective_config_of_a_real_ngram_server() -> None:
    eff = effective_config(real("cpu-0.32.0-ngram.log"))
    assert eff.version == "0.32.0" and eff.device == "cpu"
    assert (eff.spec_method, eff.num_speculative_tokens) == ("ngram", 3)
    assert eff.async_scheduling is False  # "Async scheduling not supported with ngram-based ..."
    assert eff.model_runner == "V1"  # "Model Runner V2 requires Triton; using the V1 model runner instead."
    assert eff.attention_backend == "CPU_ATTN"  # "Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU."
    assert (eff.structured_outputs_backend, eff.disable_any_whitespace, eff.reasoning_parser) == (
        "xgrammar", True, "qwen3")
    requested = cell(spec_method="ngram", num_speculative_tokens=3, attention_backend="FLASH_ATTN",
                     **{"serve.--reasoning-parser": "qwen3"})
    assert diff(requested, eff) == {"attention_backend": ("FLASH_ATTN", "CPU_ATTN")}


def test_async_requested_on_cpu_is_silently_off() -> None:
    text = real("cpu-0.32.0-async.log")
    assert non_default_args(text)["async_scheduling"] is True
    eff = effective_config(text)
    assert eff.async_scheduling is False and eff.spec_method == "none" and eff.attention_backend == "CPU_ATTN"
    assert diff(cell(async_scheduling=True, attention_backend="CPU_ATTN"), eff) == {
        "async_scheduling": (True, False)}


def test_refused_start_gives_vllms_message() -> None:
    assert failure_reason(real("cpu-0.32.0-refused.log")) == (
        "ValueError: Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU/"
        "DSpark/DFlash kind of speculative decoding")
    assert failure_reason(real("cpu-0.32.0-ngram.log")) is None


def test_gpu_style_lines() -> None:
    log = "(APIServer pid=1) INFO 11-29 08:00:00 [api_server.py:1885] vLLM API server version 0.28.1rc1.dev130+g44fe2a392\n(EngineCore_DP0 pid=2) INFO 11-29 08:00:01 [core.py:93] Initializing a V1 LLM engine (v0.28.1rc1.dev130+g44fe2a392) with config: model='Q', speculative_config=SpeculativeConfig(method='mtp', model='Q', num_spec_tokens=4), device_config=cuda, structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, reasoning_parser='qwen3'), seed=0\n(EngineCore_DP0 pid=2) INFO 11-29 08:00:02 [gpu_worker.py:518] Using V2 Model Runner\n(EngineCore_DP0 pid=2) INFO 11-29 08:00:02 [cuda.py:506] Using FLASHINFER attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER']."
    eff = effective_config(log)
    assert eff.version == "0.28.1rc1.dev130+g44fe2a392"
    assert (eff.model_runner, eff.attention_backend, eff.spec_method, eff.num_speculative_tokens) == (
        "V2", "FLASHINFER", "mtp", 4)
    assert eff.async_scheduling is True  # the default since 0.14, no warning printed


# --- per-request lines ------------------------------------------------------------------------------

REQUEST_LOG = [
    "(APIServer pid=8) INFO 11-29 08:16:39 [request_logger.py:65] Received request chatcmpl-rq-1: params: ...",
    "(APIServer pid=8) INFO 11-29 08:16:39 [async_llm.py:578] Added request chatcmpl-rq-1-94bfdfc6.",
    "(APIServer pid=8) INFO 11-29 08:16:40 [async_llm.py:578] Added request chatcmpl-rq-10-afc1ec0c.",
    ("(EngineCore pid=9) ERROR 11-29 08:16:41 [backend_xgrammar.py:167] Failed to advance FSM for request "
    "chatcmpl-rq-1-94bfdfc6 for tokens 71093. Please file an issue."),
    ("(EngineCore pid=9) ERROR 11-29 08:16:42 [backend_xgrammar.py:167] Failed to advance FSM for request "
    "chatcmpl-rq-10-afc1ec0c for tokens 2164. Please file an issue."),
]


def test_request_lines_match_the_id_exactly() -> None:
    assert [ln[-40:] for ln in request_log_lines(REQUEST_LOG, "rq-1")] == [ln[-40:] for ln in REQUEST_LOG[:2]] + [
        REQUEST_LOG[3][-40:]]
    assert request_log_lines(REQUEST_LOG, "chatcmpl-rq-10") == [REQUEST_LOG[2], REQUEST_LOG[4]]
    assert error_lines(REQUEST_LOG, "rq-1") == [REQUEST_LOG[3]]
    assert len(error_lines(REQUEST_LOG)) == 2
    assert request_log_lines(REQUEST_LOG, "other", {"id": "chatcmpl-rq-10"}) == [REQUEST_LOG[2], REQUEST_LOG[4]]


def test_log_index_finds_the_same_lines_as_the_scan() -> None:
    """The one-pass index and the per-request regex scan agree on every line, for ids with prefixes,
    engine suffixes, dots, neighbours that share a prefix, and ids the index cannot hold."""
    index = LogIndex(REQUEST_LOG)
    for rid in ("rq-1", "chatcmpl-rq-10", "rq-10-afc1ec0c", "rq", "other"):
        assert index.lines_for(rid) == request_log_lines(REQUEST_LOG, rid)
    assert index.lines_for("other", {"id": "chatcmpl-rq-10"}) == request_log_lines(
        REQUEST_LOG, "other", {"id": "chatcmpl-rq-10"})

    rng = random.Random(7)
    ids = ["a", "a-1", "a-1-2", "a.b", "x.a", "a.b.c", "cmpl-a", "q_9", "é-1", "a.b.c.d.e.f.g.h.i.j", "a:b", ""]
    words = ["chatcmpl-", "cmpl-", "-", ".", ":", " ", "'", "=", "-0123abcd", "-0123ABCD", "-deadbeef9", "x", "", "\t"]
    lines = []
    for _ in range(400):
        parts = [rng.choice(words + ids) for _ in range(rng.randint(1, 8))]
        lines.append("INFO 11-29 08:16:40 [x.py:1] " + "".join(parts))
    # Whole, fed in pieces as a log grows, and with hints (only runs holding one are indexed; ids
    # without a hint go to a full index built on demand): the same lines every time.
    grown = LogIndex(hints=("a-", ".b"))
    for start in range(0, len(lines), 37):
        grown.add(lines[start:start + 37])
    for index in (LogIndex(lines), LogIndex(lines, hints=("a-1",)), grown):
        for rid in [*ids, "chatcmpl-a", "cmpl-a-1", "a-0123abcd"]:
            assert index.lines_for(rid) == request_log_lines(lines, rid), rid
            assert index.lines_for("zz", {"id": rid}) == request_log_lines(lines, "zz", {"id": rid}), rid


# --- metrics --------------------------------------------------------------------------------------

SCRAPE = """# HELP vllm:spec_decode_num_drafts_total x
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} %(drafts)s
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens_total x
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} %(draft_tokens)s
# HELP vllm:spec_decode_num_accepted_tokens_total x
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} %(accepted)s
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total x
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} %(p0)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} %(p1)s
# HELP vllm:request_success_total x
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} %(stop)s
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} %(length)s
"""


def test_metrics_difference_gives_the_groups_figures() -> None:
    before = SCRAPE % {"drafts": 2, "draft_tokens": 4, "accepted": 3, "p0": 2, "p1": 1, "stop": 1, "length": 0}
    after = SCRAPE % {"drafts": 12, "draft_tokens": 24, "accepted": 9, "p0": 8, "p1": 3, "stop": 3, "length": 2}
    m = metrics.group_metrics(before, after)
    assert (m.drafts, m.draft_tokens, m.accepted_tokens) == (10, 20, 6)
    assert m.acceptance_rate == pytest.approx(0.3) and m.mean_acceptance_length == pytest.approx(1.6)
    assert m.accepted_per_position == pytest.approx((0.6, 0.2))
    assert m.finished == {"stop": 2, "length": 2}
    assert metrics.group_metrics("", before).columns()["spec_drafts"] == 2
    none = metrics.group_metrics("", "")
    assert none.acceptance_rate is None and none.mean_acceptance_length is None
