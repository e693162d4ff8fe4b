"""`sweeper.judge.explain` off the clean path: failures that vary between server starts, the version's
default and include rules as levels, designs that are not a full product, failed servers as a mode,
and the JSON form. On samples and cells tables built here (exact counts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy.stats import fisher_exact
from test_explain import BUDGET, FSM, SUITE, build, only

from sweeper.judge import explain
from sweeper.judge.explain import Verdict
from sweeper.reports import explain_text
from sweeper.reports.explain_json import to_json
from sweeper.spec.suite import Suite, load_suite
from sweeper.store import frames as analysis

FSM_MODE = "finish_reason + json_schema + log_absent(Failed to advance FSM) + no_whitespace_tail"


@pytest.fixture
def suite(tmp_path: Path) -> Suite:
    path = tmp_path / "t.yaml"
    path.write_text(SUITE)
    return load_suite(path)


def per_start(cells: dict[str, tuple[dict[str, Any], list[int] | list[tuple[int, int]]]], n: int,
              case: str = "json", checks: list[str] = FSM, replays: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tables where each cell (id -> (axis values, failures per start)) has one server start per
    entry, n samples each (or (failures, samples) per start); the first k of a start fail. With
    `replays` > 1 each request is sent that many times in a row (case ids repeat)."""
    srows, crows = [], []
    for cid, (values, starts) in cells.items():
        values = {"commit": "c1", **values}
        for s, entry in enumerate(starts):
            k, size = entry if isinstance(entry, tuple) else (entry, n)
            for r in range(size):
                srows.append({"run_id": "t", "group_id": f"{cid}#{s}", "cell_id": cid, "commit": "c1",
                              "commit_sha": "c1".ljust(40, "0"),
                              "case_id": case if replays == 1 else f"{case}{r // replays}", "repeat": r,
                              "request_id": f"{cid}-{s}-{r}", "passed": r >= k,
                              "failed_checks": list(checks) if r < k else [],
                              "axes": [(a, json.dumps(v)) for a, v in values.items()]})
        crows.append({"cell_id": cid, "commit": "c1", "status": "ok", "effective_differs": []})
    return analysis.with_axes(pd.DataFrame(srows)), pd.DataFrame(crows)


def grid(planted: tuple[str, str], starts: dict[tuple[str, str], list[int]], default: list[int]) -> dict[
        str, tuple[dict[str, Any], list[int] | list[tuple[int, int]]]]:
    out = {}
    for spec in ("none", "ngram", "mtp"):
        for runner in ("0", "1"):
            out[f"{spec}-{runner}"] = ({"spec_method": spec, "env.VLLM_USE_V2_MODEL_RUNNER": runner},
                                       starts.get((spec, runner), default))
    return out


# ---- the unit of evidence is the server start ---------------------------------------------------

def test_starts_that_disagree_count_as_less_than_their_samples(suite: Suite) -> None:
    """The same 20 failures in 60 samples of mtp on V2: spread evenly over its three starts they are
    strong evidence; all in one start they are what one odd start can do."""
    even = grid(("mtp", "1"), {("mtp", "1"): [7, 7, 6]}, [0, 0, 0])
    lumped = grid(("mtp", "1"), {("mtp", "1"): [20, 0, 0]}, [0, 0, 0])
    a = only(explain.explain(*per_start(even, 20), suite=suite))
    b = only(explain.explain(*per_start(lumped, 20), suite=suite))
    assert a.verdict is Verdict.EXPLAINED and a.conjunction == "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1"
    assert str(a.inside) == "20/60" and a.inside_evidence is not None and a.inside_evidence.starts == 3
    assert a.rho < 0.05 < b.rho
    # One odd start cannot tell mtp from mtp on V2, nor either from chance.
    assert b.verdict is Verdict.TOO_FEW and b.p_adjusted is not None and b.p_adjusted > 0.01
    # The cost of the dispersion is said.
    assert "dispersion: failures vary between server starts" in "\n".join(explain_text.describe(b))


def test_one_clean_start_does_not_make_a_planted_cell_clean(suite: Suite) -> None:
    """mtp fails on both runners, one of its starts by chance not at all: read sample by sample that
    start is a credibly clean part, and "mtp" would be rejected."""
    cells = grid(("mtp", "*"), {("mtp", "0"): [12, 0, 10], ("mtp", "1"): [11, 9, 13]}, [0, 0, 0])
    m = only(explain.explain(*per_start(cells, 20), suite=suite))
    assert (m.verdict, m.conjunction) == (Verdict.EXPLAINED, "spec_method=mtp")
    assert m.rho > 0.05


def test_failures_of_random_starts_are_not_a_setting(suite: Suite) -> None:
    """No setting matters: a few starts of every kind fail a lot (rate 0.1, intra-start correlation
    0.5). Counted sample by sample the worst setting would look significant."""
    rng = np.random.default_rng(11)
    cells = {}
    for spec in ("none", "ngram", "mtp"):
        for runner in ("0", "1"):
            for backend in ("FLASH_ATTN", "FLASHINFER"):
                rates = rng.beta(0.1, 0.9, size=2)
                cells[f"{spec}-{runner}-{backend}"] = (
                    {"spec_method": spec, "env.VLLM_USE_V2_MODEL_RUNNER": runner, "attention_backend": backend},
                    [int(x) for x in rng.binomial(20, rates)])
    m = only(explain.explain(*per_start(cells, 20), suite=suite))
    assert m.verdict is not Verdict.EXPLAINED and m.verdict is not Verdict.NOT_IDENTIFIABLE, m.conjunction
    assert m.rho > 0.1


def test_the_test_is_fisher_on_the_effective_counts(suite: Suite) -> None:
    samples, cells = build({"spec_method": ["none", "ngram", "mtp"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"]},
                           lambda c: 0.5 if (c["spec_method"], c["env.VLLM_USE_V2_MODEL_RUNNER"]) == ("mtp", "1") else 0)
    m = only(explain.explain(samples, cells, suite=suite))
    ins, outs = m.inside_evidence, m.outside_evidence
    assert ins is not None and outs is not None and (ins.starts, outs.starts) == (2, 10)
    a, n_in = round(ins.failed), round(ins.n)
    k, n = round(ins.failed + outs.failed), round(ins.n + outs.n)
    assert m.p_value == pytest.approx(fisher_exact([[a, n_in - a], [k - a, n - n_in - k + a]], alternative="greater")[1])
    # One sample per start (a failed server) is worth one: the effective counts are the counts.
    assert ins.n < m.inside.n



def test_a_term_is_not_claimed_because_the_smaller_conjunction_fell_short(suite: Suite) -> None:
    """mtp's starts on V2 disagree (12, 2, 10 of 20): at that dispersion its three nearly clean starts
    on V1 (0, 1, 0) are what chance does, so V2 is no credible term. "mtp" alone is not significant
    at the dispersion its two halves show; that is no reason to claim "mtp ∧ V2", whose own starts
    happen to agree better with each other: too few samples."""
    cells = grid(("mtp", "*"), {("mtp", "1"): [12, 2, 10], ("mtp", "0"): [0, 1, 0]}, [0, 0, 0])
    m = only(explain.explain(*per_start(cells, 20), suite=suite))
    assert (m.verdict, m.conjunction) == (Verdict.TOO_FEW, "spec_method=mtp")

def _replay_suite(tmp_path: Path, cases: int) -> Suite:
    """A suite of `cases` JSON cases (json0, json1, ...) with the FSM checks."""
    body = "".join(f"""  - id: json{i}
    checks: [http_ok, {{finish_reason: {{expected: stop}}}}, json_schema, no_whitespace_tail,
             {{log_absent: {{pattern: "Failed to advance FSM"}}}}]
    body:
      messages: [{{role: user, content: "JSON {i}"}}]
      response_format: {{type: json_schema, json_schema: {{name: x, schema: {{type: object}}}}}}
""" for i in range(cases))
    path = tmp_path / "replays.yaml"
    path.write_text(f"name: r\ndefaults: {{repeat: 1}}\ncases:\n{body}")
    return load_suite(path)


def test_identical_replays_count_for_what_they_are_worth(tmp_path: Path) -> None:
    """Each start sends 4 requests 5 times each; a failing request fails every replay. Two starts of
    mtp on V2 with 2 of 4 requests failing are 4 failing draws, not 20 failing samples: read sample by
    sample (even with a dispersion between starts) they would look conclusive."""
    suite = _replay_suite(tmp_path, 4)
    cells = grid(("mtp", "1"), {("mtp", "1"): [10, 10]}, [0, 0])
    m = only(explain.explain(*per_start(cells, 20, replays=5), suite=suite))
    assert m.replay_rho > 0.9
    # 240 samples are 12 starts of 4 distinct requests: worth at most 48 draws.
    assert m.worth <= 48.5, m.worth
    assert m.verdict is Verdict.TOO_FEW and m.p_adjusted is not None and m.p_adjusted > 0.01
    assert "replays: a request sent again to the same server start mostly repeats its outcome" in \
        "\n".join(explain_text.describe(m))
    # The same failures on distinct requests are 20 draws, and conclusive.
    varied = only(explain.explain(*per_start(cells, 20, replays=1), suite=suite))
    assert varied.replay_rho == 0 and varied.verdict is Verdict.EXPLAINED


def test_replays_that_disagree_count_as_samples(tmp_path: Path) -> None:
    """Replays whose outcomes vary as independent draws would: the replays' correlation is about 0."""
    rng = np.random.default_rng(3)
    suite = _replay_suite(tmp_path, 4)
    srows = []
    for cell in range(6):
        for start in range(2):
            for r in range(40):
                fail = bool(rng.random() < (0.5 if cell == 0 else 0.0))
                srows.append({"run_id": "t", "group_id": f"c{cell}#{start}", "cell_id": f"c{cell}", "commit": "c1",
                              "commit_sha": "c1".ljust(40, "0"), "case_id": f"json{r % 4}", "repeat": r,
                              "request_id": f"{cell}-{start}-{r}", "passed": not fail,
                              "failed_checks": list(FSM) if fail else [],
                              "axes": [("commit", json.dumps("c1")), ("spec_method", json.dumps(["none", "mtp"][cell % 2])),
                                       ("attention_backend", json.dumps(["A", "B", "C"][cell // 2]))]})
    m = only(explain.explain(analysis.with_axes(pd.DataFrame(srows)), None, suite=suite))
    assert m.replay_rho < 0.1


def test_a_part_too_small_to_tell_is_not_claimed_clean_or_failing(suite: Suite) -> None:
    """mtp on V2 fails with FLASHINFER; its FLASH_ATTN cell ran 3 samples, none failing. Those are too
    few to say the conjunction mtp ∧ V2 fails there too: naming it would claim a term too few if
    the backend matters, naming the three terms one too many if it does not. Too few samples, and
    the part that would tell is named; with 20 clean samples there the three terms are claimed."""
    def cells(small: list[int] | list[tuple[int, int]]) -> dict[str, tuple[dict[str, Any], list[int] | list[tuple[int, int]]]]:
        out: dict[str, tuple[dict[str, Any], list[int] | list[tuple[int, int]]]] = {}
        for spec in ("none", "ngram", "mtp"):
            for runner in ("0", "1"):
                for backend in ("FLASH_ATTN", "FLASHINFER"):
                    starts: list[int] | list[tuple[int, int]] = [0, 0]
                    if (spec, runner) == ("mtp", "1"):
                        starts = [12, 10] if backend == "FLASHINFER" else small
                    out[f"{spec}-{runner}-{backend}"] = ({"spec_method": spec, "env.VLLM_USE_V2_MODEL_RUNNER": runner,
                                                          "attention_backend": backend}, starts)
        return out
    m = only(explain.explain(*per_start(cells([(0, 3)]), 20), suite=suite))
    assert (m.verdict, m.conjunction) == (Verdict.TOO_FEW, "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1")
    assert [(str(t), str(c)) for t, c in m.unsure_parts] == [("attention_backend=FLASH_ATTN", "0/3")]
    assert "too few samples to tell it from a narrower conjunction" in "\n".join(explain_text.describe(m))
    full = only(explain.explain(*per_start(cells([0, 0]), 20), suite=suite))
    assert (full.verdict, full.conjunction) == \
        (Verdict.EXPLAINED, "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 ∧ attention_backend=FLASHINFER")
    doc = to_json(explain.explain(*per_start(cells([(0, 3)]), 20), suite=suite))["modes"][0]
    assert doc["unsure_parts"] == [{"term": {"axis": "attention_backend", "name": "attention_backend",
                                             "value": "FLASH_ATTN", "effective": False, "requested": []},
                                    "failed": 0, "n": 3}]

# A covering design's first zoom phase on a planted mtp ∧ FLASH_ATTN ∧ bfloat16 bug (rate 0.58), as it
# ran: per server start its levels and 8 outcomes (two requests, each sent 4 times; x failed).
PHASE_AXES = ("spec_method", "attention_backend", "env.VLLM_ENFORCE_STRICT_TOOL_CALLING",
              "env.VLLM_USE_V2_MODEL_RUNNER", "serve.--dtype", "serve.--enforce-eager")
PHASE = """
mtp FLASH_ATTN 0 0 bfloat16 true ..xx.xxx | mtp FLASH_ATTN 0 0 float16 false ........
mtp FLASH_ATTN 0 1 bfloat16 true .x...x.. | mtp FLASH_ATTN 1 0 bfloat16 false xx.xx..x
mtp FLASH_ATTN 1 1 bfloat16 false xxxxxxxx | mtp FLASH_ATTN 1 1 float16 false ........
mtp TRITON_ATTN 0 1 bfloat16 true ........ | mtp TRITON_ATTN 0 1 float16 false ........
mtp TRITON_ATTN 1 0 float16 true ........ | mtp TRITON_ATTN 1 1 bfloat16 true ........
ngram FLASH_ATTN 0 1 float16 true ........ | ngram FLASH_ATTN 1 0 bfloat16 true ........
ngram FLASH_ATTN 1 0 float16 false ........ | ngram TRITON_ATTN 0 0 bfloat16 false ........
ngram TRITON_ATTN 1 1 bfloat16 true ........ | ngram TRITON_ATTN 1 1 float16 false ........
none FLASH_ATTN 0 0 float16 true ........ | none FLASH_ATTN 1 1 bfloat16 false ........
none TRITON_ATTN 0 0 bfloat16 false ........ | none TRITON_ATTN 0 1 bfloat16 true ........
none TRITON_ATTN 1 0 float16 false ........ | none TRITON_ATTN 1 1 float16 true ........
"""


def phase_samples(text: str) -> pd.DataFrame:
    rows = []
    for i, start in enumerate(x.split() for line in text.strip().splitlines() for x in line.split("|")):
        values: dict[str, Any] = {"commit": "c1", **dict(zip(PHASE_AXES, start[:-1], strict=True))}
        values["serve.--enforce-eager"] = values["serve.--enforce-eager"] == "true"
        cid = f"s{i}"
        for r, outcome in enumerate(start[-1]):
            rows.append({"run_id": "t", "group_id": cid, "cell_id": cid, "commit": "c1", "commit_sha": "c1".ljust(40, "0"),
                         "case_id": f"json{r // 4}", "repeat": r % 4, "request_id": f"{cid}-{r}",
                         "passed": outcome == ".", "failed_checks": list(FSM) if outcome == "x" else [],
                         "axes": [(a, json.dumps(v)) for a, v in values.items()]})
    return analysis.with_axes(pd.DataFrame(rows))


def test_a_conjunction_holding_every_failure_whose_terms_are_not_yet_shown_needed_is_too_few(suite: Suite) -> None:
    """Every failure lies in mtp ∧ FLASH_ATTN ∧ bfloat16, and no part of it is credibly clean; but its
    corners with one term false ran two starts each, too few to show at this dispersion that each term
    is needed, and each smaller conjunction has a clean part. That is too few samples to say which
    terms matter (naming the conjunction, with the terms not yet shown needed, for more starts
    there), not "no conjunction separates it"."""
    m = only(explain.explain(phase_samples(PHASE), None, suite=suite))
    assert (m.verdict, m.conjunction) == (Verdict.TOO_FEW, "spec_method=mtp ∧ attention_backend=FLASH_ATTN ∧ serve.--dtype=bfloat16")
    assert m.unneeded and {t.axis for t in m.unneeded} <= {"spec_method", "attention_backend", "serve.--dtype"}
    assert [str(w.count) for w in m.without] == ["0/16", "0/16", "0/16"]
    assert "too few samples to tell whether" in "\n".join(explain_text.describe(m))
    doc = to_json(explain.explain(phase_samples(PHASE), None, suite=suite))["modes"][0]
    assert [t["axis"] for t in doc["unneeded_terms"]] == [t.axis for t in m.unneeded]


# ---- every value is a value ---------------------------------------------------------------------

def _async_effective(c: dict[str, Any]) -> dict[str, Any]:
    """The version's default is async scheduling on, except with ngram, which turns it off."""
    ran = c["async_scheduling"] if c["async_scheduling"] is not None else c["spec_method"] != "ngram"
    differs = ["async_scheduling"] if c["async_scheduling"] is not None and ran != c["async_scheduling"] else []
    return {"differs": differs, "columns": {"effective_async_scheduling": ran}}


def test_the_versions_default_is_a_level_resolved_to_what_ran(suite: Suite) -> None:
    """`async_scheduling: [null, false]` with a bug on effective async: null is not "not applicable"."""
    samples, cells = build({"spec_method": ["none", "ngram", "mtp"], "async_scheduling": [None, False]},
                           lambda c: 0.5 if _async_effective(c)["columns"]["effective_async_scheduling"] else 0,
                           effective=_async_effective)
    m = only(explain.explain(samples, cells, suite=suite))
    assert (m.verdict, m.conjunction) == (Verdict.EXPLAINED, "async_scheduling=true (effective)")
    assert (str(m.inside), str(m.outside)) == ("20/40", "0/80")
    assert [(t.axis, t.value, t.effective, t.requested) for t in m.terms] == \
        [("async_scheduling", "true", True, ("default",))]
    # Read on requested values only (no log), the failing cells (none and mtp on the default) are
    # no conjunction: what the default was is what tells.
    assert only(explain.explain(samples, None, suite=suite)).verdict is Verdict.UNEXPLAINED


def test_a_confound_made_with_include_is_not_identifiable(suite: Suite) -> None:
    """A serve flag added only, and always, to the float16 cells: the two never vary apart."""
    design = [{"spec_method": s, "serve.--dtype": d, **({"serve.--enforce-eager": True} if d == "float16" else {})}
              for s in ("none", "mtp") for d in ("float16", "bfloat16")]
    samples, cells = build({}, lambda c: 0.5 if c["serve.--dtype"] == "float16" else 0, cells=design)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.NOT_IDENTIFIABLE
    assert {m.conjunction, *(" ∧ ".join(map(str, a)) for a in m.alternatives)} == \
        {"serve.--dtype=float16", "serve.--enforce-eager=true"}
    # The flag is a dimension because its absence is a level: on the other cells it is "unset".
    assert to_json(explain.explain(samples, cells, suite=suite))["modes"][0]["aliases"][0][0]["value"] in \
        {"true", "float16"}


def test_a_fraction_of_the_product_reports_every_alias(suite: Suite) -> None:
    """Half of a 2x2x2 product (c = a xor b): the failing cell is selected by three pairs alike."""
    design = [{"spec_method": s, "env.VLLM_USE_V2_MODEL_RUNNER": v, "attention_backend": b}
              for s, v, b in [("none", "0", "FLASH_ATTN"), ("none", "1", "FLASHINFER"),
                              ("mtp", "0", "FLASHINFER"), ("mtp", "1", "FLASH_ATTN")]]
    samples, cells = build({}, lambda c: 1.0 if (c["spec_method"], c["env.VLLM_USE_V2_MODEL_RUNNER"]) == ("mtp", "1")
                           else 0, cells=design, case="think", checks=BUDGET)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.NOT_IDENTIFIABLE
    assert {m.conjunction, *(" ∧ ".join(map(str, a)) for a in m.alternatives)} == {
        "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1", "spec_method=mtp ∧ attention_backend=FLASH_ATTN",
        "VLLM_USE_V2_MODEL_RUNNER=1 ∧ attention_backend=FLASH_ATTN"}


# ---- failed servers ---------------------------------------------------------------------------------

def test_failed_servers_are_a_mode_with_their_status_detail(suite: Suite) -> None:
    axes = {"spec_method": ["none", "ngram", "mtp"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"],
            "attention_backend": ["FLASH_ATTN", "FLASHINFER"], "serve.--max-num-seqs": [64, 128, 256], "request.temperature": [0, 1]}
    samples, cells = build(axes, lambda c: 0.0)
    values = [dict(a) for a in samples.drop_duplicates("cell_id")["axes"]]
    cells["axes"] = [list(v.items()) for v in values]
    # The two temperatures of a setting are cells of one server group.
    cells["group_id"] = [json.dumps({k: x for k, x in v.items() if k != "request.temperature"}) for v in values]
    failed = [json.loads(v["spec_method"]) == "mtp" and json.loads(v["env.VLLM_USE_V2_MODEL_RUNNER"]) == "1"
              for v in values]
    cells["status"] = ["server_failed" if f else "ok" for f in failed]
    cells["status_detail"] = ["ValueError: MTP is not supported by Model Runner V2\nmore" if f else None
                              for f in failed]
    ok = set(cells.loc[~np.array(failed), "cell_id"])
    e = explain.explain(samples[samples["cell_id"].isin(ok)], cells, suite=suite)
    m = only(e)
    assert (m.mode, m.unit, m.verdict) == ("server_failed", "server starts", Verdict.EXPLAINED)
    assert m.conjunction == "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1"
    # The two temperatures of a setting share its server: one start each, and no request axis.
    # The two temperatures of a setting share its server: one start each, and no request axis.
    assert (str(m.inside), str(m.outside)) == ("6/6", "0/30")
    assert m.details == (("ValueError: MTP is not supported by Model Runner V2", 6),)
    assert m.p_value == pytest.approx(fisher_exact([[6, 0], [0, 30]], alternative="greater")[1])
    text = explain_text.render(e)
    assert "mode 1: server_failed  (6 of 36 server starts failed)" in text
    assert "status detail: ValueError: MTP is not supported by Model Runner V2 (6 starts)" in text


# ---- JSON ---------------------------------------------------------------------------------------------

def test_the_json_form(suite: Suite) -> None:
    samples, cells = build({"spec_method": ["none", "ngram", "mtp"], "async_scheduling": [None, False]},
                           lambda c: 0.5 if _async_effective(c)["columns"]["effective_async_scheduling"] else 0,
                           effective=_async_effective, commits=("c1", "c2"))
    samples = samples[~((samples["commit"] == "c2") & ~samples["passed"])]  # c2 is clean
    doc = json.loads(json.dumps(to_json(explain.explain(samples, cells, suite=suite, commit_order=["c1", "c2"]))))
    assert doc["schema_version"] == 3 and doc["alpha"] == 0.01 and len(doc["modes"]) == 1
    mode = doc["modes"][0]
    assert (mode["number"], mode["mode"], mode["verdict"], mode["unit"]) == (1, FSM_MODE, "explained", "samples")
    assert mode["conjunction"] == [{"axis": "async_scheduling", "name": "async_scheduling", "value": "true",
                                    "effective": True, "requested": ["default"]}]
    assert (mode["inside"]["failed"], mode["inside"]["n"], mode["outside"]["failed"]) == (20, 40, 0)
    for side in ("inside", "outside"):
        assert 0 <= mode[side]["low"] <= mode[side]["rate"] <= mode[side]["high"] <= 1
        assert mode[side]["starts"] > 0 and mode[side]["effective_n"] <= mode[side]["n"]
    assert mode["test"]["p_adjusted"] < 0.01 and mode["test"]["tried"] > 0 and "Fisher" in mode["test"]["name"]
    assert mode["aliases"] == []
    assert mode["scope"] == {"commits": ["c1"], "clean_commits": [{"commit": "c2", "failed": 0, "n": 20}]}
    assert set(mode["dispersion"]) == {"rho", "rho_high", "starts", "worth", "replay_rho"}
    assert mode["unsure_parts"] == [] and mode["aliased_refinements"] == []
