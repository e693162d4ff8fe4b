"""The bisect verdict as a triager reads it: changes grouped by commit with their cells listed
compactly, a fix that swaps one failure mode for another said as such, the stored starts reused,
one `--issue` command per change, and the progress line of a round. Searches driven by scripted
counts (no servers)."""

from __future__ import annotations

from typing import Any

from test_bisect import commits, drive

from sweeper.bisect import Search
from sweeper.reports.bisect import ReportCell, compact_cells, describe, named_commits, render
from sweeper.reports.bisect_progress import beliefs, round_line

N = 40
SWAP, LATER = 12, 30


def history(i: int, runner: str) -> dict[str, float]:
    """Mode a (the FSM error) until SWAP, where a fix ends it and brings mode b (whitespace tails);
    mode c (the thinking budget) from LATER, on runner V2 only."""
    rates = {"a": 0.0 if i >= SWAP else 0.4, "b": 0.3 if i >= SWAP else 0.0}
    if runner == "1":
        rates["c"] = 0.5 if i >= LATER else 0.0
    return rates


def summary() -> dict[str, Any]:
    cs = commits(N)
    cells, reports = [], []
    for runner in ("0", "1"):
        for temp in (0, 0.6):
            settings = {"spec_method": "mtp", "env.VLLM_USE_V2_MODEL_RUNNER": runner, "request.temperature": temp}
            label = " ".join(f"{k}={v}" for k, v in settings.items())
            cells.append(ReportCell(settings, label, f"{runner}-{temp}"))
            reports.append(drive(Search(cs), lambda i, r=runner: history(i, r), k=4))
    info = {c: {"sha": c, "short": c, "subject": f"Fix thing {c} (#4{c[1:]})" if c == f"c{SWAP}" else f"commit {c}",
                "pr": None, "date": None} for c in named_commits(reports)}
    out = describe(reports, cells, cs, info)
    out.update({"run_id": "bis", "issue_run": "demo", "rounds": 9, "server_starts": 30, "reused_samples": 800,
                "gpu_seconds": 120.0, "reused_starts": [{"run_id": "demo", "group_id": f"g{i}", "commit": c}
                                                        for i, c in enumerate(("c0", "c40"))]})
    return out


def test_the_verdict_is_grouped_by_change_with_its_cells_compact_and_ends_with_the_next_step() -> None:
    text = render(summary())
    lines = text.splitlines()
    assert lines[0] == "Changes by commit (newest first):"
    # The fix at SWAP changed all four cells: one line for them, not four blocks.
    assert ("      4 cells: spec_method=mtp env.VLLM_USE_V2_MODEL_RUNNER∈{0, 1} request.temperature∈{0, 0.6}"
            in lines)
    assert "      2 cells: spec_method=mtp env.VLLM_USE_V2_MODEL_RUNNER=1 request.temperature∈{0, 0.6}" in lines
    assert any(ln.startswith("    fix of a: ") for ln in lines)
    assert any(ln.startswith("    regression of b: ") for ln in lines)
    assert "    a swap, not a fix: it ends a but brings b in 4 cell(s), which still fail" in lines
    # No per-cell block repeats what the grouped view said.
    assert not any(ln.startswith("cell spec_method") for ln in lines)
    assert len(lines) < 30
    assert "reused 2 stored server start(s) of run demo (at c0, c40) before probing" in text
    assert lines[-4] == "Next: a bug report per change:"
    assert lines[-3:] == [
        f"  sweep report demo --issue --mode c   # regression at c{LATER}",
        f"  sweep report demo --issue --mode a   # fix at c{SWAP}",
        f"  sweep report demo --issue --mode b   # regression at c{SWAP}",
    ]


def test_the_swap_is_in_the_json_and_one_cell_says_it_too() -> None:
    s = summary()
    (entry,) = [e for e in s["by_commit"] if e["commit"]["sha"] == f"c{SWAP}"]
    (swap,) = entry["swaps"]
    assert swap["fixed"] == "a" and swap["brought"] == "b" and len(swap["cells"]) == 4
    one = {**s, "cells": s["cells"][:1], "by_commit": [{**e, "changes": [{**c, "cells": c["cells"][:1]}
                                                                         for c in e["changes"]],
                                                        "swaps": [{**w, "cells": w["cells"][:1]} for w in e["swaps"]]}
                                                       for e in s["by_commit"] if e["commit"]["sha"] == f"c{SWAP}"]}
    assert "is a swap, not a fix: it ends a but brings b; the cell still fails" in render(one)


def test_one_bug_report_per_mode_names_each_of_its_changes() -> None:
    s = summary()
    regress = {"mode": "a", "direction": "regression", "confidence": 0.999, "cells": ["x"], "settings": [{"k": 1}]}
    s["by_commit"].append({"commit": {"sha": "c3", "short": "c3", "subject": "s", "pr": None, "date": None},
                           "changes": [regress], "swaps": []})
    lines = render(s).splitlines()
    assert f"  sweep report demo --issue --mode a   # fix at c{SWAP}, regression at c3" in lines
    assert sum("--mode a " in ln for ln in lines) == 1


def test_cells_that_are_not_a_product_are_listed_by_what_varies() -> None:
    cells = [{"spec": "mtp", "v2": "1", "t": 0}, {"spec": "mtp", "v2": "0", "t": 0.6}]
    assert compact_cells(cells) == "2 cells: spec=mtp {v2=0 t=0.6; v2=1 t=0}"
    assert compact_cells([{"spec": "mtp"}]) == "spec=mtp"


def test_a_rounds_line_says_how_far_what_it_cost_and_what_it_believes() -> None:
    cs = commits(N)
    search = Search(cs)
    for _ in range(2):  # two rounds of four: the endpoints, then the range split
        for req in search.ask(4):
            search.tell(req.commit, req.samples, {m: round(r * req.samples) for m, r in history(req.index, "0").items()})
    found = beliefs([search.result()], cs)
    assert found and found[0].mode in {"a", "b"} and 0 < found[0].probability <= 1
    line = round_line(2, [5, 10, 20, 30], N, starts=8, reused_starts=2, gpu_seconds=64.4, found=found)
    assert line.startswith("round 2: 4 starts at positions 5, 10, 20, 30 of 40; 8 starts so far (+2 stored, reused), "
                           "64 GPU-s; best so far: ")
    assert f"{found[0].mode} → {found[0].commit} {100 * found[0].probability:.0f}%" in line
