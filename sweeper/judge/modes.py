"""Failure modes: what a failed sample failed, in words that tell two bugs apart. Pure.

A failed sample's signature is its case and the set of checks it failed, each check named with the
parameter that makes it a different question: `log_absent` and `content_matches` keep their
pattern, so a whitespace tail with vLLM's "Failed to advance FSM" line and one without it are two
modes (two bugs). Signatures are then merged into modes where they always occur together:

* the same failure seen through other cases: two signatures whose failed checks agree on every
  check both cases carry (a JSON case fails `json_schema` where a tool case fails
  `tool_calls_valid`, and both fail the FSM log line and the whitespace tail), when the rarer one
  is seen mostly at commits where the other is, and the checks they share are at least half of
  what each fails (sharing a generic `finish_reason` alone makes no mode);
* a sample without an answer (`http_ok` failed) fails every other check as a consequence: its
  signature is `http_ok` alone; when the engine died serving the cell, it is the crash's signature
  (`crash: TypeError in vllm/v1/sample/rejection_sampler.py:forward`, see `sweeper.vllm.crash`),
  so two crashes are two modes and a crash is never confused with an HTTP 400;
* a start that vLLM refused naming one of the cell's settings is one sample of the mode
  `refused: <vLLM's reason>` (case `START_CASE`).

Within one case, one symptom more is another mode: whitespace with the FSM log line and whitespace
without it are two bugs. "Mostly" is at least half of the commits where the rarer signature was
seen: with flaky rates a signature can miss a commit by chance, while two different bugs rarely
share their commits unless one commit brought both. A mode is named by the checks all its
signatures fail.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from sweeper.spec.status import Status
from sweeper.spec.suite import Suite

_NO_ANSWER = "http_ok"
START_CASE = "(server start)"
# Labels no case's checks name, that any case can show: a crash, a refused start, an answer that
# broke on the wire (`sweeper.spec.checks.transport_label`).
_SERVER_LABELS = ("crash: ", "refused: ", "transport: ")
_KEEP_PARAM = {"log_absent": "pattern", "content_matches": "pattern"}
SEP = " + "


def check_labels(suite: Suite) -> dict[tuple[str, str], str]:
    """(case_id, check name) -> the label a mode uses for it."""
    labels: dict[tuple[str, str], str] = {}
    for case in suite.cases:
        for spec in case.checks:
            param = _KEEP_PARAM.get(spec.name)
            label = f"{spec.name}({spec.params[param]})" if param and param in spec.params else spec.name
            key = (case.case_id, spec.name)
            # Two checks of one name in a case cannot be told apart in a sample row: name both.
            labels[key] = label if key not in labels or labels[key] == label else f"{labels[key]}|{label}"
    return labels


def label_sets(rows: Iterable[tuple[str, Sequence[str] | None]], labels: Mapping[tuple[str, str], str],
               crash: str | None = None) -> list[tuple[str, frozenset[str]]]:
    """Each (case_id, failed check names) row of one server start as (case_id, its set of labels);
    empty for a pass. `crash`: the start's crash signature, when its engine died."""
    out = []
    for case, failed in rows:
        names = set(failed or ())
        # Without an answer every other check fails too: their verdicts are consequences, not symptoms.
        if _NO_ANSWER in names:
            out.append((case, frozenset({f"crash: {crash}" if crash else _NO_ANSWER})))
            continue
        out.append((case, frozenset(labels.get((case, name), name) for name in names)))
    return out


def start_sets(status: str, signature: str | None, rows: Iterable[tuple[str, Sequence[str] | None]],
               labels: Mapping[tuple[str, str], str]) -> list[tuple[str, frozenset[str]]] | None:
    """The samples one server start contributes, or None when the start says nothing about the
    cell (not installed, refused for a reason that names none of its settings, hung)."""
    if status in (Status.OK, Status.CRASHED):
        return label_sets(rows, labels, crash=signature if status == Status.CRASHED else None)
    if status == Status.SERVER_FAILED and signature:
        return [(START_CASE, frozenset({signature}))]
    return None


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / max(1, min(len(a), len(b)))


def assign(seen: Mapping[tuple[str, frozenset[str]], set[str]],
           case_checks: Mapping[str, set[str]]) -> dict[tuple[str, frozenset[str]], str]:
    """(case, failed labels) -> mode name, given the commits where each signature was seen and the
    labels each case checks. See the module docstring for the rules."""
    nodes = sorted(seen, key=lambda n: (n[0], sorted(n[1])))
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def projections(i: int, j: int) -> tuple[frozenset[str], frozenset[str]]:
        (ca, sa), (cb, sb) = nodes[i], nodes[j]
        # A crash or a refused start is no check of a case: any case can show it.
        anywhere = {x for x in sa | sb if x.startswith(_SERVER_LABELS)}
        common = (case_checks.get(ca, set(sa)) | anywhere) & (case_checks.get(cb, set(sb)) | anywhere)
        return sa & common, sb & common

    def close(i: int, j: int) -> bool:
        # The checks both fail must be most of what each fails: sharing only a generic
        # `finish_reason` does not make a thinking-budget failure a structured-output one.
        pa, pb = projections(i, j)
        shared = len(pa & pb)
        return bool(shared) and 2 * shared >= max(len(nodes[i][1]), len(nodes[j][1])) \
            and _overlap(seen[nodes[i]], seen[nodes[j]]) >= 0.5

    for i in range(len(nodes)):
        for j in range(i + 1, len(nodes)):
            pa, pb = projections(i, j)
            if nodes[i][0] != nodes[j][0] and pa == pb and close(i, j):
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(nodes)):
        groups[find(i)].append(i)
    out: dict[tuple[str, frozenset[str]], str] = {}
    names: set[str] = set()
    for members in sorted(groups.values(), key=lambda m: min(m)):
        sets = [nodes[i][1] for i in members]
        core = frozenset.intersection(*sets) or min(sets, key=lambda s: (len(s), sorted(s)))
        name = SEP.join(sorted(core))
        n = 2
        while name in names:
            name, n = f"{SEP.join(sorted(core))} #{n}", n + 1
        names.add(name)
        for i in members:
            out[nodes[i]] = name
    return out


def name_modes(samples: Iterable[tuple[str, Iterable[tuple[str, frozenset[str]]]]],
               case_checks: Mapping[str, set[str]]) -> dict[tuple[str, frozenset[str]], str]:
    """(case, failed labels) -> mode name, from (commit, that commit's label sets) pairs: `assign`
    over the commits where each failure signature was seen."""
    seen: dict[tuple[str, frozenset[str]], set[str]] = defaultdict(set)
    for sha, sets in samples:
        for case, failed in sets:
            if failed:
                seen[(case, failed)].add(sha)
    return assign(seen, case_checks)


def case_checks(suite: Suite, labels: Mapping[tuple[str, str], str]) -> dict[str, set[str]]:
    return {case.case_id: {labels[(case.case_id, spec.name)] for spec in case.checks} for case in suite.cases}


def count_modes(rows: Sequence[tuple[str, frozenset[str]]],
                modes: Mapping[tuple[str, frozenset[str]], str]) -> dict[str, int]:
    """Failures per mode among these (case, failed labels) samples."""
    counts: dict[str, int] = defaultdict(int)
    for case, s in rows:
        if s:
            counts[modes.get((case, s), SEP.join(sorted(s)))] += 1
    return dict(counts)
