"""`sweep report RUN_A --against RUN_B`: what changed from run B to run A, cell by cell (reads results only).

Cells are matched by their settings, the commit aside (before/after a vLLM upgrade the commit is
what differs); a run holding several commits of the same settings is matched commit by commit
too. Per matched cell: the failure-rate change A − B with Newcombe's hybrid-score 95 % interval and
Fisher's exact test, Benjamini–Hochberg-corrected over the matched cells. Failure modes are the
ones bisect uses, assigned over both runs at once so their names agree, and counted over the matched
cells only (a mode's rate over all of A against all of B would pool different cells and commits);
modes that appear in A or vanish from B are listed first. Settings fixed in either matrix (model,
`env`, `serve`, `request`) that differ between the runs are listed first of all: each matched cell
differs in them too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from rich.table import Table
from scipy.stats import false_discovery_control, fisher_exact

from sweeper.judge.explain import Count, classify, display_axis, value_text
from sweeper.judge.stats import wilson
from sweeper.spec.suite import Suite


@dataclass(frozen=True)
class ModeShift:
    mode: str
    kind: str  # "appeared" (in A only), "vanished" (in B only), "both"
    before: Count  # run B: failures of this mode / samples of the cases that can show it
    after: Count  # run A


@dataclass(frozen=True)
class CellChange:
    settings: tuple[tuple[str, str], ...]  # (axis, value) the cells share
    before: Count
    after: Count
    status_before: str
    status_after: str
    diff: float | None  # after − before rate
    low: float | None
    high: float | None
    p: float | None
    q: float | None  # Benjamini–Hochberg over the matched cells
    significant: bool

    @property
    def label(self) -> str:
        return " ".join(f"{display_axis(a)}={v}" for a, v in self.settings)


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    modes: tuple[ModeShift, ...]
    cells: tuple[CellChange, ...]
    only_a: tuple[str, ...]  # settings labels without a partner
    only_b: tuple[str, ...]
    alpha: float
    fixed_differ: tuple[tuple[str, str, str], ...] = ()  # (setting, in A, in B) fixed in a matrix, differing


def fixed_settings(manifest: Any) -> dict[str, str]:
    """The settings a run's matrix fixes for every cell: `model`, `env.X`, `serve.--flag`,
    `request.field` (values as text; secrets, by name, as `<redacted>`). {} without a manifest."""
    from sweeper.reports.bug import is_secret

    matrix = getattr(manifest, "matrix", None) or {}
    out: dict[str, str] = {}
    if matrix.get("model") is not None:
        out["model"] = str(matrix["model"])
    for section in ("env", "serve", "request"):
        for name, value in dict(matrix.get(section) or {}).items():
            out[f"{section}.{name}"] = "<redacted>" if is_secret(str(name)) else str(value_text(value))
    return out


def _differing(a: Mapping[str, str], b: Mapping[str, str]) -> tuple[tuple[str, str, str], ...]:
    return tuple((k, a.get(k, "(not set)"), b.get(k, "(not set)")) for k in dict.fromkeys([*a, *b])
                 if a.get(k) != b.get(k))


def newcombe(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float, float]:
    """p1 − p2 with Newcombe's hybrid score interval (method 10), from two Wilson intervals."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1)
    l2, u2 = wilson(k2, n2)
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _axes(row: Mapping[str, Any]) -> dict[str, str | None]:
    raw = row.get("axes")
    pairs = raw.items() if isinstance(raw, dict) else (raw if raw is not None else [])
    return {str(k): value_text(json.loads(v)) for k, v in pairs}


def _keys(cells: pd.DataFrame, with_commit: bool) -> dict[tuple[tuple[str, str], ...], list[Mapping[str, Any]]]:
    out: dict[tuple[tuple[str, str], ...], list[Mapping[str, Any]]] = {}
    for row in cells.to_dict("records"):
        axes = {k: v for k, v in _axes(row).items() if v is not None and (with_commit or k != "commit")}
        out.setdefault(tuple(sorted(axes.items())), []).append(row)
    return out


def _merge_suites(a: Suite | None, b: Suite | None) -> Suite | None:
    if a is None or b is None or a.digest == b.digest:
        return a or b
    cases = {c.case_id: c for c in b.cases} | {c.case_id: c for c in a.cases}
    digest = hashlib.sha256((a.digest + b.digest).encode()).hexdigest()
    return dataclasses.replace(a, name=f"{a.name}+{b.name}", cases=tuple(cases.values()), digest=digest)


# Two runs side by side: each of their parts is a pair (samples, cells, suite, name, fixed settings).
def compare(samples_a: pd.DataFrame, cells_a: pd.DataFrame, samples_b: pd.DataFrame, cells_b: pd.DataFrame, *,  # noqa: PLR0913
            suite_a: Suite | None = None, suite_b: Suite | None = None, run_a: str = "A", run_b: str = "B",
            alpha: float = 0.05, fixed_a: Mapping[str, str] | None = None,
            fixed_b: Mapping[str, str] | None = None) -> Comparison:
    """`fixed_a`/`fixed_b`: the settings each run's matrix fixes (`fixed_settings`)."""
    # Several commits of the same settings in either run: match commit by commit.
    plain_a, plain_b = _keys(cells_a, False), _keys(cells_b, False)
    with_commit = any(len(v) > 1 for v in [*plain_a.values(), *plain_b.values()])
    keyed_a, keyed_b = (_keys(cells_a, True), _keys(cells_b, True)) if with_commit else (plain_a, plain_b)
    matched = [k for k in keyed_a if k in keyed_b]
    # The modes over the matched cells only: the same settings (and commits) on both sides.
    ids_a = {str(keyed_a[k][0].get("cell_id")) for k in matched}
    ids_b = {str(keyed_b[k][0].get("cell_id")) for k in matched}
    if "cell_id" in samples_a.columns:
        samples_a = samples_a[samples_a["cell_id"].astype(str).isin(ids_a)]
    if "cell_id" in samples_b.columns:
        samples_b = samples_b[samples_b["cell_id"].astype(str).isin(ids_b)]
    both = pd.concat([samples_a.assign(_run="a"), samples_b.assign(_run="b")], ignore_index=True)
    classified = classify(both, _merge_suites(suite_a, suite_b)) if not both.empty else None
    shifts = []
    if classified is not None:
        runs = list(both["_run"])
        cases = list(both["case_id"].astype(str))
        for mode in sorted({m for m in classified.mode if m}):
            can = classified.cases[mode]
            fail: Counter[str] = Counter()
            seen: Counter[str] = Counter()
            for run, case, m in zip(runs, cases, classified.mode, strict=True):
                if case in can:
                    seen[run] += 1
                    fail[run] += m == mode
            kind = "both" if fail["a"] and fail["b"] else ("appeared" if fail["a"] else "vanished")
            shifts.append(ModeShift(mode, kind, Count(fail["b"], seen["b"]), Count(fail["a"], seen["a"])))
    order = {"appeared": 0, "vanished": 1, "both": 2}
    shifts.sort(key=lambda s: (order[s.kind], -(s.after.failed + s.before.failed)))

    rows: list[tuple[Any, ...]] = []
    for key in matched:
        ra, rb = keyed_a[key][0], keyed_b[key][0]
        ka, na = int(ra.get("n_failed") or 0), int(ra.get("n_samples") or 0)
        kb, nb = int(rb.get("n_failed") or 0), int(rb.get("n_samples") or 0)
        diff = low = high = p = None
        if na and nb:
            diff, low, high = newcombe(ka, na, kb, nb)
            p = float(fisher_exact([[ka, na - ka], [kb, nb - kb]])[1])
        settings = tuple((k, v) for k, v in _axes(ra).items() if (k, v) in key)  # in the matrix's axis order
        rows.append((settings, Count(kb, nb), Count(ka, na), str(rb.get("status")), str(ra.get("status")), diff, low, high, p))
    tested = [i for i, r in enumerate(rows) if r[8] is not None]
    qs = false_discovery_control([rows[i][8] for i in tested]) if tested else []
    qmap = {i: float(q) for i, q in zip(tested, qs, strict=True)}
    changes = [CellChange(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], qmap.get(i),
                          qmap.get(i, 1.0) < alpha or r[3] != r[4]) for i, r in enumerate(rows)]
    changes.sort(key=lambda c: (not c.significant, -(abs(c.diff) if c.diff is not None else 1.0), c.label))

    def label(k: tuple[tuple[str, str], ...]) -> str:
        return " ".join(f"{display_axis(a)}={v}" for a, v in k)
    return Comparison(run_a, run_b, tuple(shifts), tuple(changes),
                      tuple(label(k) for k in keyed_a if k not in keyed_b),
                      tuple(label(k) for k in keyed_b if k not in keyed_a), alpha,
                      _differing(fixed_a or {}, fixed_b or {}))


def _rate(c: Count) -> str:
    return f"{c} ({100 * c.failed / c.n:.1f}%)" if c.n else "—"


def render(cmp: Comparison) -> list[str]:
    """Plain lines: the modes that appeared or vanished first, then every matched cell."""
    out = [f"run {cmp.run_a} against {cmp.run_b} (change = {cmp.run_a} − {cmp.run_b})"]
    for setting, a, b in cmp.fixed_differ:
        out.append(f"  warning: fixed setting {setting} differs: {a} in {cmp.run_a}, {b} in {cmp.run_b} "
                   "(every matched cell differs in it too)")
    out.append(f"  failure modes over the {len(cmp.cells)} matched cells only"
               + (f" ({len(cmp.only_a)} only in {cmp.run_a}, {len(cmp.only_b)} only in {cmp.run_b} left out)"
                  if cmp.only_a or cmp.only_b else ""))
    words = {"appeared": f"appeared in {cmp.run_a}", "vanished": f"vanished in {cmp.run_a}", "both": "in both"}
    for s in cmp.modes:
        out.append(f"  mode {words[s.kind]}: {s.mode}: {_rate(s.before)} → {_rate(s.after)}")
    if not cmp.modes:
        out.append("  no failures in either run")
    return out


def table(cmp: Comparison) -> Table:
    """The matched cells as a terminal table, significant changes first."""
    out = Table(title=f"{cmp.run_a} against {cmp.run_b}: {len(cmp.cells)} matched cells")
    for name, justify in (("settings", "left"), (f"failed ({cmp.run_b})", "right"), (f"failed ({cmp.run_a})", "right"),
                          ("change [95% CI]", "right"), ("BH q", "right"), ("", "left")):
        out.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in cell_rows(cmp):
        style = "red" if "worse" in row[5] or "→" in row[5] else ("green" if "better" in row[5] else "")
        out.add_row(*row, style=style or None)
    if cmp.only_a or cmp.only_b:
        out.caption = (f"unmatched: {len(cmp.only_a)} cells only in {cmp.run_a}, "
                       f"{len(cmp.only_b)} only in {cmp.run_b}")
    return out


def cell_rows(cmp: Comparison) -> list[tuple[str, ...]]:
    """One row per matched cell: settings, before, after, change [95% CI], q, flag."""
    rows: list[tuple[str, ...]] = []
    for c in cmp.cells:
        change = "—" if c.diff is None else f"{100 * c.diff:+.1f} pp [{100 * c.low:+.1f}, {100 * c.high:+.1f}]"  # type: ignore[operator]
        flag = ""
        if c.status_before != c.status_after:
            flag = f"{c.status_before} → {c.status_after}"
        elif c.significant and c.diff is not None:
            flag = "▲ worse" if c.diff > 0 else "▼ better"
        q = "—" if c.q is None else (f"{c.q:.2g}" if c.q >= 1e-4 else "<1e-4")
        rows.append((c.label, _rate(c.before), _rate(c.after), change, q, flag))
    return rows

