"""`/metrics` in vLLM's Prometheus names, built with prometheus_client as vLLM itself does.

Without a `perf:` section, a finished request's speculative decoding counters are drawn after the
fact with a per-position acceptance that depends on the method (`observe`), so acceptance figures
read like a real deployment's. With one, the performance model counts each decode step as it
happens (`prompt`, `step`, `finish`): the counters are those of the drafts that paced the answer.
`vllm:num_requests_running` and `vllm:num_requests_waiting` are the requests admitted and queued now.
"""

from __future__ import annotations

import random
import threading

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from vllmsim.config import EngineConfig

prometheus_client.disable_created_metrics()  # vLLM's exposition has no *_created series

# Acceptance probability of the first draft position; later positions decay by 0.85 each.
_FIRST_ACCEPT = {
    "mtp": 0.85,
    "eagle3": 0.8,
    "eagle": 0.75,
    "draft_model": 0.7,
    "dflash": 0.8,
    "dspark": 0.8,
    "ngram": 0.45,
    "ngram_gpu": 0.45,
    "suffix": 0.5,
}
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class Metrics:
    def __init__(self, cfg: EngineConfig) -> None:
        self.registry = CollectorRegistry()
        self._labels = {"model_name": cfg.served_model_names[0], "engine": "0"}
        names = list(self._labels)
        r = self.registry
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", names, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            names,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            names,
            registry=r,
        )
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", names, registry=r
        )
        self.running.labels(**self._labels)
        self.waiting.labels(**self._labels)
        self.spec_k = cfg.num_speculative_tokens
        self.spec_p = _FIRST_ACCEPT.get(cfg.spec_method, 0.6)
        self._lock = threading.Lock()
        if self.spec_k:
            self.drafts = Counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", names, registry=r
            )
            self.draft_tokens = Counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", names, registry=r
            )
            self.accepted = Counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", names, registry=r
            )
            self.per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [*names, "position"],
                registry=r,
            )
            for pos in range(self.spec_k):
                self.per_pos.labels(**self._labels, position=str(pos))
        # The children a decode step moves, looked up once: a step is the simulator's hot path.
        self._step_children = (
            (self.drafts.labels(**self._labels), self.draft_tokens.labels(**self._labels),
             self.accepted.labels(**self._labels),
             [self.per_pos.labels(**self._labels, position=str(pos)) for pos in range(self.spec_k)])
            if self.spec_k
            else None
        )
        self._generated = self.generation_tokens.labels(**self._labels)

    def observe(
        self,
        *,
        prompt_tokens: int,
        generation_tokens: int,
        finish_reason: str,
        ttft_s: float,
        e2e_s: float,
        rng: random.Random,
    ) -> None:
        with self._lock:
            self.prompt_tokens.labels(**self._labels).inc(prompt_tokens)
            self.generation_tokens.labels(**self._labels).inc(generation_tokens)
            self.success.labels(**self._labels, finished_reason=finish_reason).inc()
            self.ttft.labels(**self._labels).observe(ttft_s)
            self.e2e.labels(**self._labels).observe(e2e_s)
            if self.spec_k:
                self._spec_decode(generation_tokens, rng)

    # --- the performance model's counting, step by step ----------------------------------------

    def prompt(self, tokens: int) -> None:
        """A request's prefill is done."""
        self.prompt_tokens.labels(**self._labels).inc(tokens)

    def step(self, *, emitted: int, accepted: int | None = None) -> None:
        """A decode step emitted `emitted` tokens; with speculation it verified k drafts, `accepted`
        of them (counted whole, as vLLM's scheduler counts them, even past max_tokens)."""
        with self._lock:
            self._generated.inc(emitted)
            if self._step_children is not None and accepted is not None:
                drafts, draft_tokens, accepted_tokens, per_pos = self._step_children
                drafts.inc()
                draft_tokens.inc(self.spec_k)
                accepted_tokens.inc(accepted)
                for child in per_pos[:accepted]:
                    child.inc()

    def finish(self, *, finish_reason: str, ttft_s: float, e2e_s: float) -> None:
        self.success.labels(**self._labels, finished_reason=finish_reason).inc()
        self.ttft.labels(**self._labels).observe(ttft_s)
        self.e2e.labels(**self._labels).observe(e2e_s)

    def load(self, *, running: int, waiting: int) -> None:
        self.running.labels(**self._labels).set(running)
        self.waiting.labels(**self._labels).set(waiting)

    def _spec_decode(self, generated: int, rng: random.Random) -> None:
        # Each step drafts k tokens; a prefix of them is accepted, plus one token from the target model.
        produced = 0
        while produced < generated:
            accepted = 0
            while accepted < self.spec_k and rng.random() < self.spec_p * 0.85**accepted:
                self.per_pos.labels(**self._labels, position=str(accepted)).inc()
                accepted += 1
            self.drafts.labels(**self._labels).inc()
            self.draft_tokens.labels(**self._labels).inc(self.spec_k)
            self.accepted.labels(**self._labels).inc(accepted)
            produced += accepted + 1

    def exposition(self) -> bytes:
        with self._lock:  # never between a step's counters: drafts and accepted tokens agree
            return prometheus_client.generate_latest(self.registry)
