"""A sweep's GPU-hour budget in words: what it fitted and the servers it left untested, said from
the record the manifest keeps (`BudgetRecord`) before the run (the dry run) and after it (the report).
"""

from __future__ import annotations

from collections.abc import Sequence

from sweeper.store.manifest import BudgetRecord, PhaseRecord

SHOWN = 8  # untested servers the report names; the manifest lists them all


def budget_lines(record: BudgetRecord | None, phases: Sequence[PhaseRecord] | None = None) -> list[str]:
    """The budget's lines: with `phases` None, a plan's before it runs (every server left out named,
    one a line); with the phases a run recorded, what it left untested once its zoom phases, which run
    within what the budget leaves, ran some of those servers (counted per axis value)."""
    if record is None:
        return []
    if phases is None:
        return _planned(record)
    return _ran(record, phases)


def _planned(b: BudgetRecord) -> list[str]:
    lines = [(f"budget {b.gpu_hours:g} GPU-hours: {b.servers} of {b.servers + b.left_servers} "
              f"servers fit ({b.modelled_hours:,.2f} GPU-hours modelled)")]
    if b.left_servers:
        lines.append(f"left untested: {b.left_servers} servers, {b.left_cells} cells:")
        lines += [f"    {g}" for g in b.left_groups]
    return lines


def _ran(b: BudgetRecord, phases: Sequence[PhaseRecord]) -> list[str]:
    lines = [(f"budget: {b.gpu_hours:g} GPU-hours: {b.servers} servers ({b.cells} cells) fitted, modelled at "
              f"{b.modelled_hours:.3f} GPU-hours")]
    zoomed = {g for p in phases if p.kind == "zoom" for g in p.groups}
    if zoomed:
        lines.append(f"  then zoom phases within what was left: {len(zoomed)} servers")
    left = [g for g in b.left_groups if g not in zoomed]
    if not b.left_servers or not left:
        lines.append("  nothing left untested" if not b.left_servers else
                     "  nothing of the design left untested (the zoom ran what the budget had left out)")
        return lines
    shown = ", ".join(left[:SHOWN]) + (f", … ({len(left) - SHOWN} more)" if len(left) > SHOWN else "")
    cells = f" ({b.left_cells} cells)" if len(left) == b.left_servers else ""
    lines.append(f"  left untested: {len(left)} servers{cells}: {shown}")
    return lines
