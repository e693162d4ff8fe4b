"""Prometheus `/metrics` of a server: parse, difference two scrapes, and the spec-decode figures.

Counters are cumulative over the server's life. The runner scrapes once before a server group's
replay and once after it, so the figures cover every request of the group: the cells of one group
share a server and their requests are interleaved, so a figure per cell would need a replay per
cell. Each cell row of the group carries the group's figures (the `spec_*` columns say so).
Parsing is `prometheus_client`'s text parser.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sweeper.errors import MetricsError
from sweeper.execute.transport import tls
from sweeper.judge.serving import ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS, SUCCESS

# (metric name, sorted label pairs) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]



def scrape(base_url: str, api_key: str | None = None, *, timeout: float = 10.0) -> str:
    """The server's /metrics text; MetricsError, saying why, when it cannot be read."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=timeout, verify=tls())
    except httpx.HTTPError as exc:
        raise MetricsError(f"GET /metrics failed: {type(exc).__name__}: {exc}".strip()) from None
    if resp.status_code != 200:
        raise MetricsError(f"GET /metrics answered HTTP {resp.status_code}")
    return resp.text


@dataclass(frozen=True)
class Scrape:
    """One scrape's text, or why there is none."""

    text: str | None
    error: str = ""


def try_scrape(base_url: str, api_key: str | None = None, *, timeout: float = 10.0) -> Scrape:
    try:
        return Scrape(scrape(base_url, api_key, timeout=timeout))
    except MetricsError as exc:
        return Scrape(None, str(exc))


def group_figures(before: Scrape, after: Scrape | None) -> tuple[dict[str, float | list[float] | None], str]:
    """The `spec_*` columns between two scrapes, and why they are empty when they are. A counter is
    cumulative since the server started: without the scrape before, its value after is no group's
    figure, so a missed scrape leaves every figure empty rather than counting from zero.
    `after` None: the server is gone (its status says so), no figures and nothing more to say."""
    if after is None:
        return {}, ""
    for when, s in (("before", before), ("after", after)):
        if s.text is None:
            return {}, f"spec-decode figures left empty: the scrape {when} the replay failed: {s.error}"
    try:
        return group_metrics(before.text or "", after.text or "").columns(), ""
    except ValueError as exc:  # prometheus_client's parser: not the text exposition format
        return {}, f"spec-decode figures left empty: /metrics is not Prometheus text: {exc}"[:500]


def parse(text: str) -> Samples:
    """Every sample of a scrape; `_created` timestamps are left out (they are not counts)."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def delta(before: Samples, after: Samples) -> Samples:
    """after - before per sample; a sample new in `after` counts from zero."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of `name` over the samples whose labels include `labels` (e.g. over engines)."""
    return sum(v for (n, lab), v in samples.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items()))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, lab), v in samples.items():
        d = dict(lab)
        if n == name and label in d:
            out[d[label]] = out.get(d[label], 0.0) + v
    return out


@dataclass(frozen=True)
class GroupMetrics:
    """The figures of the requests sent between two scrapes (for the runner: a whole server group)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    acceptance_rate: float | None = None  # accepted / draft tokens
    mean_acceptance_length: float | None = None  # 1 + accepted / drafts (tokens per target step)
    accepted_per_position: tuple[float, ...] = ()  # acceptance rate at draft position 0, 1, ...
    finished: Mapping[str, float] = field(default_factory=dict)  # requests by finished_reason

    def columns(self) -> dict[str, float | list[float] | None]:
        """The `spec_*` columns of a cell row."""
        return {"spec_drafts": self.drafts, "spec_draft_tokens": self.draft_tokens,
                "spec_accepted_tokens": self.accepted_tokens, "spec_acceptance_rate": self.acceptance_rate,
                "spec_mean_acceptance_length": self.mean_acceptance_length,
                "spec_accepted_per_position": list(self.accepted_per_position)}


def group_metrics(before: str | Samples, after: str | Samples) -> GroupMetrics:
    """The figures for the requests sent between two scrapes (texts or parsed samples)."""
    b = parse(before) if isinstance(before, str) else before
    a = parse(after) if isinstance(after, str) else after
    d = delta(b, a)
    drafts, draft_tokens, accepted = total(d, DRAFTS), total(d, DRAFT_TOKENS), total(d, ACCEPTED)
    per_pos = by_label(d, ACCEPTED_PER_POS, "position")
    positions = tuple(per_pos[p] / drafts if drafts else 0.0 for p in sorted(per_pos, key=int))
    finished = {k: v for k, v in by_label(d, SUCCESS, "finished_reason").items() if v}
    return GroupMetrics(
        drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
        acceptance_rate=accepted / draft_tokens if draft_tokens else None,
        mean_acceptance_length=1 + accepted / drafts if drafts else None,
        accepted_per_position=positions, finished=finished)
