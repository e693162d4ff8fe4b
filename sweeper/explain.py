"""Which settings make each failure mode fail: the smallest conjunction of axis values behind it. Pure.

Failure modes are the ones bisect uses (`sweeper.bisect.modes`): a failed sample's case and failed
checks, merged into modes by commits seen together. For each mode:

* **Where.** The commits that show it are its scope (the commit is what a bisect explains); the
  samples are those of the cases that can show it (cases whose checks cover one of its signatures).
* **Dimensions.** Every axis but the commit, on the value that RAN: where a cell's effective
  configuration differs from the request (`effective_differs`: async scheduling turned off, Model
  Runner V2 fallen back to V1, an attention backend replaced), the effective value stands in, and
  the term says so. Effective settings no axis asks for (async scheduling left to its default) are
  dimensions of their own. An axis with a single value besides "not applicable" (the number of
  speculative tokens when one spec method is off) is no dimension: it only restates another axis.
* **Candidates.** Every conjunction of at most `max_terms` (axis = value) terms on distinct axes.
  Each is tested with a one-sided Fisher exact test (more failures inside than outside); p-values
  are Holm-corrected over every conjunction tried.
* **The explanation** is the smallest conjunction that (1) holds at least 95 % of the mode's
  failures and (2) has no part that is credibly clean (Fisher, Bonferroni over the parts: one or
  two more terms, or a single cell): "mtp" alone is rejected when its V1 half never fails. Ties go to the
  smaller p-value. If other conjunctions of that size select exactly the same cells, the design
  cannot tell them apart: the result is "not identifiable in this matrix". A mode with no such
  conjunction, or whose best one is not significant after correction, is reported unexplained.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import hypergeom

from sweeper.bisect import modes as fm
from sweeper.suite import Suite

COMMIT = "commit"
COVERAGE = 0.95  # the share of a mode's failures a conjunction must hold
# Axis -> (the name `effective_differs` uses, the cell column of the effective value).
_EFFECTIVE_OF = {
    "spec_method": ("spec_method", "effective_spec_method"),
    "num_speculative_tokens": ("num_speculative_tokens", "effective_num_speculative_tokens"),
    "async_scheduling": ("async_scheduling", "effective_async_scheduling"),
    "attention_backend": ("attention_backend", "effective_attention_backend"),
    "env.VLLM_USE_V2_MODEL_RUNNER": ("model_runner", "effective_model_runner"),
}
# Effective settings that are dimensions of their own when no axis asks for them.
_EFFECTIVE_ONLY = {
    "async_scheduling": "effective_async_scheduling",
    "model_runner": "effective_model_runner",
    "attention_backend": "effective_attention_backend",
}
EFFECTIVE_SUFFIX = " (effective)"


class Verdict(enum.StrEnum):
    EXPLAINED = "explained"
    NOT_IDENTIFIABLE = "not identifiable"  # several conjunctions select the same cells
    EVERYWHERE = "every setting"  # no setting matters: it fails alike in every cell of its commits
    UNEXPLAINED = "unexplained"  # no conjunction of at most max_terms terms separates it
    TOO_FEW = "too few samples"  # the best conjunction is not significant after correction


@dataclass(frozen=True)
class Term:
    axis: str
    value: str
    effective: bool = False  # some cell in scope ran another value than it asked for on this axis

    def __str__(self) -> str:
        mark = "" if self.axis.endswith(EFFECTIVE_SUFFIX) or not self.effective else EFFECTIVE_SUFFIX
        return f"{display_axis(self.axis)}={self.value}{mark}"


@dataclass(frozen=True)
class Count:
    failed: int
    n: int

    def __str__(self) -> str:
        return f"{self.failed:,}/{self.n:,}"


@dataclass(frozen=True)
class Without:
    """The conjunction with one term false: does the rest fail on its own?"""

    term: Term
    count: Count


@dataclass(frozen=True)
class ModeExplanation:
    mode: str
    verdict: Verdict
    terms: tuple[Term, ...]
    inside: Count  # samples where the conjunction holds, on the commits that show the mode
    outside: Count
    p_value: float | None  # one-sided Fisher
    p_adjusted: float | None  # Holm over `tried`
    tried: int
    cases: tuple[str, ...]
    commits: tuple[str, ...]  # commits that show the mode, in history order
    clean_commits: tuple[tuple[str, Count], ...]  # other commits: the same cases where the conjunction holds
    without: tuple[Without, ...] = ()
    alternatives: tuple[tuple[Term, ...], ...] = ()  # same cells selected: not identifiable
    effective_notes: tuple[str, ...] = ()
    failing_cells: tuple[tuple[str, Count], ...] = ()  # cell_id -> this mode's failures there
    failures: int = 0
    cells_in_scope: int = 0

    @property
    def conjunction(self) -> str:
        return " ∧ ".join(map(str, self.terms)) if self.terms else "every setting"


@dataclass(frozen=True)
class Explanation:
    modes: tuple[ModeExplanation, ...]
    alpha: float
    max_terms: int
    n_samples: int
    labels_from_suite: bool


@dataclass
class Classified:
    """Each sample's failure mode (None for a pass), and the cases that can show each mode."""

    mode: list[str | None]
    cases: dict[str, set[str]]
    signatures: dict[str, list[tuple[str, frozenset[str]]]] = field(default_factory=dict)


def display_axis(axis: str) -> str:
    return axis.removeprefix("env.").removeprefix("request.")


def value_text(value: Any) -> str | None:
    """An axis value as a term shows it; None when the axis does not apply to the cell."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _failed_list(value: Any) -> list[str] | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return [str(v) for v in value]


def commit_key(samples: pd.DataFrame) -> list[str]:
    """The identity of each sample's commit for mode assignment: the sha where known."""
    shas = samples["commit_sha"] if "commit_sha" in samples.columns else pd.Series([None] * len(samples))
    return [str(s) if isinstance(s, str) and s else str(c) for s, c in zip(shas, samples[COMMIT], strict=True)]


def classify(samples: pd.DataFrame, suite: Suite | None) -> Classified:
    """The failure mode of every sample, as `sweeper.bisect.modes` assigns them."""
    labels = fm.check_labels(suite) if suite is not None else {}
    rows = [(str(c), _failed_list(f)) for c, f in zip(samples["case_id"], samples["failed_checks"], strict=True)]
    sets = fm.label_sets(rows, labels)
    seen: dict[tuple[str, frozenset[str]], set[str]] = defaultdict(set)
    for key, sha in zip(sets, commit_key(samples), strict=True):
        if key[1]:
            seen[key].add(sha)
    case_checks = fm.case_checks(suite, labels) if suite is not None else {}
    names = fm.assign(seen, case_checks)
    signatures: dict[str, list[tuple[str, frozenset[str]]]] = defaultdict(list)
    for key, name in names.items():
        signatures[name].append(key)
    cases: dict[str, set[str]] = {}
    for name, sigs in signatures.items():
        can = {c for c, _ in sigs}
        # Cases that check every label of one of the mode's signatures could have shown it too.
        can |= {c for c, checks in case_checks.items() if any(s <= checks for _, s in sigs)}
        cases[name] = can
    mode = [names.get(key) if key[1] else None for key in sets]
    return Classified(mode, cases, dict(signatures))


# ---- the per-cell table -------------------------------------------------------------------------

@dataclass
class _Cells:
    ids: list[str]
    commit: list[str]
    dims: dict[str, list[str | None]]  # dimension -> value per cell (effective where it differs)
    requested: dict[str, list[str | None]]
    substituted: dict[str, list[bool]]


def _cell_table(samples: pd.DataFrame, cells: pd.DataFrame | None) -> _Cells:
    first = samples.drop_duplicates("cell_id")
    ids = [str(c) for c in first["cell_id"]]
    axes: dict[str, dict[str, Any]] = {}
    for cid, amap in zip(ids, first["axes"], strict=True):
        axes[cid] = {k: json.loads(v) for k, v in (amap or [])} if not isinstance(amap, dict) else \
            {k: json.loads(v) for k, v in amap.items()}
    names = list(dict.fromkeys(k for m in axes.values() for k in m if k != COMMIT))
    eff_rows: dict[str, Mapping[str, Any]] = {}
    if cells is not None and not cells.empty:
        eff_rows = {str(r["cell_id"]): r for r in cells.drop_duplicates("cell_id").to_dict("records")}
    requested = {n: [value_text(axes[c].get(n)) for c in ids] for n in names}
    dims = {n: list(v) for n, v in requested.items()}
    substituted = {n: [False] * len(ids) for n in names}
    for name in names:
        if name not in _EFFECTIVE_OF:
            continue
        diff_name, column = _EFFECTIVE_OF[name]
        for i, cid in enumerate(ids):
            row = eff_rows.get(cid)
            raw = row.get("effective_differs") if row is not None else None
            differs = [] if raw is None else [str(x) for x in raw]
            if row is None or diff_name not in differs or value_text(row.get(column)) is None:
                continue
            value = value_text(row.get(column))
            if name == "env.VLLM_USE_V2_MODEL_RUNNER":
                # Stated in the axis' own terms, so the term reads as the user's setting.
                value = {"V2": "1", "V1": "0"}.get(str(value), value)
            dims[name][i], substituted[name][i] = value, True
    covered = {_EFFECTIVE_OF[n][0] for n in names if n in _EFFECTIVE_OF}
    for name, column in _EFFECTIVE_ONLY.items():
        if name in covered or not eff_rows:
            continue
        values = [value_text(eff_rows[c].get(column)) if c in eff_rows else None for c in ids]
        key = name + EFFECTIVE_SUFFIX
        dims[key] = values
        requested[key] = values
        substituted[key] = [False] * len(ids)
    commit = [str(c) for c in first[COMMIT]]
    return _Cells(ids, commit, dims, requested, substituted)


# ---- statistics ---------------------------------------------------------------------------------

def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error over all of `p`)."""
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def fisher_greater(a: np.ndarray, n_in: np.ndarray, k: int, n: int) -> np.ndarray:
    """One-sided Fisher exact p: at least `a` of the `k` failures among `n_in` of `n` samples."""
    p: np.ndarray = np.clip(hypergeom.sf(a - 1, n, k, n_in), 0.0, 1.0)
    return p


# ---- the search ---------------------------------------------------------------------------------

@dataclass
class _Conj:
    terms: tuple[tuple[str, str], ...]
    mask: np.ndarray
    a: int = 0
    n_in: int = 0
    p: float = 1.0
    p_adj: float = 1.0


def _conjunctions(dims: Mapping[str, Sequence[str | None]], max_terms: int) -> Iterable[tuple[tuple[str, str], ...]]:
    values = {d: sorted({v for v in vs if v is not None}) for d, vs in dims.items()}
    names = list(values)  # axis order: terms read in the order the matrix lists its axes
    for size in range(1, max_terms + 1):
        for combo in itertools.combinations(names, size):
            for vals in itertools.product(*(values[d] for d in combo)):
                yield tuple(zip(combo, vals, strict=True))


def _mask(dims: Mapping[str, Sequence[str | None]], terms: Sequence[tuple[str, str]], n: int) -> np.ndarray:
    mask = np.ones(n, dtype=bool)
    for d, v in terms:
        mask &= np.array([x == v for x in dims[d]], dtype=bool)
    return mask


def _too_broad(c: _Conj, dims: Mapping[str, Sequence[str | None]], n: np.ndarray, k: np.ndarray,
               alpha: float) -> bool:
    """Whether a part of `c` is credibly clean: a part holding at most 5 % of its failures whose
    count is improbably low at the rate of the rest (one-sided Fisher, Bonferroni over the parts
    tried). Parts: one or two more terms, each single cell (a clean corner of an interaction no
    single term splits off), and the complement of each."""
    inside = c.mask
    used = {d for d, _ in c.terms}
    cols = {d: np.array(list(vs), dtype=object) for d, vs in dims.items() if d not in used}
    parts: list[np.ndarray] = []
    for col in cols.values():
        for v in sorted({x for x in col[inside] if x is not None}):
            parts.append(inside & (col == v))
    for c1, c2 in itertools.combinations(cols.values(), 2):
        for v1, v2 in itertools.product(sorted({x for x in c1[inside] if x is not None}),
                                        sorted({x for x in c2[inside] if x is not None})):
            parts.append(inside & (c1 == v1) & (c2 == v2))
    for i in np.flatnonzero(inside):
        part = np.zeros_like(inside)
        part[i] = True
        parts.append(part)
    # Each part's complement too: all failures in one corner makes the rest the clean part.
    parts += [inside & ~p for p in parts]
    total_k, total_n = int(k[inside].sum()), int(n[inside].sum())
    parts = [p for p in parts if 0 < n[p].sum() < total_n]
    if not parts:
        return False
    k_part = np.array([k[p].sum() for p in parts])
    n_part = np.array([n[p].sum() for p in parts])
    clean = k_part <= (1 - COVERAGE) * total_k
    if not clean.any():
        return False
    # P(at most k_part failures in the part | the failures of c spread over its samples at random)
    p_clean = hypergeom.cdf(k_part[clean], total_n, total_k, n_part[clean])
    return bool((p_clean < alpha / len(parts)).any())


def explain(samples: pd.DataFrame, cells: pd.DataFrame | None = None, *, suite: Suite | None = None,
            commit_order: Sequence[str] | None = None, alpha: float = 0.01, max_terms: int = 3) -> Explanation:
    """Explain every failure mode of a samples table (see the module docstring).

    `samples`: rows of a run's samples table with one column per axis or the `axes` map
    (`sweeper.analysis.load_samples`); `cells`: its cells table, for effective values; `suite`: the
    run's suite, so modes are exactly bisect's (without it, checks are told apart by name only);
    `commit_order`: commits in history order, for listing.
    """
    if samples.empty:
        return Explanation((), alpha, max_terms, 0, suite is not None)
    samples = samples.reset_index(drop=True)
    classified = classify(samples, suite)
    table = _cell_table(samples, cells)
    index = {cid: i for i, cid in enumerate(table.ids)}
    cell_of = np.array([index[str(c)] for c in samples["cell_id"]])
    order = {c: i for i, c in enumerate(commit_order or ())}
    commits_all = sorted(set(table.commit), key=lambda c: (order.get(c, len(order)), c))
    out = []
    modes = sorted({m for m in classified.mode if m is not None},
                   key=lambda m: -sum(1 for x in classified.mode if x == m))
    for mode in modes:
        out.append(_explain_mode(mode, samples, classified, table, cell_of, commits_all, alpha, max_terms))
    return Explanation(tuple(out), alpha, max_terms, len(samples), suite is not None)


def _explain_mode(mode: str, samples: pd.DataFrame, classified: Classified, table: _Cells, cell_of: np.ndarray,
                  commits_all: Sequence[str], alpha: float, max_terms: int) -> ModeExplanation:
    hit = np.array([m == mode for m in classified.mode], dtype=bool)
    relevant = np.array([str(c) in classified.cases[mode] for c in samples["case_id"]], dtype=bool)
    n_cells = len(table.ids)
    n_all = np.bincount(cell_of[relevant], minlength=n_cells)
    k_all = np.bincount(cell_of[relevant & hit], minlength=n_cells)
    cell_commit = np.array(table.commit, dtype=object)
    shown = {c for c, k in zip(table.commit, k_all, strict=True) if k > 0}
    commits = tuple(c for c in commits_all if c in shown)
    in_scope = np.isin(cell_commit, list(commits))
    n, k = np.where(in_scope, n_all, 0), np.where(in_scope, k_all, 0)
    scope = in_scope & (n > 0)
    dims = {d: [v if scope[i] else None for i, v in enumerate(vs)] for d, vs in table.dims.items()}
    # A dimension needs two values to be one: a single value besides "not applicable" only restates
    # which cells some other axis switched off.
    dims = {d: vs for d, vs in dims.items() if len({v for v in vs if v is not None}) >= 2}
    total_k, total_n = int(k.sum()), int(n.sum())
    cases = tuple(sorted(classified.cases[mode]))
    failing_cells = tuple((table.ids[i], Count(int(k[i]), int(n[i]))) for i in np.argsort(-k, kind="stable")
                          if k[i] > 0)
    conjs: list[_Conj] = []
    for conj in _conjunctions(dims, max_terms):
        mask = _mask(dims, conj, n_cells) & scope
        if not mask.any() or mask.sum() == scope.sum():
            continue  # selects nothing, or everything: no test
        conjs.append(_Conj(conj, mask, int(k[mask].sum()), int(n[mask].sum())))
    if conjs:
        p = fisher_greater(np.array([c.a for c in conjs]), np.array([c.n_in for c in conjs]), total_k, total_n)
        for c, pv, pa in zip(conjs, p, holm(p), strict=True):
            c.p, c.p_adj = float(pv), float(pa)
    unexplained = ModeExplanation(
        mode=mode, verdict=Verdict.UNEXPLAINED, terms=(), inside=Count(total_k, total_n), outside=Count(0, 0),
        p_value=None, p_adjusted=None, tried=len(conjs), cases=cases, commits=commits, clean_commits=(),
        failing_cells=failing_cells, failures=total_k, cells_in_scope=int(scope.sum()))

    best: _Conj | None = None
    alternatives: list[_Conj] = []
    for size in range(1, max_terms + 1):
        fitting = [c for c in conjs if len(c.terms) == size and c.a >= COVERAGE * total_k
                   and not _too_broad(c, dims, n, k, alpha)]
        if fitting:
            fitting.sort(key=lambda c: (c.p, c.n_in, [str(t) for t in c.terms]))
            best = fitting[0]
            alternatives = [c for c in fitting[1:] if np.array_equal(c.mask, best.mask)]
            break
    significant = best is not None and best.p_adj < alpha
    if not significant and not _too_broad(_Conj((), scope.copy(), total_k, total_n), dims, n, k, alpha):
        # No setting credibly matters. It fails everywhere, or the samples are too few to say where.
        everywhere = all(k[scope] > 0)
        if best is None or everywhere:
            return dataclasses.replace(unexplained, verdict=Verdict.EVERYWHERE, clean_commits=_clean_commits(
                scope, (), table, n_all, k_all, commits_all, commits))
    if best is None:
        return unexplained
    terms = _terms(best.terms, scope, table)
    verdict = Verdict.EXPLAINED
    if not significant:
        verdict = Verdict.TOO_FEW
    elif alternatives:
        verdict = Verdict.NOT_IDENTIFIABLE
    without = []
    if len(best.terms) > 1:
        for i, (d, v) in enumerate(best.terms):
            rest = [t for j, t in enumerate(best.terms) if j != i]
            col = np.array(dims[d], dtype=object)
            part = _mask(dims, rest, n_cells) & scope & (col != v)
            without.append(Without(terms[i], Count(int(k[part].sum()), int(n[part].sum()))))
    out_mask = scope & ~best.mask
    return dataclasses.replace(
        unexplained, verdict=verdict, terms=terms, inside=Count(best.a, best.n_in),
        outside=Count(int(k[out_mask].sum()), int(n[out_mask].sum())), p_value=best.p, p_adjusted=best.p_adj,
        clean_commits=_clean_commits(scope, best.terms, table, n_all, k_all, commits_all, commits),
        without=tuple(without),
        alternatives=tuple(_terms(c.terms, scope, table) for c in alternatives),
        effective_notes=_effective_notes(best, terms, table, scope, n, k))


def _terms(conj: Sequence[tuple[str, str]], scope: np.ndarray, table: _Cells) -> tuple[Term, ...]:
    """The conjunction's terms, each marked effective when reading it on the requested value instead
    of the value that ran would select other cells."""
    out = []
    for dim, value in conj:
        if dim.endswith(EFFECTIVE_SUFFIX):
            out.append(Term(dim, value, True))
            continue
        ran, asked = scope.copy(), scope.copy()
        for d, v in conj:
            ran &= np.array([x == v for x in table.dims[d]], dtype=bool)
            asked &= np.array([x == v for x in (table.requested if d == dim else table.dims)[d]], dtype=bool)
        out.append(Term(dim, value, not np.array_equal(ran, asked)))
    return tuple(out)


def _effective_notes(best: _Conj, terms: Sequence[Term], table: _Cells, scope: np.ndarray, n: np.ndarray,
                     k: np.ndarray) -> tuple[str, ...]:
    notes = []
    for term in terms:
        if not term.effective:
            continue
        d = term.axis
        if d.endswith(EFFECTIVE_SUFFIX):
            notes.append(f"{display_axis(d.removesuffix(EFFECTIVE_SUFFIX))} is no axis of this matrix: the value "
                         f"the servers ran explains it")
            continue
        moved = [i for i, s in enumerate(table.substituted[d]) if s and scope[i]]
        asked = sorted({f"asked {table.requested[d][i]}, ran {table.dims[d][i]}" for i in moved})
        # The same conjunction on requested values: what reading the effective value changed.
        req_mask = scope.copy()
        for x, y in best.terms:
            values = table.requested[x] if x == d else table.dims[x]
            req_mask &= np.array([val == y for val in values], dtype=bool)
        notes.append(f"{display_axis(d)}: {len(moved)} cell(s) ran another value than requested "
                     f"({'; '.join(asked)}); explained on what ran — on requested values "
                     f"{' ∧ '.join(str(Term(x, y)) for x, y in best.terms)} holds "
                     f"{int(k[req_mask].sum())}/{int(n[req_mask].sum())} failing")
    return tuple(notes)


def _clean_commits(scope: np.ndarray, terms: Sequence[tuple[str, str]], table: _Cells, n_all: np.ndarray,
                   k_all: np.ndarray, commits_all: Sequence[str], commits: Sequence[str]) -> tuple[tuple[str, Count], ...]:
    out = []
    for commit in commits_all:
        if commit in commits:
            continue
        mask = np.array([c == commit for c in table.commit], dtype=bool)
        for d, v in terms:
            mask &= np.array([x == v for x in table.dims.get(d, [None] * len(mask))], dtype=bool)
        out.append((commit, Count(int(k_all[mask].sum()), int(n_all[mask].sum()))))
    return tuple(out)


# ---- text ---------------------------------------------------------------------------------------

def fmt_p(p: float | None) -> str:
    if p is None:
        return "—"
    if p < 1e-30:
        return "p < 1e-30"
    return f"p = {p:.2g}"


def short_commit(commit: str) -> str:
    """A full sha as its first 10 digits; a ref as it is."""
    return commit[:10] if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit) else commit


def describe(m: ModeExplanation) -> list[str]:
    """A mode's explanation as lines of text (the first names the mode)."""
    lines = [f"{m.mode}  ({m.failures:,} failing samples; cases: {len(m.cases)})"]
    where = ", ".join(map(short_commit, m.commits))
    if m.verdict is Verdict.EVERYWHERE and m.cells_in_scope <= 1:
        lines.append(f"  one setting tried: {m.inside} failing on {where}")
    elif m.verdict is Verdict.EVERYWHERE:
        lines.append(f"  fails in every cell alike on {where}: {m.inside} failing; no setting matters")
    elif m.verdict is Verdict.UNEXPLAINED:
        lines.append(f"  no conjunction of at most 3 settings separates it ({m.tried:,} tried) — it fails in "
                     + "; ".join(f"{cid} ({c})" for cid, c in m.failing_cells[:4])
                     + (" …" if len(m.failing_cells) > 4 else ""))
    else:
        lines.append(f"  {m.conjunction} → {m.inside} failing vs {m.outside} elsewhere "
                     f"(Fisher {fmt_p(m.p_value)}; Holm-adjusted over {m.tried:,} conjunctions: {fmt_p(m.p_adjusted)})")
        if m.without:
            parts = [f"{_without_name(w, m)}: {w.count}" for w in m.without]
            if all(w.count.failed == 0 for w in m.without):
                parts[-1] += " — neither alone fails." if len(parts) == 2 else " — no part alone fails."
            lines.append("  " + "; ".join(parts))
        if m.verdict is Verdict.NOT_IDENTIFIABLE:
            alts = " or ".join(" ∧ ".join(map(str, a)) for a in m.alternatives)
            lines.append(f"  not identifiable in this matrix: {m.conjunction} and {alts} select the same cells "
                         "(they never vary apart here)")
        if m.verdict is Verdict.TOO_FEW:
            lines.append("  not significant after correction: too few samples to tell")
        lines.extend(f"  effective: {note}" for note in m.effective_notes)
    if m.commits:
        clean = "; ".join(f"{short_commit(c)} {cnt}" for c, cnt in m.clean_commits if cnt.n)
        lines.append(f"  on {where}" + (f"; not on {clean}" if clean else ""))
    return lines


def _without_name(w: Without, m: ModeExplanation) -> str:
    others = " ∧ ".join(str(t) for t in m.terms if t != w.term)
    return f"{others} alone ({display_axis(w.term.axis)}≠{w.term.value})"


def render(explanation: Explanation) -> str:
    if not explanation.modes:
        return "no failures: nothing to explain"
    out = []
    if not explanation.labels_from_suite:
        out.append("(the run's suite is not available: checks are told apart by name only)")
    for i, m in enumerate(explanation.modes, 1):
        lines = describe(m)
        out.append(f"mode {i}: {lines[0]}")
        out.extend(lines[1:])
    return "\n".join(out)
