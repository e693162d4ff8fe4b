"""What a bisect run has already probed, read back from its folder: how its probes are numbered, how
many server starts it made, its rounds, the GPU time they took and the commits it installed. The
failure bisect and the metric bisect resume from it alike."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sweeper.plan.budget import Ledger
from sweeper.store import frames
from sweeper.store.run_folder import RunDir

# A probe's group name: `p0007-<short sha>`.
PROBE_NAME = re.compile(r"p(\d+)-")


@dataclass(frozen=True)
class ProbesOnDisk:
    last_number: int  # the highest probe number on disk: a new probe takes the next one
    starts: int  # server starts stored
    rounds: int
    gpu_seconds: float
    installed: frozenset[str]  # commits this run installed (a later start there pays no install)


def probes_on_disk(run: RunDir) -> ProbesOnDisk:
    probes = frames.load_table(run, "probes")
    # Numbered after every probe on disk: a run killed between a probe's results and its probe row
    # keeps that start's results (they are evidence), and no new probe may take its name.
    named = set(probes.column("group_id").to_pylist()) if probes.num_rows else set()
    named |= run.done_groups()
    numbers = [int(m.group(1)) for g in named if (m := PROBE_NAME.match(g))]
    # Starts are the probes on disk, counted apart from the numbering: a start killed with its driver
    # before anything was stored leaves its number unused, and is no evidence.
    return ProbesOnDisk(
        last_number=max(numbers, default=0), starts=len(numbers),
        rounds=int(pc.max(probes["round"]).as_py() or 0) if probes.num_rows else 0,
        gpu_seconds=float(pc.sum(probes["gpu_seconds"]).as_py() or 0.0) if probes.num_rows else 0.0,
        installed=frozenset(probes.column("commit_sha").to_pylist()) if probes.num_rows else frozenset())


def as_probe(tbl: pa.Table, name: str) -> pa.Table:
    """A probe's result rows under the probe's name: stored evidence keeps repeated starts of one
    server key apart (per-start variation is learned from them)."""
    i = tbl.schema.get_field_index("group_id")
    return tbl.set_column(i, tbl.schema.field(i), pa.array([name] * tbl.num_rows, pa.string()))


def budget_record(budget_h: float | None, ledger: Ledger) -> dict[str, object] | None:
    """What `bisect.json` says of a `--budget` (None without one)."""
    if budget_h is None:
        return None
    return {"gpu_hours": budget_h, "spent_gpu_hours": ledger.spent_s / 3600.0, "exhausted": ledger.exhausted}
