"""Serving figures of one load point, with vLLM's definitions and names (`sweeper.judge.metric_names`). Pure.

`figures(requests, duration)` computes what `vllm bench serve`'s `calculate_metrics` does, from the
per-request records of the load generator (`sweeper.execute.load`), plus each figure's within-start
standard error where one is defined. `spec_decode(before, after)` computes the spec-decode figures
from two parsed `/metrics` scrapes, as vLLM's `benchmark()` does, and says when the counters cannot be
trusted (missing, or going backwards: a server that restarted in between). `judge_phase` says
whether the start's figures may be used at all.

Standard errors (within one start; the spread between starts is the readers' business):
- a mean latency: the sample standard deviation over the square root of the count (ITL: over every
  gap, as if independent: a lower bound when gaps of one request are correlated);
- a throughput: batch means: the phase cut into `WINDOWS` equal time windows, the amount done in
  each (requests completed, tokens streamed), the standard deviation of the windows' rates over the
  square root of their number;
- acceptance length and rate: from the per-position counters, which give the distribution of the
  number of tokens accepted per draft (accepted at position i means every earlier one was too), as
  if drafts were independent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sweeper.judge.metric_names import LATENCIES, PERCENTILES

# (metric name, sorted label pairs) -> value: a parsed Prometheus scrape.
Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SUCCESS = "vllm:request_success_total"
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED)

WINDOWS = 10  # batch means of a throughput: this many windows (fewer for a phase of fewer requests)
MAX_ERRORS_SHOWN = 3


class Record(Protocol):
    """What `figures` reads of one request (`sweeper.execute.load.RequestRecord`)."""

    start: float
    ttft: float | None
    itl: list[float]
    e2el: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    chunks: int
    ok: bool
    error: str | None


def _ms(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    if not values:
        return {f"mean_{prefix}_ms": None, f"median_{prefix}_ms": None, f"std_{prefix}_ms": None,
                **{f"p{p}_{prefix}_ms": None for p in PERCENTILES}, f"mean_{prefix}_ms_se": None}
    arr = np.asarray(values, dtype=float) * 1000.0
    out: dict[str, float | None] = {
        f"mean_{prefix}_ms": float(arr.mean()), f"median_{prefix}_ms": float(np.median(arr)),
        f"std_{prefix}_ms": float(arr.std()),
    }
    for p in PERCENTILES:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(arr, p))
    out[f"mean_{prefix}_ms_se"] = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else None
    return out


def output_tokens(rec: Record) -> int:
    """A request's output tokens: its usage's, else one per streamed chunk (a server that sends no
    usage; vLLM would count with its tokenizer)."""
    return rec.output_tokens if rec.output_tokens else rec.chunks


def _chunk_times(rec: Record) -> list[float]:
    """When each chunk of a successful request came, on the records' clock."""
    times = [rec.start + (rec.ttft or 0.0)]
    for gap in rec.itl:
        times.append(times[-1] + gap)
    return times


def figures(requests: Sequence[Record], duration: float, t0: float | None = None) -> dict[str, Any]:
    """The load point's figures (columns of the metrics table) from its measured requests (warm-ups
    excluded) and its duration. `t0`: the phase's start on the records' clock (default: the first
    send), for the throughputs' batch means."""
    ok = [r for r in requests if r.ok]
    failed = len(requests) - len(ok)
    outs = [output_tokens(r) for r in ok]
    ins = [r.prompt_tokens or 0 for r in ok]
    total_out, total_in = sum(outs), sum(ins)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2els = [r.e2el for r in ok if r.e2el is not None]
    tpots = [(r.e2el - r.ttft) / (n - 1) for r, n in zip(ok, outs, strict=True)
             if n > 1 and r.e2el is not None and r.ttft is not None]
    itls = [gap for r in ok for gap in r.itl]
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: None)
    row: dict[str, Any] = {
        "completed": len(ok), "failed": failed, "duration": duration,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": rate(len(ok)), "output_throughput": rate(total_out),
        "total_token_throughput": rate(total_in + total_out),
    }
    for name, values in zip(LATENCIES, (ttfts, tpots, itls, e2els), strict=True):
        row.update(_ms(values, name))
    row.update(_peaks(ok))
    row.update(_throughput_se(ok, outs, duration, t0 if t0 is not None else min((r.start for r in ok), default=0.0)))
    return row


def _peaks(ok: Sequence[Record]) -> dict[str, Any]:
    """vLLM's `max_output_tokens_per_s` (chunks per whole second from the first send) and
    `max_concurrent_requests` (the most requests active at some time in one whole second from the
    first send: vLLM's per-second count, which exceeds the requests in flight at once when they are
    shorter than a second)."""
    if not ok:
        return {"max_output_tokens_per_s": None, "max_concurrent_requests": None}
    first = min(r.start for r in ok)
    last = max(r.start + (r.e2el or 0.0) for r in ok)
    buckets = np.zeros(math.ceil(last - first) + 1)
    active = np.zeros(len(buckets))
    for r in ok:
        for t in _chunk_times(r):
            second = int(t - first)
            if 0 <= second < len(buckets):
                buckets[second] += 1
        active[int(r.start - first):int(r.start + (r.e2el or 0.0) - first) + 1] += 1
    return {"max_output_tokens_per_s": float(buckets.max()), "max_concurrent_requests": int(active.max())}


def _throughput_se(ok: Sequence[Record], outs: Sequence[int], duration: float, t0: float) -> dict[str, Any]:
    windows = min(WINDOWS, len(ok))
    names = ("request_throughput_se", "output_throughput_se", "total_token_throughput_se")
    if windows < 2 or duration <= 0:
        return dict.fromkeys(names)
    width = duration / windows
    done, out_tok, all_tok = np.zeros(windows), np.zeros(windows), np.zeros(windows)

    def window(t: float) -> int:
        return min(windows - 1, max(0, int((t - t0) / width)))

    for r, n in zip(ok, outs, strict=True):
        times = _chunk_times(r)
        done[window(times[-1])] += 1
        all_tok[window(times[0])] += r.prompt_tokens or 0
        share = n / len(times)
        for t in times:
            w = window(t)
            out_tok[w] += share
            all_tok[w] += share
    return {name: float(np.std(amount / width, ddof=1) / math.sqrt(windows))
            for name, amount in zip(names, (done, out_tok, all_tok), strict=True)}


# --- speculative decoding, from /metrics ------------------------------------------------------

def _total(samples: Samples, name: str) -> float | None:
    values = [v for (n, _), v in samples.items() if n == name]
    return sum(values) if values else None


def _per_position(samples: Samples) -> dict[int, float]:
    out: dict[int, float] = {}
    for (name, labels), value in samples.items():
        if name != ACCEPTED_PER_POS:
            continue
        pos = dict(labels).get("position")
        if pos is not None and pos.lstrip("-").isdigit():
            out[int(pos)] = out.get(int(pos), 0.0) + value
    return out


@dataclass(frozen=True)
class SpecDecode:
    """The spec-decode columns of one load point, or why its counters cannot be used."""

    columns: Mapping[str, Any]
    problem: str | None = None


SPEC_COLUMNS = ("spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens",
                "spec_decode_acceptance_rate", "spec_decode_acceptance_length",
                "spec_decode_per_position_acceptance_rates", "spec_decode_acceptance_rate_se",
                "spec_decode_acceptance_length_se")


def went_backwards(before: Samples, after: Samples) -> list[str]:
    """The counters (`*_total`) that are lower after than before, or gone: a server that restarted
    between the scrapes, or another process answering."""
    out = []
    for key, value in before.items():
        name = key[0]
        if not name.endswith("_total"):
            continue
        later = after.get(key)
        if later is None or later < value:
            out.append(name)
    return sorted(set(out))


def spec_decode(before: Samples, after: Samples, *, expected: bool) -> SpecDecode:
    """The spec-decode columns between two scrapes. `expected`: the cell runs speculative decoding,
    so the counters must be there (a server without them, for a cell with no speculative decoding,
    has null columns and no problem)."""
    empty = dict.fromkeys(SPEC_COLUMNS)
    backwards = went_backwards(before, after)
    if backwards:
        return SpecDecode(empty, f"/metrics counters went backwards or vanished: {', '.join(backwards[:4])}")
    totals_b = [_total(before, n) for n in SPEC_COUNTERS]
    totals_a = [_total(after, n) for n in SPEC_COUNTERS]
    if any(v is None for v in totals_b + totals_a):
        if expected:
            missing = [n for n, b, a in zip(SPEC_COUNTERS, totals_b, totals_a, strict=True) if b is None or a is None]
            return SpecDecode(empty, f"/metrics has no spec-decode counters ({', '.join(missing)})")
        return SpecDecode(empty)
    drafts, draft_tokens, accepted = (float(a or 0.0) - float(b or 0.0)
                                      for a, b in zip(totals_a, totals_b, strict=True))
    cols: dict[str, Any] = {**empty, "spec_decode_num_drafts": int(drafts),
                            "spec_decode_draft_tokens": int(draft_tokens),
                            "spec_decode_accepted_tokens": int(accepted)}
    if draft_tokens <= 0 or drafts <= 0:
        return SpecDecode(cols)  # vLLM reports no acceptance when nothing was drafted
    pos_b, pos_a = _per_position(before), _per_position(after)
    per_pos = [(pos_a.get(p, pos_b.get(p, 0.0)) - pos_b.get(p, 0.0)) / drafts for p in sorted(set(pos_b) | set(pos_a))]
    cols.update({
        "spec_decode_acceptance_rate": accepted / draft_tokens * 100.0,
        "spec_decode_acceptance_length": 1.0 + accepted / drafts,
        "spec_decode_per_position_acceptance_rates": per_pos,
    })
    if per_pos and drafts > 1:
        # P(accepted >= i + 1) = per_pos[i]: E[A] = sum, E[A^2] = sum (2i + 1) per_pos[i].
        mean = sum(per_pos)
        second = sum((2 * i + 1) * p for i, p in enumerate(per_pos))
        se = math.sqrt(max(0.0, second - mean * mean) / drafts)
        cols["spec_decode_acceptance_length_se"] = se
        cols["spec_decode_acceptance_rate_se"] = se / (draft_tokens / drafts) * 100.0
    return SpecDecode(cols)


# --- validity -----------------------------------------------------------------------------------

# How an invalid load point's reason names the root cause of an engine that died in it (the failure
# signature `sweeper.vllm.crash` gives: exception type and innermost vLLM frame).
ENGINE_CRASHED = "; the engine crashed: "


def with_crash(reason: str, signature: str) -> str:
    return f"{reason}{ENGINE_CRASHED}{signature}"


def crash_of(reason: str | None) -> str | None:
    """The failure signature `with_crash` put in a reason, or None."""
    if not reason or ENGINE_CRASHED not in reason:
        return None
    return reason.rsplit(ENGINE_CRASHED, 1)[1] or None

def judge_phase(requests: Sequence[Record], *, stopped: str | None, alive: bool,
                metrics_problem: str | None) -> str | None:
    """Why this start's figures of this load point must not be used, or None when they may: the
    phase stopped early (a stall, the deadline), the server died, a request failed, or /metrics
    could not be trusted. The first of these that holds is the reason."""
    failed = [r for r in requests if not r.ok]
    if not alive:
        return "the server exited during the load phase" + (f" ({len(failed)} of {len(requests)} requests failed)"
                                                            if failed else "")
    if stopped:
        return f"the load phase stopped early: {stopped}"
    if failed:
        errors = list(dict.fromkeys(r.error or "failed" for r in failed))[:MAX_ERRORS_SHOWN]
        return f"{len(failed)} of {len(requests)} requests failed: {'; '.join(e[:160] for e in errors)}"
    if not requests:
        return "no requests were sent"
    return metrics_problem
