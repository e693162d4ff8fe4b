"""A triage's record, `triage.json`: what it was asked, its phases and its failure modes. Pure.

`triage.json`, schema "sweep-triage/1":

    schema        "sweep-triage/1"
    run_id        the triage run (a folder under the runs folder; its phases are runs under `phases/`)
    matrix_path, good, bad, good_sha, bad_sha, design ("covering:3", "full"), budget_h (or null)
    created, updated, final (false until every report is written)
    phases[]      in the order they run:
      name          "bad", "good", "bisect", "metric-bisect-N" (the N-th `expect:` mode's), "at-<sha10>"
                    (a sweep at a mode's first bad commit)
      kind          "sweep" | "bisect" | "metric-bisect"
      run_id        the phase's run under phases/ (`sweep report` reads it like any other run)
      status        "planned" | "done" | "skipped" (what a budget left undone: `note` says why)
      modelled_gpu_s  the cost model's figure before it ran (null: not modelled)
      gpu_s         GPU-seconds its servers took (the cells' gpu_seconds)
      starts        server starts it made (its server logs)
      reused_samples  samples it took from the phases before instead of running them
      note          free text
    modes[]       one per failure mode reported:
      mode          the mode's name (as `--explain` and `sweep bisect` name it)
      conjunction   the explanation ("spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1"), or null
      explained_in  the phase whose samples the conjunction is read on
      cell          {axis: value} (commit aside) of the cell bisected for it, or null
      brought_by    COMMIT (sweep-bisect/2) with `confidence`, or null; for a mode of an `expect:` bound
                    (bisected by the metric bisect, phase "metric-bisect-N") also `metric`, `unit`,
                    `load_point`, `before`, `after`, `effect`, `effect_low`, `effect_high` (95 %) and
                    `bisect_run` (keys added, same schema: older readers ignore them)
      fixed_by      COMMIT with `confidence`, or null
      fails_at_bad  whether it still fails at bad
      report        the Markdown file, relative to the triage run
    html          the HTML page over every mode, relative to the triage run
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper.errors import StoreError

SCHEMA = "sweep-triage/1"
RECORD = "triage.json"


@dataclass
class Phase:
    name: str
    kind: str  # "sweep" | "bisect"
    run_id: str
    status: str = "planned"  # "planned" | "done" | "skipped"
    modelled_gpu_s: float | None = None
    gpu_s: float = 0.0
    starts: int = 0
    reused_samples: int = 0
    note: str = ""


@dataclass
class Mode:
    mode: str
    conjunction: str | None = None
    explained_in: str | None = None
    cell: dict[str, Any] | None = None
    brought_by: dict[str, Any] | None = None
    fixed_by: dict[str, Any] | None = None
    fails_at_bad: bool = False
    report: str | None = None


@dataclass
class TriageRecord:
    run_id: str
    matrix_path: str
    good: str
    bad: str
    good_sha: str
    bad_sha: str
    design: str
    budget_h: float | None = None
    created: str | None = None
    updated: str | None = None
    final: bool = False
    phases: list[Phase] = field(default_factory=list)
    modes: list[Mode] = field(default_factory=list)
    html: str | None = None

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    def add_phase(self, phase: Phase) -> Phase:
        """`phase`, or the one of that name recorded already (a resumed triage keeps its figures)."""
        old = self.phase(phase.name)
        if old is not None:
            return old
        self.phases.append(phase)
        return phase

    @property
    def gpu_s(self) -> float:
        return sum(p.gpu_s for p in self.phases)

    @property
    def starts(self) -> int:
        return sum(p.starts for p in self.phases)


def to_json(record: TriageRecord) -> dict[str, Any]:
    return {"schema": SCHEMA, **dataclasses.asdict(record)}


def from_json(data: Any, where: str) -> TriageRecord:
    """The record in `data` (a parsed triage.json); a StoreError naming `where` if it is not one."""
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
        raise StoreError(f"{where}: not a triage record (schema {found!r}, expected {SCHEMA!r})")
    try:
        fields = {f.name for f in dataclasses.fields(TriageRecord)}
        body = {k: v for k, v in data.items() if k in fields}
        body["phases"] = [Phase(**p) for p in data.get("phases") or []]
        body["modes"] = [Mode(**m) for m in data.get("modes") or []]
        return TriageRecord(**body)
    except TypeError as exc:
        raise StoreError(f"{where}: damaged triage record ({exc})") from None
