"""What a bisect knows of each cell it bisects: the server starts stored at each commit.

Stored rows become server starts in one place (`server_starts`): a start's cell row says how it
went, its sample rows what each request failed. The starts come from every run under `runs/`
(`load_evidence`, which is also how `--resume` spends no probe twice), from one sweep run
(`run_starts`, to choose the cells), or from a probe that just came back.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sweeper.judge import modes as fm
from sweeper.spec.matrix import Cell, canonical
from sweeper.spec.suite import Suite
from sweeper.store import frames as analysis
from sweeper.store.catalogue import Wanted
from sweeper.store.location import Location
from sweeper.store.run_folder import RunDir

Sets = list[tuple[str, frozenset[str]]]  # per sample: (case_id, failed check labels)


@dataclass
class StartRecord:
    """One server start of one cell at one commit: the label sets of its samples."""

    key: tuple[str, str]  # (run_id, group_id): sorts the same way on every rebuild
    sets: Sets
    reused: bool


@dataclass
class Evidence:
    starts: list[StartRecord] = field(default_factory=list)
    skip: str | None = None


@dataclass
class Target:
    """One bisected cell: its settings (the commit aside) and what is known at each commit."""

    cell: Cell
    evidence: dict[str, Evidence] = field(default_factory=lambda: defaultdict(Evidence))

    @property
    def settings_key(self) -> str:
        return self.cell.settings_key

    @property
    def settings(self) -> dict[str, Any]:
        return {k: v for k, v in self.cell.values.items() if k != "commit"}

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v if isinstance(v, str) else canonical(v)}"
                        for k, v in self.settings.items()) or "(the only cell)"

    def add(self, start: ServerStart, reused: bool) -> None:
        """A start that says something about the cell is evidence; one that does not makes its
        commit untestable for the cell."""
        ev = self.evidence[start.commit_sha]
        if start.sets:
            ev.starts.append(StartRecord(start.key, start.sets, reused))
        else:
            ev.skip = start.skip


@dataclass(frozen=True)
class ServerStart:
    """One stored server start of one cell setting at one commit."""

    settings_key: str
    commit_sha: str
    run_id: str
    group_id: str
    status: str
    detail: str
    sets: Sets  # empty: the start says nothing about the cell (see `modes.start_sets`)

    @property
    def key(self) -> tuple[str, str]:
        return (self.run_id, self.group_id)

    @property
    def skip(self) -> str:
        """Why the start says nothing about the cell: its status and detail."""
        return f"{self.status}: {self.detail}"


CELL_COLUMNS = ["run_id", "group_id", "settings_key", "commit_sha", "status", "status_detail", "failure_signature"]
SAMPLE_COLUMNS = ["run_id", "group_id", "settings_key", "commit_sha", "case_id", "failed_checks"]


def server_starts(cells: Iterable[Mapping[str, Any]], samples: Iterable[Mapping[str, Any]],
                  labels: Mapping[tuple[str, str], str]) -> list[ServerStart]:
    """Cell rows and sample rows (the `CELL_COLUMNS` and `SAMPLE_COLUMNS` of any number of runs)
    as server starts, one per cell row, in (settings, commit, run, group) order. Samples without
    a cell row belong to no start."""
    rows: dict[tuple[str, str, str, str], list[tuple[str, list[str] | None]]] = defaultdict(list)
    for r in samples:
        rows[(r["settings_key"], r["commit_sha"], r["run_id"], r["group_id"])].append((r["case_id"], r["failed_checks"]))
    started: dict[tuple[str, str, str, str], Mapping[str, Any]] = {}
    for r in cells:
        started[(r["settings_key"], r["commit_sha"], r["run_id"], r["group_id"])] = r
    out = []
    for key in sorted(started):
        r = started[key]
        sets = fm.start_sets(r["status"], r["failure_signature"], rows.get(key, []), labels) or []
        out.append(ServerStart(*key, r["status"], r["status_detail"] or "", sets))
    return out


def load_evidence(runs_dir: str | os.PathLike[str] | Location, targets: Sequence[Target], suite: Suite,
                  shas: set[str], labels: dict[tuple[str, str], str], this_run: str) -> None:
    """Fill each target's evidence from every stored run: samples grouped by server start, and the
    commits where the cell could not be tested. Only the files whose catalogue entries hold these
    settings, commits and suite are opened, and only the columns and rows asked for are read: the
    cost follows what matches, not the size of the whole folder."""
    by_key = {t.settings_key: t for t in targets}
    wanted = Wanted(frozenset(by_key), suite.digest, frozenset(shas))
    base = (pc.field("suite_digest") == suite.digest) & pc.field("settings_key").isin(pa.array(sorted(by_key))) \
        & pc.field("commit_sha").isin(pa.array(sorted(shas)))
    read = analysis.read_matching(runs_dir, wanted, {"cells": CELL_COLUMNS, "samples": SAMPLE_COLUMNS}, base)
    for start in server_starts(read["cells"].to_pylist(), read["samples"].to_pylist(), labels):
        by_key[start.settings_key].add(start, start.run_id != this_run)


def run_starts(run: RunDir, settings_keys: set[str], labels: Mapping[tuple[str, str], str]) -> list[ServerStart]:
    """The server starts one run stored of these cell settings."""
    def rows(kind: str, columns: list[str]) -> list[dict[str, Any]]:
        return [r for r in analysis.load_table(run, kind).select(columns).to_pylist()
                if r["settings_key"] in settings_keys]

    return server_starts(rows("cells", CELL_COLUMNS), rows("samples", SAMPLE_COLUMNS), labels)
