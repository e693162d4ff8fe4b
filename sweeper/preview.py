"""What `--dry-run` prints: each server a plan would start, with the cells that share it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweeper.matrix import canonical
from sweeper.sweep import Plan


def plan_text(plan: Plan) -> list[tuple[str, list[str]]]:
    """For --dry-run: each server to start, with the cells that reuse it."""
    out = []
    for g in plan.groups:
        head = g.head
        sha = plan.shas.get(head.commit)
        parts = [f"commit {head.commit}" + (f" ({sha[:12]})" if sha and sha != head.commit else ""), f"spec {head.spec_method}"
                 + (f" x{head.num_speculative_tokens}" if head.num_speculative_tokens else "")]
        if head.async_scheduling is not None:
            parts.append("async" if head.async_scheduling else "no-async")
        if head.attention_backend:
            parts.append(head.attention_backend)
        parts += [f"{k}={v}" for k, v in head.env.items() if _is_axis(plan, f"env.{k}")]
        parts += [f"{k} {v}" for k, v in head.serve.items() if _is_axis(plan, f"serve.{k}")]
        cells = [c.cell_id + _request_desc(c.request, plan) for c in g.cells]
        out.append((", ".join(parts), cells))
    return out


def _is_axis(plan: Plan, name: str) -> bool:
    return any(n == name for n, _ in plan.matrix.axes) or any(name in c.values for c in plan.matrix.cells)


def _request_desc(request: Mapping[str, Any], plan: Plan) -> str:
    fields = [f"{k}={canonical(v)}" for k, v in request.items() if _is_axis(plan, f"request.{k}")]
    return f"  [{', '.join(fields)}]" if fields else ""
