"""An explanation as text: each failure mode's conjunction with its evidence, in the words `sweep report
--explain` prints (reads results only). The judgment itself is `sweeper.judge.explain`'s."""

from __future__ import annotations

from sweeper.judge import overdispersion as od
from sweeper.judge.explain import Explanation, ModeExplanation, Verdict, Without, display_axis


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
    if m.unit == "samples":
        lines = [f"{m.mode}  ({m.failures:,} failing samples; cases: {len(m.cases)})"]
    else:
        total = m.inside.n + m.outside.n if m.terms else m.inside.n
        lines = [f"{m.mode}  ({m.failures:,} of {total:,} {m.unit} failed)"]
        lines.extend(f"  status detail: {text}" + (f" ({count} starts)" if count > 1 else "")
                     for text, count in m.details[:3])
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
                     f"(Fisher on per-start counts {fmt_p(m.p_value)}; Holm-adjusted over {m.tried:,} "
                     f"conjunctions: {fmt_p(m.p_adjusted)})")
        if m.without:
            parts = [f"{_without_name(w, m)}: {w.count}" for w in m.without]
            if all(w.count.failed == 0 for w in m.without):
                parts[-1] += " — neither alone fails." if len(parts) == 2 else " — no part alone fails."
            lines.append("  " + "; ".join(parts))
        if m.verdict is Verdict.NOT_IDENTIFIABLE:
            alts = " or ".join(" ∧ ".join(map(str, a)) for a in m.alternatives)
            lines.append(f"  not identifiable in this matrix: {m.conjunction} and {alts} select the same cells "
                         "(they never vary apart here); a design that varies them apart tells which")
        if m.verdict is Verdict.TOO_FEW and m.unsure_parts:
            unsure = "; ".join(f"{m.conjunction} ∧ {t}: {c}" for t, c in m.unsure_parts[:4])
            lines.append(f"  too few samples to tell it from a narrower conjunction: {'these parts do' if len(m.unsure_parts) > 1 else 'this part does'} "
                         f"not credibly fail ({unsure}{' …' if len(m.unsure_parts) > 4 else ''}); "
                         "more starts there tell whether the term it lacks matters")
        elif m.verdict is Verdict.TOO_FEW and m.unneeded:
            names = ", ".join(f"{display_axis(t.axis)}={t.value}" for t in m.unneeded)
            lines.append(f"  too few samples to tell whether {'each of these terms is' if len(m.unneeded) > 1 else 'this term is'} "
                         f"needed ({names}): with it false, the rest is not credibly cleaner; more starts "
                         "there tell")
        elif m.verdict is Verdict.TOO_FEW:
            lines.append("  not significant after correction: too few samples to tell")
        if m.refinements:
            alts = " or ".join(" ∧ ".join(map(str, a)) for a in m.refinements[:4])
            lines.append(f"  the design cannot tell it from {alts}{' …' if len(m.refinements) > 4 else ''}: "
                         "they select the same cells (this design never varies the extra terms there)")
        lines.extend(f"  effective: {note}" for note in m.effective_notes)
    if m.replay_rho >= od.HIGH_RHO and m.unit == "samples":
        lines.append(f"  replays: a request sent again to the same server start mostly repeats its outcome (correlation "
                     f"{m.replay_rho:.2f}): each counts as a fraction of a sample, {m.worth:,.0f} in all; distinct "
                     "requests add more power than repeats")
    if m.rho >= od.HIGH_RHO and m.unit == "samples":
        total = m.inside.n + m.outside.n if m.terms else m.inside.n
        lines.append(f"  dispersion: failures vary between server starts (intra-start correlation {m.rho:.2f}, "
                     f"up to {m.rho_high:.2f} credible): {total:,} {m.unit} over {m.starts:,} starts count as "
                     f"{m.worth:,.0f}; more starts per setting, not more samples per start, add power")
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
