"""The `vllm serve` argument parser of the simulated version.

Mimics vLLM's FlexibleArgumentParser: `--flag_name` means `--flag-name`, `--x.y v` sets key y
of the JSON flag `--x`, unknown flags end the process with argparse's usage error (exit 2), and
the flags offered depend on the version (the product learns them from `vllm serve --help`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

PROG = "vllm serve"
# Flags that take a JSON object and also accept vLLM's dotted form `--name.key value`.
JSON_FLAGS = (
    "speculative-config",
    "structured-outputs-config",
    "attention-config",
    "compilation-config",
    "hf-overrides",
    "kv-transfer-config",
    "override-generation-config",
    "limit-mm-per-prompt",
)

# Real `vllm serve` flags the simulator accepts and ignores: (flag, takes a value).
_PASSIVE: tuple[tuple[str, bool], ...] = (
    ("--trust-remote-code", False),
    ("--tokenizer", True),
    ("--revision", True),
    ("--download-dir", True),
    ("--load-format", True),
    ("--quantization", True),
    ("--kv-cache-dtype", True),
    ("--block-size", True),
    ("--max-num-batched-tokens", True),
    ("--swap-space", True),
    ("--cpu-offload-gb", True),
    ("--pipeline-parallel-size", True),
    ("--data-parallel-size", True),
    ("--distributed-executor-backend", True),
    ("--chat-template", True),
    ("--chat-template-content-format", True),
    ("--response-role", True),
    ("--generation-config", True),
    ("--max-logprobs", True),
    ("--uvicorn-log-level", True),
    ("--allowed-origins", True),
    ("--root-path", True),
    ("--mm-processor-kwargs", True),
    ("--tokenizer-mode", True),
    ("--disable-log-stats", False),
    ("--enable-log-requests", False),
    ("--disable-log-requests", False),
    ("--disable-uvicorn-access-log", False),
    ("--disable-frontend-multiprocessing", False),
    ("--enable-prompt-tokens-details", False),
    ("--enable-force-include-usage", False),
    ("--enable-expert-parallel", False),
    ("--enable-chunked-prefill", False),
)


def build_parser(release: tuple[int, int, int]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Start the vLLM OpenAI-compatible API server.")
    p.add_argument("model_tag", nargs="?", default=None, help="The model tag to serve.")
    p.add_argument("--model", default=None, help="Name or path of the Hugging Face model to use.")
    p.add_argument("--host", default=None, help="Host name.")
    p.add_argument("--port", type=int, default=8000, help="Port number.")
    p.add_argument("--api-key", default=None, help="If provided, the server requires this key in the header.")
    p.add_argument("--served-model-name", nargs="+", default=None, help="The model name(s) used in the API.")
    p.add_argument(
        "--speculative-config",
        type=_json_object,
        default=None,
        help="Speculative decoding configuration (JSON).",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Overlap CPU scheduling with GPU execution (default on).",
    )
    p.add_argument("--attention-backend", default=None, help="Attention backend to use.")
    p.add_argument(
        "--attention-config", type=_json_object, default=None, help="Attention configuration (JSON)."
    )
    p.add_argument("--reasoning-parser", default=None, help="Parser that extracts reasoning content.")
    p.add_argument("--enable-auto-tool-choice", action="store_true", help="Let the model choose tools.")
    p.add_argument("--tool-call-parser", default=None, help="Parser that extracts tool calls.")
    if release >= (0, 31, 0):
        p.add_argument(
            "--tool-strict-level",
            choices=["auto", "function", "parameter"],
            default=None,
            help="How strictly tool calls are constrained to their schema.",
        )
    p.add_argument(
        "--structured-outputs-config",
        type=_json_object,
        default=None,
        help="Structured outputs configuration (JSON).",
    )
    p.add_argument("--max-model-len", type=_human_int, default=None, help="Model context length.")
    p.add_argument("--dtype", default="auto", help="Data type for model weights and activations.")
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Always use eager-mode PyTorch.",
    )
    p.add_argument(
        "--tensor-parallel-size", "-tp", type=int, default=1, help="Number of tensor parallel groups."
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="Fraction of GPU memory to use.")
    p.add_argument("--seed", type=int, default=0, help="Random seed.")
    p.add_argument(
        "--max-num-seqs", type=int, default=None, help="Maximum number of sequences per iteration (default 256)."
    )
    for json_flag in (
        "--compilation-config",
        "--hf-overrides",
        "--kv-transfer-config",
        "--override-generation-config",
        "--limit-mm-per-prompt",
    ):
        p.add_argument(json_flag, type=_json_object, default=None, help=argparse.SUPPRESS)
    for flag, takes_value in _PASSIVE:
        if takes_value:
            p.add_argument(flag, default=None)
        else:
            p.add_argument(flag, action="store_true")
    return p


def parse(argv: list[str], release: tuple[int, int, int]) -> argparse.Namespace:
    """Parse `vllm serve` arguments; exits 2 with argparse's message on an unknown flag."""
    parser = build_parser(release)
    plain, dotted = _normalize(argv)
    ns = parser.parse_args(plain)
    for flag, (key, value) in dotted:
        dest = flag.replace("-", "_")
        if not hasattr(ns, dest):
            parser.error(f"unrecognized arguments: --{flag}.{key}")
        merged = dict(getattr(ns, dest) or {})
        merged[key] = _scalar(value)
        setattr(ns, dest, merged)
    if ns.model_tag and ns.model:
        parser.error("model supplied both as a positional argument and with --model")
    ns.model = ns.model_tag or ns.model or "Qwen/Qwen3-0.6B"
    return ns


def _normalize(argv: list[str]) -> tuple[list[str], list[tuple[str, tuple[str, str]]]]:
    plain: list[str] = []
    dotted: list[tuple[str, tuple[str, str]]] = []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            name = name.replace("_", "-")
            base, dot, key = name.partition(".")
            if dot and base in JSON_FLAGS:
                dotted.append((base, (key, value if eq else next(it, ""))))
                continue
            arg = f"--{name}{eq}{value}"
        plain.append(arg)
    return plain, dotted


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _human_int(text: str) -> int:
    # vLLM accepts 32k / 1M style lengths.
    units = {"k": 1_000, "K": 1_024, "m": 1_000_000, "M": 1_048_576}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
