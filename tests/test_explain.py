"""`sweeper.judge.explain`: planted conjunctions found with the right evidence — on samples tables built here
(exact counts), on a simulated history run through the real sweep, and on the demo run."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import make_sim_repo
from scipy.stats import fisher_exact

from sweeper.drivers.sweep import run_matrix
from sweeper.execute.choice import choose
from sweeper.judge import explain
from sweeper.judge.explain import Verdict
from sweeper.reports import explain_text
from sweeper.reports import tables as report
from sweeper.spec.suite import Suite, load_suite
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

# The shared runs, made once per session (a plugin: fixtures imported per module would run per module).
pytest_plugins = ["reportruns"]

SUITE = """
name: t
defaults:
  repeat: 1
  body: {max_tokens: 32}
cases:
  - id: json
    checks: [http_ok, {finish_reason: {expected: stop}}, json_schema, no_whitespace_tail,
             {log_absent: {pattern: "Failed to advance FSM"}}]
    body:
      messages: [{role: user, content: "JSON please"}]
      response_format: {type: json_schema, json_schema: {name: x, schema: {type: object}}}
  - id: think
    checks: [http_ok, {finish_reason: {expected: stop}}, {reasoning_tokens_at_most: {max: 1}}, content_nonempty]
    body:
      thinking_token_budget: 1
      messages: [{role: user, content: "1+1?"}]
"""
FSM = ["finish_reason", "json_schema", "no_whitespace_tail", "log_absent"]
BUDGET = ["finish_reason", "reasoning_tokens_at_most", "content_nonempty"]


@pytest.fixture
def suite(tmp_path: Path) -> Suite:
    path = tmp_path / "t.yaml"
    path.write_text(SUITE)
    return load_suite(path)


def build(axes: Mapping[str, Sequence[Any]], failing: Callable[[dict[str, Any]], float], *, n: int = 20,
          case: str = "json", checks: Sequence[str] = FSM, commits: Sequence[str] = ("c1",),
          effective: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
          cells: Sequence[dict[str, Any]] | None = None, starts: int = 2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A samples and a cells table: every combination of `axes` (or the given `cells`) on each
    commit, n samples each over `starts` server starts (sample r on start r mod starts); the first
    round(rate * n) of a cell fail `checks`, so the starts of a cell agree."""
    combos = list(cells) if cells is not None else \
        [dict(zip(axes, vs, strict=True)) for vs in itertools.product(*axes.values())]
    srows, crows = [], []
    for commit in commits:
        for combo in combos:
            values = {"commit": commit, **combo}
            cid = "-".join(f"{k}={v}" for k, v in values.items())
            eff = effective(values) if effective else {}
            k = round(failing(values) * n)
            for r in range(n):
                srows.append({"run_id": "t", "group_id": f"{cid}#{r % starts}", "cell_id": cid, "commit": commit,
                              "commit_sha": f"{commit:0<40}"[:40], "case_id": case, "repeat": r,
                              "request_id": f"{cid}-{r}", "passed": r >= k, "failed_checks": list(checks) if r < k else [],
                              "axes": [(a, json.dumps(v)) for a, v in values.items()]})
            crows.append({"cell_id": cid, "commit": commit, "status": "ok", "n_samples": n, "n_failed": k,
                          "effective_differs": eff.get("differs", []), **eff.get("columns", {})})
    return analysis.with_axes(pd.DataFrame(srows)), pd.DataFrame(crows)


def only(e: explain.Explanation) -> explain.ModeExplanation:
    assert len(e.modes) == 1, [m.mode for m in e.modes]
    return e.modes[0]


def holm_of(p_values: Sequence[float], i: int) -> float:
    """Holm's adjusted p-value of entry i, the long way round."""
    order = sorted(range(len(p_values)), key=lambda j: p_values[j])
    m, best = len(p_values), 0.0
    for rank, j in enumerate(order):
        best = max(best, min(1.0, (m - rank) * p_values[j]))
        if j == i:
            return best
    raise AssertionError


def test_two_terms_neither_alone(suite: Suite) -> None:
    samples, cells = build({"spec_method": ["none", "ngram", "mtp"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"]},
                           lambda c: 0.5 if (c["spec_method"], c["env.VLLM_USE_V2_MODEL_RUNNER"]) == ("mtp", "1") else 0)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.EXPLAINED
    assert m.conjunction == "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1"
    assert (m.inside, m.outside) == (explain.Count(10, 20), explain.Count(0, 100))
    # Without a term: the others hold, it does not (V2 without mtp: none and ngram on V2).
    assert {str(w.term): str(w.count) for w in m.without} == {"spec_method=mtp": "0/40",
                                                            "VLLM_USE_V2_MODEL_RUNNER=1": "0/20"}
    # 3 + 2 single terms, 3 × 2 pairs; Fisher one-sided on per-start effective counts, Holm over all 11.
    assert m.tried == 11
    # Each cell's two starts agree: the dispersion learned is small, and the evidence close to
    # what the samples would give if they were independent.
    assert m.rho < 0.05 and m.worth > 0.5 * 120
    p = fisher_exact([[10, 10], [0, 100]], alternative="greater")[1]
    assert p <= m.p_value < 1e-5
    assert m.p_adjusted == pytest.approx(11 * m.p_value)  # the smallest p of the 11: Holm multiplies by 11
    text = explain_text.render(explain.explain(samples, cells, suite=suite))
    assert "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 → 10/20 failing vs 0/100 elsewhere" in text
    assert "neither alone fails" in text


def test_three_terms(suite: Suite) -> None:
    axes = {"spec_method": ["ngram", "mtp"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"],
            "attention_backend": ["FLASH_ATTN", "FLASHINFER"]}
    samples, cells = build(axes, lambda c: 1.0 if (c["spec_method"], c["env.VLLM_USE_V2_MODEL_RUNNER"],
                                                   c["attention_backend"]) == ("mtp", "1", "FLASHINFER") else 0,
                           case="think", checks=BUDGET)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.EXPLAINED
    assert m.conjunction == "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 ∧ attention_backend=FLASHINFER"
    assert (str(m.inside), str(m.outside)) == ("20/20", "0/140")
    assert [str(w.count) for w in m.without] == ["0/20", "0/20", "0/20"]
    assert "no part alone fails" in "\n".join(explain_text.describe(m))
    # With at most 2 terms there is nothing that separates it.
    assert only(explain.explain(samples, cells, suite=suite, max_terms=2)).verdict is Verdict.UNEXPLAINED


def _fallback(values: dict[str, Any]) -> dict[str, Any]:
    """Model Runner V2 lacks the ngram drafter: vLLM silently runs V1."""
    if values["spec_method"] == "ngram" and values["env.VLLM_USE_V2_MODEL_RUNNER"] == "1":
        return {"differs": ["model_runner"], "columns": {"effective_model_runner": "V1"}}
    return {"columns": {"effective_model_runner": "V2" if values["env.VLLM_USE_V2_MODEL_RUNNER"] == "1" else "V1"}}


def test_an_effective_value_explains_what_the_requested_one_cannot(suite: Suite) -> None:
    axes = {"spec_method": ["none", "ngram"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"]}

    def runs_v2(c: dict[str, Any]) -> float:
        return 1.0 if _fallback(c)["columns"]["effective_model_runner"] == "V2" else 0.0
    samples, cells = build(axes, runs_v2, effective=_fallback)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.EXPLAINED
    assert [(t.axis, t.value, t.effective) for t in m.terms] == [("env.VLLM_USE_V2_MODEL_RUNNER", "1", True)]
    assert m.conjunction == "VLLM_USE_V2_MODEL_RUNNER=1 (effective)"
    assert (str(m.inside), str(m.outside)) == ("20/20", "0/60")
    assert len(m.effective_notes) == 1
    assert "asked 1, ran 0" in m.effective_notes[0]
    assert "on requested values VLLM_USE_V2_MODEL_RUNNER=1 holds 20/40 failing" in m.effective_notes[0]
    # Read on requested values only (no cells table), the same failures need two terms.
    assert only(explain.explain(samples, None, suite=suite)).conjunction == \
        "spec_method=none ∧ VLLM_USE_V2_MODEL_RUNNER=1"


def test_an_effective_setting_no_axis_asks_for(suite: Suite) -> None:
    """Async scheduling left to its default, silently off for ngram: the failures follow it."""
    def eff(c: dict[str, Any]) -> dict[str, Any]:
        return {"columns": {"effective_async_scheduling": c["spec_method"] != "ngram"}}
    samples, cells = build({"spec_method": ["none", "ngram", "mtp"]},
                           lambda c: 0.5 if c["spec_method"] != "ngram" else 0, effective=eff)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.conjunction == "async_scheduling (effective)=true"
    assert (str(m.inside), str(m.outside)) == ("20/40", "0/20")
    assert "async_scheduling is no axis of this matrix" in m.effective_notes[0]


def test_a_confounded_design_is_not_identifiable(suite: Suite) -> None:
    # MTP only ever ran on V2 and the others only on V1: the two axes never vary apart.
    design = [{"spec_method": "mtp", "env.VLLM_USE_V2_MODEL_RUNNER": "1"},
              {"spec_method": "none", "env.VLLM_USE_V2_MODEL_RUNNER": "0"},
              {"spec_method": "ngram", "env.VLLM_USE_V2_MODEL_RUNNER": "0"}]
    samples, cells = build({}, lambda c: 0.5 if c["spec_method"] == "mtp" else 0, cells=design)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.NOT_IDENTIFIABLE
    assert {m.conjunction, *(" ∧ ".join(map(str, a)) for a in m.alternatives)} == \
        {"spec_method=mtp", "VLLM_USE_V2_MODEL_RUNNER=1"}
    assert "not identifiable in this matrix" in "\n".join(explain_text.describe(m))


def test_a_mode_no_conjunction_explains(suite: Suite) -> None:
    # Fails with mtp on V1 and without spec decoding on V2: no conjunction of axis values holds both.
    # Half the samples of each start fail: starts of one cell that agree on a rate show the dispersion
    # is low (all failing, they would leave it to the prior).
    axes = {"spec_method": ["none", "mtp"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"]}
    samples, cells = build(axes, lambda c: 0.5 if (c["spec_method"] == "mtp") != (c["env.VLLM_USE_V2_MODEL_RUNNER"] == "1")
                           else 0, n=40)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.UNEXPLAINED and m.terms == ()
    assert m.tried == 8 and m.failures == 40
    assert "no conjunction of at most 3 settings separates it" in "\n".join(explain_text.describe(m))


def test_a_mode_of_some_commits_in_every_cell(suite: Suite) -> None:
    samples, cells = build({"spec_method": ["none", "mtp"]}, lambda c: 0.5 if c["commit"] == "c2" else 0,
                           commits=("c1", "c2", "c3"))
    m = only(explain.explain(samples, cells, suite=suite, commit_order=["c1", "c2", "c3"]))
    assert m.verdict is Verdict.EVERYWHERE and m.commits == ("c2",) and str(m.inside) == "20/40"
    assert [(c, str(n)) for c, n in m.clean_commits] == [("c1", "0/40"), ("c3", "0/40")]


def test_all_failures_in_one_corner(suite: Suite) -> None:
    """Few samples per cell: no single clean cell is credible, but the rest of "V2 alone" together is."""
    axes = {"spec_method": ["none", "ngram", "mtp"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"]}
    samples, cells = build(axes, lambda c: 1.0 if (c["spec_method"], c["env.VLLM_USE_V2_MODEL_RUNNER"]) == ("mtp", "1")
                           else 0, n=6)
    m = only(explain.explain(samples, cells, suite=suite))
    assert (m.verdict, m.conjunction) == (Verdict.EXPLAINED, "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1")
    assert (str(m.inside), str(m.outside)) == ("6/6", "0/30")


def test_too_few_samples_is_said(suite: Suite) -> None:
    samples, cells = build({"spec_method": ["none", "ngram", "mtp"]}, lambda c: 1.0 if c["spec_method"] == "mtp" else 0,
                           n=1)
    m = only(explain.explain(samples, cells, suite=suite))
    assert m.verdict is Verdict.TOO_FEW and m.conjunction == "spec_method=mtp"
    assert m.p_adjusted is not None and m.p_adjusted >= 0.01


def test_two_bugs_are_two_modes_each_with_its_conjunction(suite: Suite) -> None:
    axes = {"spec_method": ["none", "mtp"], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"]}
    json_s, cells = build(axes, lambda c: 0.5 if c["spec_method"] == "mtp" else 0)
    think, _ = build(axes, lambda c: 1.0 if c["env.VLLM_USE_V2_MODEL_RUNNER"] == "1" else 0, case="think",
                     checks=BUDGET)
    e = explain.explain(pd.concat([json_s, think], ignore_index=True), cells, suite=suite)
    assert {m.mode: m.conjunction for m in e.modes} == {
        "finish_reason + json_schema + log_absent(Failed to advance FSM) + no_whitespace_tail": "spec_method=mtp",
        "content_nonempty + finish_reason + reasoning_tokens_at_most": "VLLM_USE_V2_MODEL_RUNNER=1"}
    # Each mode is counted over the cases that can show it.
    assert sorted((str(m.inside), str(m.outside)) for m in e.modes) == [("20/40", "0/40"), ("40/40", "0/40")]


def test_holm_matches_the_definition() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.2])
    assert explain.holm(p).tolist() == pytest.approx([holm_of(p.tolist(), i) for i in range(5)])


# ---- through the real sweep ------------------------------------------------------------------------

SIM_SUITE = """
name: sim
cases:
  - id: json
    repeat: 4
    body:
      max_tokens: 256
      messages: [{role: user, content: "List three fruits as JSON."}]
      response_format:
        type: json_schema
        json_schema: {name: fruits, schema: {type: object, properties: {fruits: {type: array, items: {type: string}}},
                                             required: [fruits]}}
    checks: [http_ok, {finish_reason: {expected: stop}}, json_schema, no_whitespace_tail,
             {log_absent: {pattern: "Failed to advance FSM"}}]
  - id: think
    repeat: 12
    body:
      max_tokens: 32
      thinking_token_budget: 1
      chat_template_kwargs: {enable_thinking: true}
      messages: [{role: user, content: "What is 1+1?"}]
    checks: [http_ok, {finish_reason: {expected: stop}}, {reasoning_tokens_at_most: {max: 1}}, content_nonempty]
"""
PLANTED = [
    # 3 terms: MTP on Model Runner V2 with FlashInfer ignores the thinking budget.
    {"id": "budget", "effect": "thinking_budget_ignored", "rate": 1.0,
     "when": {"spec_method": ["mtp"], "model_runner": ["V2"], "attention_backend": ["FLASHINFER"],
              "thinking_budget": True}},
    # Only on the effective value: the V2 runner (ngram asks for it and silently runs V1).
    {"id": "v2-fsm", "effect": "fsm_whitespace", "rate": 1.0, "when": {"model_runner": ["V2"], "json_schema": True}},
]


@pytest.mark.full  # a simulated sweep of its own: about 12 s
def test_planted_conjunctions_in_a_simulated_history(tmp_path: Path) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("v1", {}), ("v2", {"bugs": PLANTED})])
    (tmp_path / "s.yaml").write_text(SIM_SUITE)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"""
name: planted
model: Qwen/Qwen3-8B
suite: s.yaml
install: {{kind: sim, repo: {repo}}}
serve: {{--reasoning-parser: qwen3}}
concurrency: 4
timeouts: {{startup_s: 20, request_s: 10}}
axes:
  commit: [v1, v2]
  spec_method: [none, ngram, mtp]
  num_speculative_tokens: [2]
  env.VLLM_USE_V2_MODEL_RUNNER: ["0", "1"]
  attention_backend: [FLASH_ATTN, FLASHINFER]
""")
    run = run_matrix(matrix, runs_dir=tmp_path / "runs", run_id="p", executor=choose("local"),
                     cache_dir=tmp_path / "cache").run
    e = report.explain_run(run)
    by_mode = {m.mode: m for m in e.modes}
    assert set(by_mode) == {"content_nonempty + finish_reason + reasoning_tokens_at_most",
                            "finish_reason + json_schema + log_absent(Failed to advance FSM) + no_whitespace_tail"}
    budget = by_mode["content_nonempty + finish_reason + reasoning_tokens_at_most"]
    assert budget.verdict is Verdict.EXPLAINED and budget.commits == ("v2",)
    # The ngram cells asking for V2 ran V1: the runner term is read on what ran.
    assert budget.conjunction == \
        "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 (effective) ∧ attention_backend=FLASHINFER"
    assert (str(budget.inside), str(budget.outside)) == ("12/12", "0/132")
    assert [(c, str(n)) for c, n in budget.clean_commits] == [("v1", "0/12")]
    fsm = by_mode["finish_reason + json_schema + log_absent(Failed to advance FSM) + no_whitespace_tail"]
    assert fsm.verdict is Verdict.EXPLAINED
    assert fsm.conjunction == "VLLM_USE_V2_MODEL_RUNNER=1 (effective)"
    assert (str(fsm.inside), str(fsm.outside)) == ("16/16", "0/32")
    assert "asked 1, ran 0" in fsm.effective_notes[0]


def test_the_demo_run(demo_run: RunDir) -> None:
    """The demo's planted bugs (vllmsim/repo.py): the FSM bug on MTP at v0.28.0~3 only (fixed by
    v0.28.0), a silent whitespace bug on MTP from v0.28.0, the thinking budget on MTP + V2 at main."""
    e = report.explain_run(demo_run)
    got = {m.mode: (m.verdict, m.conjunction, m.commits) for m in e.modes}
    assert got == {
        "content_nonempty + finish_reason + reasoning_tokens_at_most":
            (Verdict.EXPLAINED, "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 (effective)", ("main",)),
        "finish_reason + log_absent(Failed to advance FSM) + no_whitespace_tail":
            (Verdict.EXPLAINED, "spec_method=mtp", ("v0.28.0~3",)),
        "finish_reason + no_whitespace_tail": (Verdict.EXPLAINED, "spec_method=mtp", ("v0.28.0", "main")),
    }
    budget = next(m for m in e.modes if m.commits == ("main",))
    # Two temperatures per server (the demo's request axis): twice the samples of each setting.
    assert (str(budget.inside), str(budget.outside)) == ("40/40", "0/200")
    assert all(str(w.count) == "0/40" for w in budget.without)
    assert e.labels_from_suite


def test_the_notebook_explains_the_demo_run(demo_run: RunDir) -> None:
    import nbformat
    from nbclient import NotebookClient

    path = Path(__file__).parent.parent / "notebooks" / "failure-rates.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute(
        env={**os.environ, "SWEEP_RUN": str(demo_run.root)})
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 (effective) → 40/40 failing vs 0/200 elsewhere" in printed


def test_explain_json_and_unwrapped_text_from_the_cli(demo_run: RunDir) -> None:
    """`--explain --json` prints only JSON, with the schema runs/README.md documents; piped text keeps
    each line whole, however long."""
    from typer.testing import CliRunner

    from sweeper.cli import app

    runs = str(demo_run.root.parent)
    result = CliRunner().invoke(app, ["report", "demo", "--runs-dir", runs, "--explain", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 3 and doc["labels_from_suite"] is True
    budget = next(m for m in doc["modes"] if m["scope"]["commits"] == ["main"])
    assert budget["verdict"] == "explained"
    assert [(t["name"], t["value"], t["effective"]) for t in budget["conjunction"]] == \
        [("spec_method", "mtp", False), ("VLLM_USE_V2_MODEL_RUNNER", "1", True)]
    assert (budget["inside"]["failed"], budget["inside"]["n"], budget["outside"]["n"]) == (40, 40, 200)
    assert budget["test"]["p_adjusted"] < doc["alpha"] and budget["aliases"] == []
    readme = (Path(__file__).parent.parent / "runs" / "README.md").read_text()
    for key in ["schema_version", *budget, *budget["inside"], *budget["test"], *budget["dispersion"]]:
        assert f"`{key}`" in readme or f"`{key}[]`" in readme, key
    # Without --explain, --json is the run's cells (tests/test_report_output.py), not an explanation.
    cells = CliRunner().invoke(app, ["report", "demo", "--runs-dir", runs, "--json"])
    doc = json.loads(cells.stdout)
    assert cells.exit_code == 0 and "modes" not in doc and len(doc["cells"]) == 48
    text = CliRunner().invoke(app, ["report", "demo", "--runs-dir", runs, "--explain"]).stdout
    line = next(x for x in text.splitlines() if "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 (effective) →" in x)
    assert line.startswith("  ") and line.endswith(")") and len(line) > 150
    # The demo's failures are all-or-nothing per cell: its dispersion is the prior's, and said in one line.
    said = [x for x in text.splitlines() if "dispersion:" in x]
    assert said and all(x.startswith("  dispersion:") and x.endswith("add power") and len(x) > 200 for x in said)
