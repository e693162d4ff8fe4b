"""What `--dry-run` prints: each server a plan would start, with the cells that share it, and what
the plan's design covers and costs next to the full product."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sweeper.plan.cost import Estimate
from sweeper.plan.sweep_plan import Plan
from sweeper.reports.budget import budget_lines
from sweeper.spec.matrix import Cell, canonical
from sweeper.store.plan_records import budget_record


def serve_line(plan: Plan, cell: Cell) -> str:
    """The `vllm serve` command line and environment that will start this cell's server, as requested
    (the flags the installed version offers are learnt at start; secrets shown as <redacted>; the port
    is chosen then too)."""
    from sweeper.reports.bug import Redactor, shell_command
    from sweeper.vllm.flags import Command, serve_command

    spec = plan.matrix.spec
    launch = serve_command(cell, model=spec.model, spec_config=spec.spec_config, installed=Command(("vllm", "serve")),
                           host="127.0.0.1", port=8000, api_key=None)
    redact = Redactor(plan.matrix.raw)
    return redact.text(shell_command(redact.argv(launch.argv), redact.env(dict(launch.env))).replace(" \\\n", " "))


def plan_text(plan: Plan) -> list[tuple[str, list[str]]]:
    """For --dry-run: each server to start (its settings, then its `vllm serve` line), with the
    cells that reuse it."""
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
        out.append((", ".join(parts) + "\n    $ " + serve_line(plan, head), cells))
    return out


def _is_axis(plan: Plan, name: str) -> bool:
    return any(n == name for n, _ in plan.matrix.axes) or any(name in c.values for c in plan.matrix.cells)


def _request_desc(request: Mapping[str, Any], plan: Plan) -> str:
    fields = [f"{k}={canonical(v)}" for k, v in request.items() if _is_axis(plan, f"request.{k}")]
    return f"  [{', '.join(fields)}]" if fields else ""


def design_text(plan: Plan) -> list[str]:
    """For --dry-run: the design's coverage, and its modelled GPU time next to the full product's."""
    d, p = plan.design, plan.profile
    full_groups = plan.matrix.groups()
    if d.spec.kind == "full":
        lines = [f"design: full product, {len(d.groups)} servers, {len(d.cells)} cells"]
    else:
        lines = [(f"design: {d.describe()}: {len(d.groups)} of {d.full_groups} servers, "
                  f"{len(d.cells)} of {d.full_cells} cells")]
    rule = plan.rule
    if rule is not None:
        lines.append(f"adaptive: each cell stops once settled (failing above {rule.threshold:.0%}, clean below "
                     f"{rule.detect:.0%}, at {rule.confidence:.0%}; rounds of {rule.round}): modelled at "
                     f"{plan.modelled_requests_per_cell()} of {plan.requests_per_cell()} requests per cell, "
                     "the samples that settle a clean cell")
    gpus = plan.matrix.spec.gpus_per_cell
    lines.append(f"modelled GPU time ({p.source}: install {p.install_s:g} s, start {p.start_s:g} s, "
                 f"request {p.request_s:g} s; {gpus:g} GPU{'' if gpus == 1 else 's'} per server):")
    this = "this design" + (", adaptive" if rule is not None else "") + (", in the budget" if plan.budget else "")
    rows = [(this, plan.estimate())]
    if plan.budget is not None:
        rows.append(("the design, whole" if rule is None else "the design, adaptive", plan.estimate(d.groups)))
    if rule is not None:
        rows.append(("the design, whole suites", plan.estimate(d.groups, adaptive=False)))
    if d.spec.kind != "full":
        rows.append(("full product, whole suites" if rule is not None else "full product",
                     plan.estimate(full_groups, adaptive=False)))
    width = max(len(name) for name, _ in rows)
    lines += [f"  {name:<{width}}  {_estimate(e)}" for name, e in rows]
    lines += budget_lines(budget_record(plan.budget))  # what fits, and the servers left untested
    return lines


def _estimate(e: Estimate) -> str:
    bench = f", {e.bench_s:,.0f} s of load phases" if e.bench_s else ""
    return (f"{e.starts:,} starts, {e.installs:,} installs, {e.requests:,} requests{bench}: "
            f"{e.gpu_hours:,.2f} GPU-hours")
