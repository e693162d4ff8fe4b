"""The performance model: how long a request takes, and what a speculative decoding step accepts.

A commit's `perf:` section (schema in `tree`) declares speeds and acceptance. `declare` turns it into
the declared values of one effective configuration (what a benchmark's figures should come out at,
for a test or a benchmark to hold measurements to); `Performance` is one server start's timing,
which the server paces every request by. Without a `perf:` section none of this runs: the server
sleeps `token_latency_s` per token as it always did.

What is modelled, for one request (each is served by its own thread):
- admission: at most `--max-num-seqs` requests run at once (256 by default, as vLLM on a GPU);
  later ones wait (`vllm:num_requests_waiting`), and the wait is part of their TTFT.
- prefill: prompt tokens × `prefill_s_per_token` × the backend's factor × `prefill` changes, counted
  from the request's arrival (its parsing and generation inside it) or, if it queued, from its
  admission. It yields the first token: TTFT = queueing + prefill, plus the HTTP round trip a
  client sees on top (a fraction of a millisecond on an idle machine).
- decode steps: without speculation a step emits one token. With it, a step verifies k drafts and
  accepts a prefix, draft position i (0-based) with probability p_i given that i − 1 was accepted,
  and emits 1 + accepted tokens (past max_tokens the surplus is dropped, yet counted as accepted,
  as vLLM's scheduler counts it). A step takes
      (decode_step_s × backend × (1 − async_overlap, with async scheduling)
         × (1 + batch_slowdown × (running − 1)) + k × draft_s_per_token × `draft` changes)
      × `decode_step` changes,
  `running` being the requests admitted when the step starts. A streamed response sends one chunk
  per step (several tokens with speculation), so TPOT ≈ step / acceptance length and ITL ≈ step.
- noise: every time × the start's factor (drawn once per server start) × the request's factor
  (drawn once per request); both log-normal with mean 1 and coefficient of variation `start_cv`,
  `request_cv`.
- pacing: each step sleeps to an absolute deadline counted from the first token, so the sleeps'
  overshoot does not add up over a request: its e2e latency is the declared sum (up to the last
  sleep's lateness) while each ITL jitters around its step.
Not modelled: prefill slowing the decode steps of running requests (chunked prefill), KV-cache
pressure and preemption, prefix caching, acceptance that depends on the prompt or the temperature.
Every step is a thread waking up: a server starved of CPU (many requests at once with short steps, on
a machine busy with other work) wakes late and its times stretch beyond the declared ones.

Random streams: every draw here comes from streams of its own, keyed by the start's nonce
(`behaviour.start_nonce`: fresh per process, or `SWEEP_SIM_START_SEED`), `--seed`, and per request
its canonical body and how often the server saw that body before. The streams that decide the tokens
and the bugs are never touched, so a `perf:` section changes no answer, and a commit that does not
change the model replays the same draws for the same start seed.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any

from vllmsim.behaviour import matches
from vllmsim.config import EngineConfig
from vllmsim.logs import Line
from vllmsim.tree import Perf, PerfMetric

# Per spec method, the conditional acceptance of draft positions 0, 1, 2, ... when `perf.acceptance`
# does not list the method: in the range vLLM's users report (MTP and EAGLE-3 acceptance lengths of
# about 2.5-3.5 at k = 4, n-gram lookup well below).
DEFAULT_ACCEPTANCE: dict[str, tuple[float, ...]] = {
    "mtp": (0.9, 0.75, 0.6, 0.45),
    "eagle3": (0.85, 0.7, 0.56, 0.44),
    "eagle": (0.8, 0.62, 0.48, 0.36),
    "dflash": (0.85, 0.7, 0.56, 0.44),
    "dspark": (0.85, 0.7, 0.56, 0.44),
    "draft_model": (0.75, 0.6, 0.48, 0.38),
    "medusa": (0.7, 0.5, 0.36, 0.26),
    "mlp_speculator": (0.68, 0.5, 0.36, 0.26),
    "ngram": (0.5, 0.35, 0.25, 0.18),
    "ngram_gpu": (0.5, 0.35, 0.25, 0.18),
    "suffix": (0.55, 0.4, 0.3, 0.22),
}
_FALLBACK_ACCEPTANCE = (0.6, 0.45, 0.34, 0.25)  # custom_class, extract_hidden_states
TAIL_DECAY = 0.8  # a position past the declared list: this times the previous one
START_LINE_WHERE = "perf.py:118"


@dataclass(frozen=True)
class Declared:
    """The declared performance of one effective configuration: noise-free, at the given load."""

    num_speculative_tokens: int
    acceptance: tuple[float, ...]  # conditional acceptance per draft position (k entries)
    prefill_s_per_token: float
    decode_s: float  # the target model's part of a step at batch 1 (backend, async overlap applied)
    draft_s: float  # the drafting part of a step (all k drafts)
    batch_slowdown: float
    step_factor: float  # the `decode_step` changes
    start_cv: float
    request_cv: float

    @property
    def accepted_per_position(self) -> tuple[float, ...]:
        """Expected accepted tokens per draft, per position: what `..._per_pos_total` / drafts tends to."""
        out, p = [], 1.0
        for q in self.acceptance:
            p *= q
            out.append(p)
        return tuple(out)

    @property
    def acceptance_length(self) -> float:
        """1 + accepted / drafts (vLLM's `spec_decode_acceptance_length`); 1 without speculation."""
        return 1.0 + sum(self.accepted_per_position)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / draft tokens, a fraction (vLLM's `spec_decode_acceptance_rate` is this × 100)."""
        k = self.num_speculative_tokens
        return sum(self.accepted_per_position) / k if k else 0.0

    def ttft_s(self, prompt_tokens: int) -> float:
        """Prefill time: the TTFT of a request admitted at once."""
        return prompt_tokens * self.prefill_s_per_token

    def step_s(self, running: int = 1) -> float:
        """One decode step (the mean ITL of a streamed request) with `running` requests admitted."""
        batch = 1.0 + self.batch_slowdown * max(0, running - 1)
        return (self.decode_s * batch + self.draft_s) * self.step_factor

    def tokens_per_step(self) -> tuple[float, ...]:
        """P(a step emits 1 + j tokens), j = 0..k."""
        cum = (1.0, *self.accepted_per_position, 0.0)
        return tuple(cum[j] - cum[j + 1] for j in range(len(cum) - 1))

    def expected_steps(self, tokens: int) -> float:
        """Expected decode steps to emit `tokens` tokens after the first (the last step may overshoot)."""
        return _expected_steps(self.tokens_per_step(), tokens)

    def tpot_s(self, output_tokens: int, running: int = 1) -> float:
        """Expected (e2el − ttft) / (output tokens − 1): vLLM's TPOT, the first token excluded."""
        if output_tokens <= 1:
            return 0.0
        return self.expected_steps(output_tokens - 1) * self.step_s(running) / (output_tokens - 1)

    def e2el_s(self, prompt_tokens: int, output_tokens: int, running: int = 1) -> float:
        return self.ttft_s(prompt_tokens) + self.expected_steps(max(0, output_tokens - 1)) * self.step_s(running)


@functools.lru_cache(maxsize=256)
def _expected_steps(dist: tuple[float, ...], tokens: int) -> float:
    # E[S(m)] = 1 + sum_j P(1 + j tokens) E[S(m − 1 − j)], S(m <= 0) = 0: a renewal count, exact.
    steps = [0.0] * (tokens + 1)
    for m in range(1, tokens + 1):
        steps[m] = 1.0 + sum(p * steps[max(0, m - 1 - j)] for j, p in enumerate(dist))
    return steps[tokens]


def acceptance_of(perf: Perf, method: str, k: int) -> tuple[float, ...]:
    """The declared conditional acceptance of the k draft positions of `method`, before changes."""
    listed = perf.acceptance.get(method) or DEFAULT_ACCEPTANCE.get(method) or _FALLBACK_ACCEPTANCE
    out = list(listed[:k])
    while len(out) < k:
        out.append(out[-1] * TAIL_DECAY)
    return tuple(out)


def declare(perf: Perf, traits: dict[str, Any]) -> Declared:
    """The declared values for the effective configuration `traits` (`EngineConfig.traits()`)."""
    active = [c for c in perf.changes if matches(c.when, traits)]

    def factor(metric: PerfMetric) -> float:
        return math.prod(c.factor for c in active if c.metric is metric)

    method = str(traits.get("spec_method") or "none")
    k = int(traits.get("num_speculative_tokens") or 0) if method != "none" else 0
    acceptance = list(acceptance_of(perf, method, k)) if k else []
    for change in active:
        if change.metric is PerfMetric.ACCEPTANCE:
            acceptance = [min(1.0, p * change.factor) if change.covers(i) else p for i, p in enumerate(acceptance)]
    backend = perf.attention_backends.get(str(traits.get("attention_backend")), 1.0)
    overlap = perf.async_overlap if traits.get("async_scheduling") else 0.0
    return Declared(
        num_speculative_tokens=k,
        acceptance=tuple(acceptance),
        prefill_s_per_token=perf.prefill_s_per_token * backend * factor(PerfMetric.PREFILL),
        decode_s=perf.decode_step_s * backend * (1.0 - overlap),
        draft_s=k * perf.draft_s_per_token * factor(PerfMetric.DRAFT),
        batch_slowdown=perf.batch_slowdown,
        step_factor=factor(PerfMetric.DECODE_STEP),
        start_cv=perf.start_cv,
        request_cv=perf.request_cv,
    )


def lognormal_factor(rng: random.Random, cv: float) -> float:
    """A log-normal draw with mean 1 and coefficient of variation `cv` (1.0 when cv is 0)."""
    if cv <= 0:
        return 1.0
    sigma2 = math.log1p(cv * cv)
    return rng.lognormvariate(-sigma2 / 2, math.sqrt(sigma2))


def _rng(*parts: object) -> random.Random:
    key = "\0".join(str(p) for p in ("perf", *parts))
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


class RequestTiming:
    """One request's times and draft acceptance, from its own random stream."""

    def __init__(self, declared: Declared, factor: float, rng: random.Random) -> None:
        self.declared, self.factor, self._rng = declared, factor, rng
        self.k = declared.num_speculative_tokens

    def prefill_s(self, prompt_tokens: int) -> float:
        return self.declared.ttft_s(prompt_tokens) * self.factor

    def step(self, running: int) -> tuple[int, float]:
        """The accepted drafts of the next decode step and its duration."""
        accepted = 0
        for p in self.declared.acceptance:
            if self._rng.random() >= p:
                break
            accepted += 1
        return accepted, self.declared.step_s(running) * self.factor


class Performance:
    """One server start's performance model: its declared values, its start factor, its requests."""

    def __init__(self, perf: Perf, cfg: EngineConfig, nonce: str) -> None:
        self.declared = declare(perf, cfg.traits())
        self.seed, self.nonce = cfg.seed, nonce
        self.start_factor = lognormal_factor(_rng("start", nonce, cfg.seed), perf.start_cv)

    def start_lines(self) -> list[Line]:
        """The start's drawn factor, logged once (as a bug's per-start rate is) when it varies."""
        if self.declared.start_cv <= 0:
            return []
        return [
            Line(
                "INFO",
                START_LINE_WHERE,
                f"Simulated performance: times × {self.start_factor:.6f} for this server start, "
                f"drawn from LogNormal(mean=1, cv={self.declared.start_cv:g})",
                True,
            )
        ]

    def request(self, canonical: str, occurrence: int) -> RequestTiming:
        rng = _rng("request", self.nonce, self.seed, canonical, occurrence)
        factor = self.start_factor * lognormal_factor(rng, self.declared.request_cv)
        return RequestTiming(self.declared, factor, rng)


class LegacyTiming:
    """Without a `perf:` section: `token_latency_s` for the first token and for each one after it."""

    k = 0

    def __init__(self, token_latency_s: float) -> None:
        self.latency = token_latency_s

    def prefill_s(self, prompt_tokens: int) -> float:
        return self.latency

    def step(self, running: int) -> tuple[int, float]:
        return 0, self.latency
