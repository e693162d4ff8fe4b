"""Histories with one planted conjunction over 6 or 8 server axes, written apart from the zoom.

A history is a matrix (the axes of its family, one commit), a simulated vLLM repository whose one
commit declares the planted bug in `sim.yaml` (the simulator's own bug declarations: a `when` over
its effective traits, a rate, optionally a per-start `rate_sd`), and the truth: the conjunction as
explain should name it. Families are `{6,8}ax-{1,2,3}t`: the number of server axes and of terms.
Within a family a third of the histories put one term on an effective value (the V2 model runner
*as it ran*: ngram silently falls back to V1, so the planted term is `VLLM_USE_V2_MODEL_RUNNER=1`
on what ran), and half draw each start's rate around the bug's (`rate_sd`).

Nothing here comes from `sweeper`'s explain or zoom: the draws are uniform over the axes and
values, rates from 0.25 to 0.6.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# name -> (values, the simulator trait it sets, that trait's value per axis value)
AXES6: dict[str, tuple[list[Any], str, dict[str, Any]]] = {
    "spec_method": (["none", "ngram", "mtp"], "spec_method", {"none": "none", "ngram": "ngram", "mtp": "mtp"}),
    "env.VLLM_USE_V2_MODEL_RUNNER": (["0", "1"], "model_runner", {"0": "V1", "1": "V2"}),
    "attention_backend": (["FLASH_ATTN", "TRITON_ATTN"], "attention_backend",
                          {"FLASH_ATTN": "FLASH_ATTN", "TRITON_ATTN": "TRITON_ATTN"}),
    "serve.--dtype": (["bfloat16", "float16"], "dtype", {"bfloat16": "bfloat16", "float16": "float16"}),
    "serve.--enforce-eager": ([True, False], "enforce_eager", {"true": True, "false": False}),
    "env.VLLM_ENFORCE_STRICT_TOOL_CALLING": (["0", "1"], "strict_tool_calling", {"0": False, "1": True}),
}
AXES8 = {
    **AXES6,
    "serve.--reasoning-parser": (["qwen3", "deepseek_r1"], "reasoning_parser",
                                 {"qwen3": "qwen3", "deepseek_r1": "deepseek_r1"}),
    "serve.--tool-call-parser": (["qwen3_coder", "hermes"], "tool_call_parser",
                                 {"qwen3_coder": "qwen3_coder", "hermes": "hermes"}),
}
FAMILIES = tuple(f"{n}ax-{t}t" for n in (6, 8) for t in (1, 2, 3))
RUNNER = "env.VLLM_USE_V2_MODEL_RUNNER"

SUITE = """name: bench
defaults:
  repeat: {repeat}
  body: {max_tokens: 64, temperature: 0}
  checks: [http_ok, {finish_reason: {expected: [stop, tool_calls]}}, json_schema, no_whitespace_tail,
           {log_absent: {pattern: "Failed to advance FSM"}}]
cases:
  - id: invoice
    body:
      messages: [{role: user, content: "Extract the invoice as JSON."}]
      response_format:
        type: json_schema
        json_schema:
          name: invoice
          schema:
            type: object
            properties:
              customer: {type: string}
              items: {type: array, items: {type: object, properties: {sku: {type: string}, qty: {type: integer}},
                                            required: [sku, qty]}}
            required: [customer, items]
  - id: event
    body:
      messages: [{role: user, content: "Make an event with attendees."}]
      response_format:
        type: json_schema
        json_schema:
          name: event
          schema:
            type: object
            properties:
              title: {type: string}
              attendees: {type: array, items: {type: string}}
            required: [title, attendees]
"""


def text(value: Any) -> str:
    """An axis value as explain's terms spell it."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class History:
    family: str
    seed: int
    axes: dict[str, list[Any]]
    truth: frozenset[tuple[str, str]]  # (axis, value) as explain names them
    bug: dict[str, Any]  # the sim.yaml bug declaration
    effective: bool
    flaky: bool


def draw(family: str, seed: int) -> History:
    n_axes, terms = int(family.split("ax-")[0]), int(family.split("-")[1][0])
    rng = random.Random(f"{family}/{seed}")
    pool = AXES6 if n_axes == 6 else AXES8
    effective = rng.random() < 1 / 3
    flaky = rng.random() < 0.5
    names = sorted(pool)
    picked: list[tuple[str, Any]] = []
    if effective:
        picked.append((RUNNER, "1"))
    others = [a for a in names if a != RUNNER] if effective else names
    for axis in rng.sample(others, terms - len(picked)):
        values = pool[axis][0]
        if effective and axis == "spec_method":
            values = [v for v in values if v != "ngram"]  # ngram never runs V2: nothing would fail
        picked.append((axis, rng.choice(values)))
    when = {pool[a][1]: pool[a][2][text(v)] for a, v in picked}
    rate = round(rng.uniform(0.25, 0.6), 3)
    bug: dict[str, Any] = {"id": "planted", "effect": "fsm_whitespace", "when": when, "rate": rate}
    if flaky:
        bug["rate_sd"] = round(min(0.15, 0.8 * (rate * (1 - rate)) ** 0.5), 3)
    truth = frozenset((a, text(v)) for a, v in picked)
    return History(family, seed, {a: list(pool[a][0]) for a in names}, truth, bug, effective, flaky)


def write(history: History, folder: Path, repeat: int = 4) -> Path:
    """The history's simulator repository, suite (its two cases `repeat` times each) and matrix under
    `folder`; the matrix's path."""
    repo = folder / "vllm"
    repo.mkdir(parents=True, exist_ok=True)
    sim = {"version": "0.33.0", "startup_s": 0.1, "token_latency_s": 0.0002, "bugs": [history.bug]}
    (repo / "sim.yaml").write_text(yaml.safe_dump(sim))
    for argv in (["init", "-q", "-b", "main"], ["add", "."],
                 ["-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "planted"]):
        subprocess.run(["git", *argv], cwd=repo, check=True, capture_output=True)
    (folder / "suite.yaml").write_text(SUITE.replace("{repeat}", str(repeat)))
    matrix = {
        "name": f"{history.family}-{history.seed}", "model": "Qwen/Qwen3-8B", "suite": "suite.yaml",
        "install": {"kind": "sim", "repo": str(repo)}, "concurrency": 8,
        "timeouts": {"startup_s": 60, "request_s": 20},
        "axes": {"commit": ["main"], **{a: v for a, v in history.axes.items()}, "num_speculative_tokens": [2]},
    }
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    return path
