"""`make-repo`: a git history of simulated vLLM with planted bugs, and the truth about them.

Every commit rewrites `sim.yaml` (what the simulator does at that commit) and one small source file
(so diffs look like a real history). The history is written with one `git fast-import` stream, so
hundreds of commits take well under a second. The planted facts (tags, culprit, fix, broken
installs) go to `.git/sim-plan.json`, outside the tree, so a test can hold a bisect to the truth.

The demo history also declares a performance model (`perf:` in every commit's `sim.yaml`, the
same base numbers throughout: `DEMO_PERF`) with two planted metric changes, listed in the plan's
`perf_changes` (id, metric, factor, when, from_position, introduced {sha, index, subject}, fixed)
and made by `demo_perf_changes()`:
- `mtp-v2-acceptance` at index 6 (`v0.28.0~1`, "[Model Runner V2] Share the draft KV cache across
  MTP steps (#43904)"): MTP acceptance at draft positions 2 and on × 0.8, with Model Runner V2 only;
- `sync-decode-step` at index 8 (`main~3`, "[Core] Copy sampled token ids to the host every
  synchronous step (#43922)"): the decode step (TPOT, ITL) × 1.1 without async scheduling only.
The bisect history has no `perf:` section: its timing is `token_latency_s`, as before.

`rate_sd` > 0 (`--rate-sd`) gives every planted bug with a rate below 1 that `rate_sd` in
`sim.yaml`: its rate then varies between server starts (see `tree`). The default, 0, writes no
`rate_sd` key: every start of a commit then replays the same outcomes.
"""

from __future__ import annotations

import enum
import json
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vllmsim.tree import beta_parameters

_START_EPOCH = 1786438800  # 2026-08-11T09:00:00Z, the v0.27.0 release
_AUTHORS = (  # invented: a simulated history must not put words in real maintainers' mouths
    ("Ada Quill", "ada.quill@example.com"),
    ("Bo Lindqvist", "bo.lindqvist@example.com"),
    ("Chidi Okafor", "chidi.okafor@example.com"),
    ("Dana Morell", "dana.morell@example.com"),
    ("Emil Varga", "emil.varga@example.com"),
    ("Fen Takahashi", "fen.takahashi@example.com"),
)
_AREAS = (
    ("Core", "vllm/v1/core/sched", "scheduler.py"),
    ("Bugfix", "vllm/v1/engine", "core.py"),
    ("Model", "vllm/model_executor/models", "qwen3.py"),
    ("Kernel", "vllm/attention/ops", "paged_attn.py"),
    ("Frontend", "vllm/entrypoints/openai", "serving_chat.py"),
    ("Perf", "vllm/v1/worker", "gpu_input_batch.py"),
    ("Spec Decode", "vllm/v1/spec_decode", "eagle.py"),
    ("CI", "tests/v1", "test_serving.py"),
    ("Doc", "docs/features", "spec_decode.md"),
    ("Misc", "vllm", "envs.py"),
)
_VERBS = (
    "Fix",
    "Refactor",
    "Speed up",
    "Clean up",
    "Add tests for",
    "Support",
    "Simplify",
    "Remove dead code in",
)
_NOUNS = (
    "scheduler stall",
    "prefix cache eviction",
    "chunked prefill",
    "KV cache allocation",
    "logprobs output",
    "sampler seeding",
    "CUDA graph capture",
    "tokenizer warmup",
    "LoRA loading",
    "metrics labels",
    "request abort path",
    "detokenizer offsets",
    "block table copy",
    "rotary embedding cache",
)
FSM_WHEN: dict[str, list[Any]] = {"spec_method": ["mtp"], "strict_tool_calling": [True]}


class Scenario(str, enum.Enum):
    DEMO = "demo"
    BISECT = "bisect"


class RepoError(Exception):
    pass


@dataclass
class BugPlan:
    id: str
    effect: str
    when: dict[str, list[Any]]
    rate: float
    introduced: int
    fixed: int | None = None
    rate_sd: float = 0.0

    def declaration(self) -> dict[str, Any]:
        """The bug's entry in `sim.yaml`."""
        out: dict[str, Any] = {"id": self.id, "effect": self.effect, "when": self.when, "rate": self.rate}
        if self.rate_sd > 0:
            out["rate_sd"] = self.rate_sd
        return out

    def active(self, index: int) -> bool:
        return self.introduced <= index and (self.fixed is None or index < self.fixed)


@dataclass
class PerfChangePlan:
    """A planted metric change: its entry in `sim.yaml`'s `perf.changes` from `introduced` on."""

    id: str
    metric: str
    factor: float
    when: dict[str, list[Any]]
    introduced: int
    fixed: int | None = None
    from_position: int | None = None  # acceptance changes: the first draft position hit (0-based)

    def declaration(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "metric": self.metric}
        if self.from_position is not None:
            out["from_position"] = self.from_position
        out.update(factor=self.factor, when=self.when)
        return out

    def active(self, index: int) -> bool:
        return self.introduced <= index and (self.fixed is None or index < self.fixed)


# The demo's performance model at every commit: a step of 2 ms, prefill at 0.05 ms a token, per-start
# spread 2 %, per-request 3 %. Fast enough that a load phase of a few hundred short requests takes
# seconds (and the correctness replays of the demo stay within about twice their unpaced time),
# slow enough that a sleep's lateness (tens of µs, never summed over a request) is small against a step.
DEMO_PERF: dict[str, Any] = {
    "prefill_s_per_token": 0.00005,
    "decode_step_s": 0.002,
    "draft_s_per_token": 0.00005,
    "batch_slowdown": 0.01,
    "async_overlap": 0.08,
    "attention_backends": {"FLASH_ATTN": 1.0, "FLASHINFER": 0.96, "TRITON_ATTN": 1.12, "FLEX_ATTENTION": 1.3},
    "acceptance": {
        "mtp": [0.9, 0.75, 0.6, 0.45],
        "eagle3": [0.85, 0.7, 0.56, 0.44],
        "eagle": [0.8, 0.62, 0.48, 0.36],
        "ngram": [0.5, 0.35, 0.25, 0.18],
    },
    "start_cv": 0.02,
    "request_cv": 0.03,
}
MTP_V2_ACCEPTANCE_INDEX = 6
SYNC_STEP_INDEX = 8


def demo_perf_changes() -> list[PerfChangePlan]:
    """The demo's planted metric changes (fresh objects: a history may edit its own)."""
    return [
        PerfChangePlan(
            "mtp-v2-acceptance",
            "acceptance",
            0.8,
            {"spec_method": ["mtp"], "model_runner": ["V2"]},
            introduced=MTP_V2_ACCEPTANCE_INDEX,
            from_position=2,
        ),
        PerfChangePlan(
            "sync-decode-step", "decode_step", 1.1, {"async_scheduling": [False]}, introduced=SYNC_STEP_INDEX
        ),
    ]


@dataclass
class History:
    subjects: list[str]
    tags: dict[int, str]  # commit index -> tag name
    bugs: list[BugPlan]
    broken: range = field(default_factory=lambda: range(0))
    culprit: int = 0
    fix: int | None = None
    day_s: int = 3 * 3600
    perf: dict[str, Any] | None = None  # the `perf:` section's base (None: no performance model)
    perf_changes: list[PerfChangePlan] = field(default_factory=list)


def make(
    directory: Path, *, scenario: Scenario, commits: int = 240, seed: int = 0, rate_sd: float = 0.0
) -> dict[str, Any]:
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise RepoError(f"{directory} exists and is not empty")
    rng = random.Random(seed)
    history = _demo(rng) if scenario is Scenario.DEMO else _bisect(rng, commits)
    _plant_rate_sd(history, rate_sd)
    directory.mkdir(parents=True, exist_ok=True)
    _git(directory, "init", "-q", "-b", "main")
    stream = _fast_import_stream(history, rng)
    subprocess.run(
        ["git", "-C", str(directory), "fast-import", "--quiet"], input=stream, check=True, capture_output=True
    )
    _git(directory, "reset", "-q", "--hard", "main")
    shas = _git(directory, "rev-list", "--first-parent", "--reverse", "main").split()
    plan = _plan(history, shas, scenario, seed)
    (directory / ".git" / "sim-plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    return plan


def _plant_rate_sd(history: History, rate_sd: float) -> None:
    if rate_sd < 0:
        raise RepoError(f"--rate-sd must not be negative, got {rate_sd}")
    if rate_sd == 0:
        return
    for bug in history.bugs:
        if bug.rate >= 1.0:
            continue  # a bug that always bites has no spread to vary
        try:
            beta_parameters(bug.rate, rate_sd)
        except ValueError as exc:
            raise RepoError(f"--rate-sd {rate_sd} for bug {bug.id}: {exc}") from None
        bug.rate_sd = rate_sd


def _demo(rng: random.Random) -> History:
    subjects = [_noise(rng, 43850 + 9 * i) for i in range(12)]
    subjects[2] = "[Spec Decode] Enforce strict tool-call grammars while MTP drafts (#43911)"
    subjects[5] = "[Bugfix][Structured Output] Fix failed FSM advance with speculative decoding (#44297)"
    subjects[9] = "[Model Runner V2] Fused multi-step draft decode for MTP (#54120)"
    # The planted metric changes: their subjects replace noise drawn above, so the draws (and with
    # them every other commit's subject, author and source) stay as they were.
    subjects[MTP_V2_ACCEPTANCE_INDEX] = "[Model Runner V2] Share the draft KV cache across MTP steps (#43904)"
    subjects[SYNC_STEP_INDEX] = "[Core] Copy sampled token ids to the host every synchronous step (#43922)"
    bugs = [
        BugPlan("fsm-whitespace", "fsm_whitespace", dict(FSM_WHEN), 0.33, introduced=2, fixed=5),
        BugPlan(
            "silent-whitespace",
            "silent_whitespace",
            {"spec_method": ["mtp"], "reasoning_parser": ["qwen3"], "async_scheduling": [True]},
            0.2,
            introduced=5,
        ),
        BugPlan(
            "thinking-budget-ignored",
            "thinking_budget_ignored",
            {"spec_method": ["mtp"], "model_runner": ["V2"]},
            1.0,
            introduced=9,
        ),
    ]
    return History(
        subjects,
        {0: "v0.27.0", 7: "v0.28.0"},
        bugs,
        culprit=2,
        fix=5,
        day_s=2 * 86400,
        perf=DEMO_PERF,
        perf_changes=demo_perf_changes(),
    )


def _bisect(rng: random.Random, commits: int) -> History:
    if commits < 20:
        raise RepoError(f"--commits must be at least 20 for the bisect scenario, got {commits}")
    tags = {0: "v0.27.0", round(0.4 * commits): "v0.28.0", round(0.8 * commits): "v0.29.0"}
    culprit = rng.randint(round(0.1 * commits), round(0.7 * commits))
    while culprit in tags:
        culprit += 1
    length = max(3, commits // 40)
    starts = [
        s
        for s in range(round(0.1 * commits), round(0.75 * commits) - length)
        if not any(i in tags or culprit - 1 <= i <= culprit for i in range(s, s + length))
    ]
    start = rng.choice(starts)
    fix = round(0.9 * commits)
    subjects = [_noise(rng, 30000 + 11 * i + rng.randint(0, 9)) for i in range(commits)]
    subjects[culprit] = (
        f"[Spec Decode] Let MTP drafts bypass the strict tool-call grammar check (#{30000 + 11 * culprit})"
    )
    subjects[start] = f"[Build] Bump CUTLASS to v4.3 (#{30000 + 11 * start})"
    subjects[start + length] = (
        f"[Build] Fix the CUTLASS bump's missing header (#{30000 + 11 * (start + length)})"
    )
    subjects[fix] = "[Bugfix][Structured Output] Fix failed FSM advance with speculative decoding (#44297)"
    bugs = [BugPlan("mtp-strict-fsm", "fsm_whitespace", dict(FSM_WHEN), 0.3, introduced=culprit, fixed=fix)]
    return History(subjects, tags, bugs, broken=range(start, start + length), culprit=culprit, fix=fix)


def _noise(rng: random.Random, pr: int) -> str:
    area = rng.choice(_AREAS)[0]
    return f"[{area}] {rng.choice(_VERBS)} {rng.choice(_NOUNS)} (#{pr})"


def _version(history: History, index: int) -> str:
    tagged = max(i for i in history.tags if i <= index)
    release = history.tags[tagged].lstrip("v")
    if tagged == index:
        return release
    major, minor, _ = release.split(".")
    return f"{major}.{minor}.1.dev{index - tagged}"


def _sim_yaml(history: History, index: int) -> str:
    doc: dict[str, Any] = {
        "version": _version(history, index),
        "install": "fail: error: command '/usr/local/cuda/bin/nvcc' failed: cutlass/gemm/collective.hpp: "
        "No such file or directory"
        if index in history.broken
        else "ok",
        "startup_s": 0.2,
        "token_latency_s": 0.0005,
        "bugs": [b.declaration() for b in history.bugs if b.active(index)],
    }
    if history.perf is not None:
        doc["perf"] = {
            **history.perf,
            "changes": [c.declaration() for c in history.perf_changes if c.active(index)],
        }
    return str(yaml.safe_dump(doc, sort_keys=False))


def _fast_import_stream(history: History, rng: random.Random) -> bytes:
    parts: list[bytes] = []
    sources: dict[str, list[str]] = {}

    def data(text: str) -> bytes:
        raw = text.encode()
        return b"data %d\n" % len(raw) + raw + b"\n"

    for index, subject in enumerate(history.subjects):
        name, email = _AUTHORS[rng.randrange(len(_AUTHORS))]
        when = _START_EPOCH + index * history.day_s
        area = next((a for a in _AREAS if subject.startswith(f"[{a[0]}]")), _AREAS[index % len(_AREAS)])
        path = f"{area[1]}/{area[2]}"
        sources.setdefault(path, [f"# SPDX-License-Identifier: Apache-2.0\n# {path}\n"])
        sources[path].append(f"# {subject}\nCHANGE_{index} = {rng.randint(0, 10**6)}\n")
        parts.append(b"commit refs/heads/main\nmark :%d\n" % (index + 1))
        parts.append(
            f"author {name} <{email}> {when} +0000\ncommitter {name} <{email}> {when} +0000\n".encode()
        )
        parts.append(data(f"{subject}\n\nSigned-off-by: {name} <{email}>\n"))
        if index:
            parts.append(b"from :%d\n" % index)
        parts.append(b"M 100644 inline sim.yaml\n" + data(_sim_yaml(history, index)))
        parts.append(f"M 100644 inline {path}\n".encode() + data("".join(sources[path])))
        if index == 0:
            parts.append(
                b"M 100644 inline README.md\n"
                + data(
                    "# vLLM (simulated)\n\nA simulated vLLM source "
                    "tree: `sim.yaml` declares this commit's behaviour.\n"
                )
            )
        parts.append(b"\n")
        if index in history.tags:
            tag = history.tags[index]
            parts.append(f"tag {tag}\nfrom :{index + 1}\ntagger {name} <{email}> {when} +0000\n".encode())
            parts.append(data(f"vLLM {tag}\n"))
    return b"".join(parts)


def _plan(history: History, shas: list[str], scenario: Scenario, seed: int) -> dict[str, Any]:
    def at(index: int | None) -> dict[str, Any] | None:
        if index is None:
            return None
        return {"sha": shas[index], "index": index, "subject": history.subjects[index]}

    broken = history.broken
    return {
        "scenario": scenario.value,
        "seed": seed,
        "commits": len(shas),
        "branch": "main",
        "head": shas[-1],
        "tags": {name: shas[i] for i, name in sorted(history.tags.items())},
        "tag_indices": {name: i for i, name in sorted(history.tags.items())},
        "culprit": {**(at(history.culprit) or {}), "bug": history.bugs[0].id},
        "fix": at(history.fix),
        "install_broken": {
            "first": at(broken.start),
            "last": at(broken[-1]),
            "indices": list(broken),
            "shas": [shas[i] for i in broken],
        }
        if broken
        else None,
        "bugs": [
            {
                "id": b.id,
                "effect": b.effect,
                "when": b.when,
                "rate": b.rate,
                "rate_sd": b.rate_sd,
                "introduced": at(b.introduced),
                "fixed": at(b.fixed),
            }
            for b in history.bugs
        ],
        "perf_changes": [
            {
                "id": c.id,
                "metric": c.metric,
                "factor": c.factor,
                "when": c.when,
                "from_position": c.from_position,
                "introduced": at(c.introduced),
                "fixed": at(c.fixed),
            }
            for c in history.perf_changes
        ],
        "first_parent": shas,
    }


def _git(directory: Path, *argv: str) -> str:
    out = subprocess.run(["git", "-C", str(directory), *argv], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RepoError(f"git {' '.join(argv)} failed: {out.stderr.strip()}")
    return out.stdout
