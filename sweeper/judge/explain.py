"""Which settings make each failure mode fail: the smallest conjunction of axis values behind it. Pure.

Failure modes are the ones bisect uses (`sweeper.judge.modes`): a failed sample's case and failed
checks, merged into modes by commits seen together. A cell whose server did not come up, crashed or
hung (`server_failed`, `crashed`, `timeout`) is a mode of its own, counted in server starts. For each:

* **Where.** The commits that show it are its scope (the commit is what a bisect explains); the
  samples are those of the cases that can show it (cases whose checks cover one of its signatures).
* **Dimensions.** Every axis but the commit, at the levels `sweeper.judge.axis_levels` reads: the value that
  ran where it differs from the request (the term says so), the version's default resolved to what
  ran, `unset` where an include rule left the axis out; effective settings no axis asks for are
  dimensions of their own. An axis with a single level besides "not applicable" is no dimension.
* **Evidence is counted per server start** (`sweeper.judge.overdispersion`): for each conjunction the
  intra-class correlation of failures within a start is learned from how the starts inside and
  outside it disagree, and each start's samples count as what they are worth at that dispersion.
* **Candidates.** Every conjunction of at most `max_terms` (axis = level) terms on distinct axes,
  each tested with a one-sided Fisher exact test on those effective counts (more failures inside
  than outside); p-values are Holm-corrected over every conjunction tried.
* **The explanation** is the smallest conjunction that fits and is claimed. It fits when (1) it
  holds at least 95 % of the mode's failures, (2) no part of it is credibly clean (effective counts
  at the dispersion between starts of one cell; Bonferroni over the one-term refinements, and
  separately over the finer parts: two more terms, a single cell, a single start): "mtp" alone is
  rejected when its V1 half never fails, and (3) every term is needed: without it, the part with the
  term false is credibly cleaner (Bonferroni over the refinements of the smaller conjunction), so a
  larger conjunction is reached only through a clean part of the smaller one, never because the
  smaller one fell short of significance. It is claimed when it is significant after Holm and each
  of its one-term parts credibly fails more than the starts outside it (one-sided Fisher at alpha):
  a conjunction a term short leaves a part at the background rate, and claiming it would name a
  term too few. One that fits but is not claimed is "too few samples", with the parts that did not
  credibly fail (more starts there tell). Ties go to the smaller p-value. Conjunctions of that size
  that select exactly the same starts are its aliases: the design cannot tell them apart, and the
  result is "not identifiable in this matrix" with each of them listed; larger ones selecting the
  same starts are listed as refinements the design cannot tell from it. A mode with no fitting
  conjunction is unexplained.

**Identical replays** (a case sent again to the same server start) are weighed before the start's
dispersion: their correlation beyond the start's rate is learned from how the replays of each
request agree (`sweeper.judge.overdispersion.replays`), and a request sent m times counts as
m / (1 + (m - 1) rho) samples: m replays that repeat one outcome are about one draw.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import hypergeom

from sweeper.judge import modes as fm
from sweeper.judge import overdispersion as od
from sweeper.judge.axis_levels import COMMIT, EFFECTIVE_SUFFIX, Units, axes_map, units, value_text
from sweeper.judge.stats import wilson
from sweeper.spec.suite import Suite

__all__ = ["COMMIT", "EFFECTIVE_SUFFIX", "value_text"]  # re-exported: readers import them from here

COVERAGE = 0.95  # the share of a mode's failures a conjunction must hold
SERVER_MODES = ("server_failed", "crashed", "timeout")  # cell statuses that are modes of their own
TEST = "one-sided Fisher on per-start effective counts (beta-binomial dispersion), Holm-adjusted"


class Verdict(enum.StrEnum):
    EXPLAINED = "explained"
    NOT_IDENTIFIABLE = "not identifiable"  # several conjunctions select the same starts
    EVERYWHERE = "every setting"  # no setting matters: it fails alike in every cell of its commits
    UNEXPLAINED = "unexplained"  # no conjunction of at most max_terms terms separates it
    TOO_FEW = "too few samples"  # the best conjunction is not significant after correction


@dataclass(frozen=True)
class Term:
    axis: str
    value: str
    effective: bool = False  # some cell in scope asked for this value and ran another, or ran it unasked
    requested: tuple[str, ...] = field(default=(), compare=False)  # what the selected cells asked for

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
class Evidence:
    """One side of a conjunction as the test weighs it: server starts, effective counts, the rate
    with its 95 % interval (Wilson on the effective counts)."""

    starts: int
    failed: float
    n: float
    rate: float
    low: float
    high: float


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
    p_value: float | None  # one-sided Fisher on effective counts
    p_adjusted: float | None  # Holm over `tried`
    tried: int
    cases: tuple[str, ...]
    commits: tuple[str, ...]  # commits that show the mode, in history order
    clean_commits: tuple[tuple[str, Count], ...]  # other commits: the same cases where the conjunction holds
    without: tuple[Without, ...] = ()
    alternatives: tuple[tuple[Term, ...], ...] = ()  # same starts selected: not identifiable
    effective_notes: tuple[str, ...] = ()
    failing_cells: tuple[tuple[str, Count], ...] = ()  # cell_id -> this mode's failures there
    failures: int = 0
    cells_in_scope: int = 0
    unit: str = "samples"  # "server starts" for a mode of failed servers
    rho: float = 0.0  # the per-start dispersion the test used
    rho_high: float = 0.0  # the largest dispersion the data leave credible
    starts: int = 0  # server starts in scope
    replay_rho: float = 0.0  # how much identical replays on one server agree beyond their start's rate
    worth: float = 0.0  # what the samples in scope count as at `rho`
    inside_evidence: Evidence | None = None
    outside_evidence: Evidence | None = None
    details: tuple[tuple[str, int], ...] = ()  # a failed server's status_detail lines, with their starts
    # Parts of the conjunction (it with one more term) that do not credibly fail: the samples cannot
    # tell the conjunction from one that leaves such a part out, so it is not claimed (too few samples).
    unsure_parts: tuple[tuple[Term, Count], ...] = ()
    # Terms whose need the samples do not show (with the term false, the rest of the conjunction is
    # not credibly cleaner, or has no samples): named, not claimed, where no conjunction fits fully.
    unneeded: tuple[Term, ...] = ()
    # Larger conjunctions that select exactly the same starts: the design holds the conjunction only
    # together with these values, so it cannot tell them from it (a partial design, an include rule).
    refinements: tuple[tuple[Term, ...], ...] = ()

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


def _failed_list(value: Any) -> list[str] | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    return [str(v) for v in value]


def commit_key(samples: pd.DataFrame) -> list[str]:
    """The identity of each sample's commit for mode assignment: the sha where known."""
    shas = samples["commit_sha"] if "commit_sha" in samples.columns else pd.Series([None] * len(samples))
    return [str(s) if isinstance(s, str) and s else str(c) for s, c in zip(shas, samples[COMMIT], strict=True)]


def classify(samples: pd.DataFrame, suite: Suite | None) -> Classified:
    """The failure mode of every sample, as `sweeper.judge.modes` assigns them."""
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


def fisher_greater(a: Any, n_in: Any, k: Any, n: Any) -> np.ndarray:
    """One-sided Fisher exact p: at least `a` of the `k` failures among `n_in` of `n` samples."""
    p: np.ndarray = np.clip(hypergeom.sf(np.asarray(a) - 1, n, k, n_in), 0.0, 1.0)
    return p


def _effective_fisher(a: np.ndarray, n_in: np.ndarray, k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Fisher on effective (real-valued) counts, rounded to whole samples consistently."""
    big_n = np.maximum(np.rint(n), 1)
    big_k = np.clip(np.rint(k), 0, big_n)
    n_i = np.clip(np.rint(n_in), 0, big_n)
    a_i = np.clip(np.rint(a), 0, np.minimum(big_k, n_i))
    return fisher_greater(a_i, n_i, big_k, big_n)


def _evidence(mask: np.ndarray, n: np.ndarray, k: np.ndarray, w: np.ndarray) -> Evidence:
    ne, ke = float((n * w)[mask].sum()), float((k * w)[mask].sum())
    low, high = wilson(min(ke, ne), ne)
    return Evidence(int((mask & (n > 0)).sum()), ke, ne, ke / ne if ne else 0.0, low, high)


# ---- the search ---------------------------------------------------------------------------------

@dataclass
class _Conj:
    terms: tuple[tuple[str, str], ...]
    mask: np.ndarray
    a: int = 0
    n_in: int = 0
    p: float = 1.0
    p_adj: float = 1.0
    rho: float = 0.0
    rho_high: float = 0.0


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


# The private steps of the conjunction search below take the search's arrays positionally: they are
# one algorithm split for reading, not an API (PLR0917 is silenced for them).
def _too_broad(c: _Conj, dims: Mapping[str, Sequence[str | None]], n: np.ndarray, k: np.ndarray,  # noqa: PLR0917
               alpha: float, rho: float, cell_of: np.ndarray) -> bool:
    """Whether a part of `c` is credibly clean: a part holding at most 5 % of its failures whose
    count is improbably low at the rate of the rest (one-sided Fisher on effective counts,
    Bonferroni over the parts tried). The dispersion `rho` is the one within settings: how starts of
    one cell disagree (a part that differs for real would pass for noise at the dispersion of a
    split that lumps it with the rest). Parts: one
    or two more terms, each single start and each single cell (a clean corner of an interaction no
    single term splits off), and the complement of each."""
    inside = c.mask
    used = {d for d, _ in c.terms}
    cols = {d: np.array(list(vs), dtype=object) for d, vs in dims.items() if d not in used}
    terms = [part for _, _, part in _refinements(c, dims)]  # the refinements a smaller conjunction competes with
    finer: list[np.ndarray] = []
    for c1, c2 in itertools.combinations(cols.values(), 2):
        for v1, v2 in itertools.product(sorted({x for x in c1[inside] if x is not None}),
                                        sorted({x for x in c2[inside] if x is not None})):
            finer.append(inside & (c1 == v1) & (c2 == v2))
    for i in np.flatnonzero(inside):
        part = np.zeros_like(inside)
        part[i] = True
        finer.append(part)
    for cell in np.unique(cell_of[inside]):
        part = inside & (cell_of == cell)
        if part.sum() > 1:
            finer.append(part)
    # Each part's complement too: all failures in one corner makes the rest the clean part. The
    # one-term refinements have a Bonferroni budget of their own, so that the many finer parts do not
    # drown the plain "its other half never fails"; the two budgets together stay within 2 alpha.
    return any(_clean_part(tier + [inside & ~p for p in tier], inside, n, k, alpha, rho) for tier in (terms, finer))


def _refinements(c: _Conj, dims: Mapping[str, Sequence[str | None]], *, with_unset: bool = False) -> list[
        tuple[str, str | None, np.ndarray]]:
    """The one-term refinements of `c`: (axis, level, the starts of `c` at that level) for every
    level of every other dimension that varies inside it; `with_unset` adds the starts where the
    dimension does not apply (level None)."""
    used = {d for d, _ in c.terms}
    out: list[tuple[str, str | None, np.ndarray]] = []
    for d, vs in dims.items():
        if d in used:
            continue
        col = np.array(list(vs), dtype=object)
        levels = sorted({x for x in col[c.mask] if x is not None})
        for v in levels:
            out.append((d, v, c.mask & (col == v)))
        if with_unset and levels:
            none = c.mask & np.array([x is None for x in col], dtype=bool)
            if none.any():
                out.append((d, None, none))
    return out


def _clean_p(parts: np.ndarray, inside: np.ndarray, n: np.ndarray, k: np.ndarray, rho: float) -> np.ndarray:
    """Per part (rows of `parts`, inside `inside`): P(at most its failures | the failures of
    `inside` spread over its samples at random), on effective counts at dispersion `rho`."""
    w = od.weights(n, [rho])[0]
    ke, ne = w * k, w * n
    big_n = max(1.0, float(np.rint(ne[inside].sum())))
    big_k = float(np.rint(ke[inside].sum()))
    n_part = np.clip(np.rint(parts @ ne), 0, big_n)
    k_part = np.clip(np.rint(parts @ ke), 0, np.minimum(big_k, n_part))
    p: np.ndarray = hypergeom.cdf(k_part, big_n, big_k, n_part)
    return p


def _necessary(c: _Conj, dims: Mapping[str, Sequence[str | None]], n: np.ndarray, k: np.ndarray,  # noqa: PLR0917
               alpha: float, rho: float, scope: np.ndarray) -> bool:
    """Whether every term of `c` is needed: without it the conjunction (its parent) holds a part,
    the term false, that is credibly cleaner than `c` (the test `_too_broad` makes of the parent's
    one-term refinements, Bonferroni over those refinements). A term that only rides along with a
    few clean starts of the parent is not claimed: the smaller conjunction is, or nothing is."""
    return all(_needed(c, i, dims, n, k, alpha, scope) for i in range(len(c.terms)))


def _needed(c: _Conj, i: int, dims: Mapping[str, Sequence[str | None]], n: np.ndarray, k: np.ndarray,  # noqa: PLR0917
            alpha: float, scope: np.ndarray) -> bool:
    """Whether term `i` of `c` is needed (see `_necessary`)."""
    if len(c.terms) < 2:
        return True  # a single term's parent is everything: whether it is needed is its significance
    rest = tuple(t for j, t in enumerate(c.terms) if j != i)
    parent = _Conj(rest, _mask(dims, rest, len(n)) & scope)
    part = parent.mask & ~c.mask
    if not (n[part].sum() > 0 and n[c.mask].sum() > 0):
        return False
    # Bonferroni over the larger conjunctions the parent could give way to: its distinct one-term
    # refinements (a term that rides along is claimed only if one of them passes by chance).
    tier = [m for *_, m in _refinements(parent, dims) if 0 < n[m].sum() < n[parent.mask].sum()]
    budget = len(np.unique(np.array(tier, dtype=bool), axis=0)) if tier else 1
    # At the dispersion of this split (the term true or false inside the parent, each side its
    # own rate): the one the data favour most, which is the prior's 0 where they cannot tell
    # (cells of one start each that fail all or nothing), high where the starts disagree.
    disp = od.dispersion(od.loglik(k, n), c.mask[None, :], parent.mask)
    split = float(disp.mode[0]) if disp.mode is not None else float(disp.mean[0])
    return bool(_clean_p(part[None, :], parent.mask, n, k, split)[0] < alpha / budget)


def _unsure_parts(c: _Conj, dims: Mapping[str, Sequence[str | None]], n: np.ndarray, k: np.ndarray,  # noqa: PLR0917
                  alpha: float, rho: float, scope: np.ndarray) -> list[tuple[str, str | None, np.ndarray]]:
    """The one-term refinements of `c` whose starts do not credibly fail more than the starts
    outside `c` (one-sided Fisher on effective counts at the dispersion within settings, each at
    `alpha`). Were one of them clean, `c` would be too broad by that term: a claim of `c` needs
    each of its parts to fail (a subset of the true conjunction leaves a part at the background)."""
    outside = scope & ~c.mask
    parts = [(d, v, m) for d, v, m in _refinements(c, dims, with_unset=True) if n[m].sum() > 0]
    if not parts:
        return []
    w = od.weights(n, [rho])[0]
    ke, ne = w * k, w * n
    stack = np.array([m for *_, m in parts], dtype=bool)
    a, n_in = stack @ ke, stack @ ne
    k_out, n_out = float(ke[outside].sum()), float(ne[outside].sum())
    p = _effective_fisher(a, n_in, a + k_out, n_in + n_out)
    return [part for part, pv in zip(parts, p, strict=True) if pv >= alpha]


def _clean_part(parts: list[np.ndarray], inside: np.ndarray, n: np.ndarray, k: np.ndarray, alpha: float,
                rho: float) -> bool:
    total_k = float(k[inside].sum())
    parts = [p for p in parts if 0 < n[p].sum() < n[inside].sum()]
    if not parts:
        return False
    # The same starts reached twice (the complement of a binary axis' one value is its other) are
    # one hypothesis, counted once in the Bonferroni budget.
    stack = np.unique(np.array(parts, dtype=bool), axis=0)
    parts = list(stack)
    k_part = stack @ k
    clean = k_part <= (1 - COVERAGE) * total_k
    if not clean.any():
        return False
    part = stack[clean]
    w = od.weights(n, np.full(len(part), rho))
    ke, ne = w * k[None, :], w * n[None, :]
    big_n = np.maximum(1.0, np.rint((ne * inside).sum(axis=1)))
    big_k = np.rint((ke * inside).sum(axis=1))
    n_part = np.clip(np.rint((ne * part).sum(axis=1)), 0, big_n)
    k_eff = np.clip(np.rint((ke * part).sum(axis=1)), 0, np.minimum(big_k, n_part))
    # P(at most k_part failures in the part | the failures of c spread over its samples at random)
    p_clean = hypergeom.cdf(k_eff, big_n, big_k, n_part)
    return bool((p_clean < alpha / len(parts)).any())


def explain(samples: pd.DataFrame, cells: pd.DataFrame | None = None, *, suite: Suite | None = None,
            commit_order: Sequence[str] | None = None, alpha: float = 0.01, max_terms: int = 3) -> Explanation:
    """Explain every failure mode of a samples table (see the module docstring).

    `samples`: rows of a run's samples table with one column per axis or the `axes` map
    (`sweeper.store.frames.load_samples`); `cells`: its cells table, for effective values and failed
    servers; `suite`: the run's suite, so modes are exactly bisect's (without it, checks are told
    apart by name only); `commit_order`: commits in history order, for listing.
    """
    rows: dict[str, Mapping[str, Any]] = {}
    if cells is not None and not cells.empty:
        rows = {str(r["cell_id"]): r for r in cells.drop_duplicates("cell_id").to_dict("records")}
    order = {c: i for i, c in enumerate(commit_order or ())}
    out = []
    if not samples.empty:
        samples = samples.reset_index(drop=True)
        classified = classify(samples, suite)
        starts = _start_ids(samples)
        cell_ids = [str(c) for c in samples["cell_id"]]
        keys = list(dict.fromkeys(zip(cell_ids, starts, strict=True)))
        first = samples.drop_duplicates("cell_id")
        axes = {str(c): axes_map(a) for c, a in zip(first["cell_id"], first["axes"], strict=True)}
        commit = {str(c): str(v) for c, v in zip(first["cell_id"], first[COMMIT], strict=True)}
        table = units(keys, axes, commit, rows)
        index = {key: i for i, key in enumerate(keys)}
        unit_of = np.array([index[key] for key in zip(cell_ids, starts, strict=True)])
        commits_all = sorted(set(table.commit), key=lambda c: (order.get(c, len(order)), c))
        modes = sorted({m for m in classified.mode if m is not None},
                       key=lambda m: -sum(1 for x in classified.mode if x == m))
        case_col = [str(c) for c in samples["case_id"]]
        case_code = np.unique(np.array(case_col, dtype=object), return_inverse=True)[1].reshape(-1)
        for mode in modes:
            hit = np.array([m == mode for m in classified.mode], dtype=bool)
            relevant = np.array([c in classified.cases[mode] for c in case_col], dtype=bool)
            n_all = np.bincount(unit_of[relevant], minlength=len(keys))
            k_all = np.bincount(unit_of[relevant & hit], minlength=len(keys))
            # A case sent again to the same server start is an identical replay: weighed by how much
            # replays agree.
            rep = od.replays(unit_of[relevant], case_code[relevant], hit[relevant], len(keys))
            worth = (rep.samples, rep.failures, rep.rho) if rep.rho > 0 else None
            out.append(_explain_mode(mode, table, n_all, k_all, commits_all, alpha, max_terms,
                                     tuple(sorted(classified.cases[mode])), worth))
    out += _server_modes(rows, order, alpha, max_terms)
    return Explanation(tuple(out), alpha, max_terms, len(samples), suite is not None)


def _start_ids(samples: pd.DataFrame) -> list[str]:
    """The server start each sample came from: one per group of a run (cells of one server key share
    it); the cell where the table does not say."""
    if "group_id" not in samples.columns:
        return [str(c) for c in samples["cell_id"]]
    run = samples["run_id"] if "run_id" in samples.columns else pd.Series([""] * len(samples))
    return [f"{r}/{g}" if isinstance(g, str) and g else str(c)
            for r, g, c in zip(run, samples["group_id"], samples["cell_id"], strict=True)]


def _server_modes(rows: Mapping[str, Mapping[str, Any]], order: Mapping[str, int], alpha: float,
                  max_terms: int) -> list[ModeExplanation]:
    """Cells whose server did not come up, crashed or hung: one mode per status, one start per cell."""
    if not rows or any("axes" not in r or "status" not in r for r in rows.values()):
        return []
    if not any(str(r.get("status")) in SERVER_MODES for r in rows.values()):
        return []
    # One unit per server start: the cells of a group (its request-level axes) share its fate.
    first: dict[str, str] = {}
    for c, r in rows.items():
        group = r.get("group_id")
        first.setdefault(f"{r.get('run_id') or ''}/{group}" if isinstance(group, str) and group else c, c)
    keys = [(c, start) for start, c in first.items()]
    axes = {c: {a: v for a, v in axes_map(rows[c]["axes"]).items() if not a.startswith("request.")}
            for c, _ in keys}
    table = units(keys, axes, {c: str(rows[c].get(COMMIT)) for c, _ in keys}, rows)
    status = {c: str(rows[c].get("status")) for c, _ in keys}
    commits_all = sorted(set(table.commit), key=lambda c: (order.get(c, len(order)), c))
    out = []
    for mode in SERVER_MODES:
        failed = [c for c, s in status.items() if s == mode]
        if not failed:
            continue
        k_all = np.array([int(status[c] == mode) for c, _ in keys])
        details: dict[str, int] = defaultdict(int)
        for c in failed:
            text = str(rows[c].get("status_detail") or "").strip().splitlines()
            details[text[0][:200] if text else "(no detail)"] += 1
        m = _explain_mode(mode, table, np.ones(len(keys), dtype=np.int64), k_all, commits_all, alpha,
                          max_terms, ())
        out.append(dataclasses.replace(m, unit="server starts",
                                       details=tuple(sorted(details.items(), key=lambda kv: -kv[1]))))
    return out


def _explain_mode(mode: str, table: Units, n_all: np.ndarray, k_all: np.ndarray, commits_all: Sequence[str],  # noqa: PLR0917
                  alpha: float, max_terms: int, cases: tuple[str, ...],
                  worth: tuple[np.ndarray, np.ndarray, float] | None = None) -> ModeExplanation:
    """`n_all`, `k_all`: samples and failures per unit; `worth`: what they count as once identical
    replays are weighed (samples, failures, the replays' correlation), where it differs."""
    n_units = len(table.cell)
    shown = {c for c, k in zip(table.commit, k_all, strict=True) if k > 0}
    commits = tuple(c for c in commits_all if c in shown)
    in_scope = np.isin(np.array(table.commit, dtype=object), list(commits))
    n, k = np.where(in_scope, n_all, 0), np.where(in_scope, k_all, 0)
    scope = in_scope & (n > 0)
    dims = {d: [v if scope[i] else None for i, v in enumerate(vs)] for d, vs in table.dims.items()}
    # A dimension needs two levels to be one: a single level besides "not applicable" only restates
    # which cells some other axis switched off.
    dims = {d: vs for d, vs in dims.items() if len({v for v in vs if v is not None}) >= 2}
    total_k, total_n = int(k.sum()), int(n.sum())
    # The statistics read what the samples are worth (identical replays weighed); counts shown are samples.
    ns, ks = (np.where(scope, worth[0], 0.0), np.where(scope, worth[1], 0.0)) if worth is not None else \
        (n.astype(np.float64), k.astype(np.float64))
    replay_rho = worth[2] if worth is not None else 0.0
    per_cell: dict[str, list[int]] = {}
    for i, cid in enumerate(table.cell):
        got = per_cell.setdefault(cid, [0, 0])
        got[0], got[1] = got[0] + int(k[i]), got[1] + int(n[i])
    failing_cells = tuple((cid, Count(f, t)) for cid, (f, t) in sorted(per_cell.items(), key=lambda kv: -kv[1][0])
                          if f > 0)
    conjs: list[_Conj] = []
    for conj in _conjunctions(dims, max_terms):
        mask = _mask(dims, conj, n_units) & scope
        if not mask.any() or mask.sum() == scope.sum():
            continue  # selects nothing, or everything: no test
        conjs.append(_Conj(conj, mask, int(k[mask].sum()), int(n[mask].sum())))
    ll = od.loglik(ks, ns)
    cell_of = np.unique(np.array(table.cell, dtype=object), return_inverse=True)[1]
    rho_cell = float(od.within_settings(ll, cell_of, scope).mean[0])
    whole = od.dispersion(ll, scope[None, :], scope)
    if conjs:
        masks = np.array([c.mask for c in conjs], dtype=bool)
        disp = od.dispersion(ll, masks, scope)
        w = od.weights(ns, disp.mean)
        wk, wn = w * ks[None, :], w * ns[None, :]
        k_tot, n_tot = (wk * scope).sum(axis=1), (wn * scope).sum(axis=1)
        p = _effective_fisher((wk * masks).sum(axis=1), (wn * masks).sum(axis=1), k_tot, n_tot)
        for c, pv, pa, rho, high in zip(conjs, p, holm(p), disp.mean, disp.high, strict=True):
            c.p, c.p_adj, c.rho, c.rho_high = float(pv), float(pa), float(rho), float(high)
    rho0 = float(whole.mean[0])
    unexplained = ModeExplanation(
        mode=mode, verdict=Verdict.UNEXPLAINED, terms=(), inside=Count(total_k, total_n), outside=Count(0, 0),
        p_value=None, p_adjusted=None, tried=len(conjs), cases=cases, commits=commits, clean_commits=(),
        failing_cells=failing_cells, failures=total_k, cells_in_scope=len({table.cell[i] for i in np.flatnonzero(scope)}),
        rho=rho0, rho_high=float(whole.high[0]), starts=len({table.start[i] for i in np.flatnonzero(scope)}),
        worth=od.worth(ns[scope], rho0), replay_rho=replay_rho)

    choice = _best(conjs, dims, ns, ks, alpha, max_terms, rho_cell, cell_of, scope)
    best = None if choice is None else choice.conj
    # Every conjunction of that size selecting the same starts is an alias the design cannot tell from it.
    alternatives = [] if best is None else [c for c in conjs if len(c.terms) == len(best.terms) and c is not best
                                            and np.array_equal(c.mask, best.mask)]
    significant = choice is not None and choice.claimed
    everything = _Conj((), scope.copy(), total_k, total_n, rho=rho0)
    # No setting credibly matters: it fails everywhere, or the samples are too few to say where.
    if not significant and not _too_broad(everything, dims, ns, ks, alpha, rho_cell, cell_of) \
            and (best is None or all(k[scope] > 0)):
        return dataclasses.replace(unexplained, verdict=Verdict.EVERYWHERE, clean_commits=_clean_commits(
            (), table, n_all, k_all, commits_all, commits))
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
            part = _mask(dims, rest, n_units) & scope & (col != v)
            without.append(Without(terms[i], Count(int(k[part].sum()), int(n[part].sum()))))
    out_mask = scope & ~best.mask
    w_best = od.weights(ns, [best.rho])[0]
    unsure = tuple((Term(d, "not applicable" if v is None else v), Count(int(k[m].sum()), int(n[m].sum())))
                   for d, v, m in (choice.unsure if choice is not None else []))
    refinements = tuple(_terms(c.terms, scope, table) for c in conjs
                        if len(c.terms) > len(best.terms) and np.array_equal(c.mask, best.mask)
                        and set(best.terms) < set(c.terms))
    return dataclasses.replace(
        unexplained, verdict=verdict, terms=terms, inside=Count(best.a, best.n_in),
        outside=Count(int(k[out_mask].sum()), int(n[out_mask].sum())), p_value=best.p, p_adjusted=best.p_adj,
        clean_commits=_clean_commits(best.terms, table, n_all, k_all, commits_all, commits),
        without=tuple(without),
        alternatives=tuple(_terms(c.terms, scope, table) for c in alternatives),
        effective_notes=_effective_notes(best, terms, table, scope, n, k),
        rho=best.rho, rho_high=best.rho_high, worth=od.worth(ns[scope], best.rho),
        inside_evidence=_evidence(best.mask, ns, ks, w_best), outside_evidence=_evidence(out_mask, ns, ks, w_best),
        unsure_parts=unsure, refinements=refinements,
        unneeded=tuple(terms[i] for i in (choice.unneeded if choice is not None else [])))


@dataclass
class _Choice:
    """The conjunction the search names, whether it is claimed, and the parts that kept it from a
    claim (refinements that do not credibly fail: the samples cannot tell it from the narrower one)."""

    conj: _Conj
    claimed: bool
    unsure: list[tuple[str, str | None, np.ndarray]] = field(default_factory=list)
    unneeded: list[int] = field(default_factory=list)  # terms (by index) whose need is not shown


def _best(conjs: Sequence[_Conj], dims: Mapping[str, Sequence[str | None]], n: np.ndarray, k: np.ndarray,  # noqa: PLR0917
          alpha: float, max_terms: int, rho_cell: float, cell_of: np.ndarray, scope: np.ndarray) -> _Choice | None:
    """The smallest conjunction that can be claimed, else the smallest that fits (not claimed).

    It fits when it holds 95 % of the failures, no part of it is credibly clean (`_too_broad`) and
    each of its terms is needed (`_necessary`: a larger conjunction is only reached through a
    credibly clean part of the smaller). It is claimed when it is significant after Holm and each
    of its one-term refinements credibly fails (`_unsure_parts`): otherwise the samples cannot tell
    it from the refinement that leaves that part out, and naming it would claim a term too few."""
    first: _Choice | None = None
    loose: list[_Conj] = []  # hold the failures, no part credibly clean, a term's need not shown
    total_k = float(k[scope].sum())
    for size in range(1, max_terms + 1):
        whole = [c for c in conjs if len(c.terms) == size and float(k[c.mask].sum()) >= COVERAGE * total_k
                 and not _too_broad(c, dims, n, k, alpha, rho_cell, cell_of)]
        fitting = [c for c in whole if _necessary(c, dims, n, k, alpha, rho_cell, scope)]
        loose += [c for c in whole if c not in fitting]
        fitting.sort(key=lambda c: (c.p, c.n_in, [str(t) for t in c.terms]))
        for c in fitting:
            if c.p_adj >= alpha:
                break
            unsure = _unsure_parts(c, dims, n, k, alpha, rho_cell, scope)
            if not unsure:
                return _Choice(c, True)
            if first is None:
                first = _Choice(c, False, unsure)
        if fitting and first is None:
            first = _Choice(fitting[0], False)
    if first is None and loose:
        # Nothing fits, but conjunctions hold the failures with no part of them credibly clean: the
        # samples are too few to show which of their terms are needed (a parent with the term false
        # has no or few starts), which is not "no conjunction separates it". The most significant is
        # named, not claimed, with the terms whose need is not shown: starts there tell.
        best = min(loose, key=lambda c: (c.p, len(c.terms), c.n_in, [str(t) for t in c.terms]))
        unneeded = [i for i in range(len(best.terms)) if not _needed(best, i, dims, n, k, alpha, scope)]
        return _Choice(best, False, unneeded=unneeded)
    return first


def _terms(conj: Sequence[tuple[str, str]], scope: np.ndarray, table: Units) -> tuple[Term, ...]:
    """The conjunction's terms, with the values its cells asked for. A term is marked effective when
    some cell in scope ran another value than it asked for where the term reads it: the term read on
    requested values would select other cells. That holds wherever the conjunction itself would
    select other cells, and also where only its parts would (MTP ∧ V2 on a matrix whose ngram cells
    fall back to V1: the conjunction's cells are the same either way, but "V2 alone" is not), so the
    counts a reader sees for the term are those of what ran."""
    out = []
    for dim, value in conj:
        ran = scope.copy()
        for d, v in conj:
            ran &= np.array([x == v for x in table.dims[d]], dtype=bool)
        requested = tuple(sorted({str(table.requested[dim][i]) for i in np.flatnonzero(ran)}))
        if dim.endswith(EFFECTIVE_SUFFIX):
            out.append(Term(dim, value, True, ()))
            continue
        reads_ran = scope & np.array([x == value for x in table.dims[dim]], dtype=bool)
        reads_asked = scope & np.array([x == value for x in table.requested[dim]], dtype=bool)
        out.append(Term(dim, value, not np.array_equal(reads_ran, reads_asked), requested))
    return tuple(out)


def _effective_notes(best: _Conj, terms: Sequence[Term], table: Units, scope: np.ndarray, n: np.ndarray,
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
        notes.append(f"{display_axis(d)}: {len({table.cell[i] for i in moved})} cell(s) ran another value than "
                     f"requested ({'; '.join(asked)}); explained on what ran — on requested values "
                     f"{' ∧ '.join(str(Term(x, y)) for x, y in best.terms)} holds "
                     f"{int(k[req_mask].sum())}/{int(n[req_mask].sum())} failing")
    return tuple(notes)


def _clean_commits(terms: Sequence[tuple[str, str]], table: Units, n_all: np.ndarray, k_all: np.ndarray,
                   commits_all: Sequence[str], commits: Sequence[str]) -> tuple[tuple[str, Count], ...]:
    out = []
    for commit in commits_all:
        if commit in commits:
            continue
        mask = np.array([c == commit for c in table.commit], dtype=bool)
        for d, v in terms:
            mask &= np.array([x == v for x in table.dims.get(d, [None] * len(mask))], dtype=bool)
        out.append((commit, Count(int(k_all[mask].sum()), int(n_all[mask].sum()))))
    return tuple(out)
