"""The serving metrics a load phase measures: their names, direction, unit and definition. Pure.

Names and definitions are `vllm bench serve`'s (vllm/benchmarks/serve.py, the keys of its JSON
result), so a figure here and one in a vLLM result mean the same thing. One row of the metrics table
(`runs/README.md`, "The metrics table") holds them for one server start and one load point.

- `METRICS`: the figures an `expect:` bound, a comparison or an explanation may name. Each has a
  direction (`higher_is_better`) and, where one is defined, the column of its within-start standard
  error (`se`, always `<name>_se`).
- `COUNTS`: what a load phase counted (requests, tokens, drafts, its duration). Recorded, shown,
  never judged: a count depends on the load point's settings, not on how well the server served it.
- `PER_POSITION`: the one list column, acceptance per draft position.

Definitions (per request, over the successful requests of the load point, warm-ups excluded):
TTFT is request sent → first streamed chunk that carries a choice; E2EL is request sent → the last
such chunk; ITL is the gap between consecutive such chunks (a chunk may carry several tokens under
speculative decoding: vLLM counts it once); TPOT is (E2EL − TTFT) / (output tokens − 1), for
requests with more than one output token. The spec-decode figures are differences of the server's
/metrics counters read just before and just after the load point.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The percentiles reported for each latency (vLLM's `--metric-percentiles` default is 99; the
# median is reported separately as `median_<x>_ms`).
PERCENTILES = (99,)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class MetricName:
    """One figure of the metrics table."""

    name: str
    higher_is_better: bool
    unit: str
    doc: str
    # The column of its within-start standard error, or None where none is defined (medians,
    # percentiles and standard deviations: their error needs the raw values, which are not kept).
    se: str | None = None

    def better(self, a: float, b: float) -> bool:
        """Whether `a` is a better value of this figure than `b`."""
        return a > b if self.higher_is_better else a < b


def _latency(x: str, header: str, definition: str) -> dict[str, MetricName]:
    figures = {
        f"mean_{x}_ms": MetricName(f"mean_{x}_ms", False, "ms", f"mean {header}: {definition}",
                                   se=f"mean_{x}_ms_se"),
        f"median_{x}_ms": MetricName(f"median_{x}_ms", False, "ms", f"median {header}"),
        f"std_{x}_ms": MetricName(f"std_{x}_ms", False, "ms",
                                  f"standard deviation of {header} (population, as numpy.std)"),
    }
    for p in PERCENTILES:
        figures[f"p{p}_{x}_ms"] = MetricName(f"p{p}_{x}_ms", False, "ms",
                                             f"{p}th percentile of {header} (linear interpolation)")
    return figures


_THROUGHPUT_SE = ("batch means: the phase cut into equal time windows, the spread of the amount per "
                  "window over their number")

METRICS: Mapping[str, MetricName] = {
    "request_throughput": MetricName(
        "request_throughput", True, "req/s",
        f"completed requests / duration. SE by {_THROUGHPUT_SE}", se="request_throughput_se"),
    "output_throughput": MetricName(
        "output_throughput", True, "tok/s",
        f"output tokens of completed requests (from usage) / duration. SE by {_THROUGHPUT_SE}",
        se="output_throughput_se"),
    "total_token_throughput": MetricName(
        "total_token_throughput", True, "tok/s",
        f"(input + output tokens of completed requests) / duration. SE by {_THROUGHPUT_SE}",
        se="total_token_throughput_se"),
    "max_output_tokens_per_s": MetricName(
        "max_output_tokens_per_s", True, "tok/s",
        "the most streamed chunks in any whole second of the phase (vLLM's peak output throughput)"),
    **_latency("ttft", "time to first token", "request sent → first streamed chunk with a choice"),
    **_latency("tpot", "time per output token",
               "(E2EL − TTFT) / (output tokens − 1) per request, the first token excluded"),
    **_latency("itl", "inter-token latency",
               "gap between consecutive streamed chunks of a request, over all chunks of all requests"),
    **_latency("e2el", "end-to-end latency", "request sent → last streamed chunk with a choice"),
    "spec_decode_acceptance_rate": MetricName(
        "spec_decode_acceptance_rate", True, "%",
        "accepted tokens / draft tokens × 100, from /metrics deltas over the load point. SE from the "
        "per-position counts, as if drafts were independent", se="spec_decode_acceptance_rate_se"),
    "spec_decode_acceptance_length": MetricName(
        "spec_decode_acceptance_length", True, "tokens",
        "1 + accepted tokens / drafts (the bonus token counted), from /metrics deltas over the load "
        "point. SE from the per-position counts, as if drafts were independent",
        se="spec_decode_acceptance_length_se"),
}

COUNTS: Mapping[str, MetricName] = {
    "completed": MetricName("completed", True, "requests", "requests answered with at least one chunk"),
    "failed": MetricName("failed", False, "requests",
                         "requests that failed (HTTP error, no chunk, broken stream, timeout)"),
    "duration": MetricName("duration", False, "s",
                           "first request sent → last request finished (warm-ups excluded)"),
    "total_input_tokens": MetricName("total_input_tokens", True, "tokens",
                                     "prompt tokens of completed requests (from usage)"),
    "total_output_tokens": MetricName("total_output_tokens", True, "tokens",
                                      "output tokens of completed requests (from usage)"),
    "max_concurrent_requests": MetricName("max_concurrent_requests", True, "requests",
                                          "the most requests active within one whole second from the "
                                          "first send (vLLM's per-second count)"),
    "spec_decode_num_drafts": MetricName("spec_decode_num_drafts", True, "drafts",
                                         "drafts proposed over the load point (/metrics delta)"),
    "spec_decode_draft_tokens": MetricName("spec_decode_draft_tokens", True, "tokens",
                                           "draft tokens proposed over the load point (/metrics delta)"),
    "spec_decode_accepted_tokens": MetricName("spec_decode_accepted_tokens", True, "tokens",
                                              "draft tokens accepted over the load point (/metrics delta)"),
}

PER_POSITION = MetricName(
    "spec_decode_per_position_acceptance_rates", True, "fraction",
    "per draft position i (from 0): accepted at position i / drafts, from /metrics deltas")

SPEC_DECODE = ("spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
               "spec_decode_draft_tokens", "spec_decode_accepted_tokens", PER_POSITION.name)


def metric(name: str) -> MetricName:
    """The figure or count called `name`; KeyError naming the known ones otherwise."""
    found = METRICS.get(name) or COUNTS.get(name)
    if found is None:
        raise KeyError(f"unknown metric {name!r}; known: {', '.join(METRICS)}")
    return found


def se_columns() -> tuple[str, ...]:
    """The standard-error columns of the metrics table, in METRICS order."""
    return tuple(m.se for m in METRICS.values() if m.se)
