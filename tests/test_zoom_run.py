"""A covering run that zooms: real simulator servers in this process (the local executor), a history
made here with one planted two-setting bug, real Parquet. The zoom's phases write into the same run
folder, the manifest records them, the explanation over every phase names the planted conjunction,
and `--no-zoom` stops after the design."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_sim_repo, run_cli, starts_in_logs

from sweeper.drivers.sweep import ZoomOptions, run_matrix
from sweeper.execute.choice import choose as executor
from sweeper.install.matrix_loader import load_matrix
from sweeper.judge.explain import Verdict
from sweeper.plan.design import choose
from sweeper.plan.zoom import Status
from sweeper.reports import tables as report
from sweeper.spec.matrix import DesignSpec
from sweeper.spec.matrix_slice import Slice
from sweeper.store import frames as analysis
from sweeper.store.manifest import PhaseRecord, SweepManifest, from_json, phases_of
from sweeper.store.run_folder import RunDir

BUG = {"bugs": [{"id": "fsm", "effect": "fsm_whitespace", "rate": 1.0,
                 "when": {"attention_backend": "TRITON_ATTN", "dtype": "float16"}}]}


def matrix_file(tmp_path: Path, suite: Path, repo: Path) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(f"""name: z
model: Qwen/Qwen3-8B
suite: {suite}
install: {{kind: sim, repo: {repo}}}
concurrency: 4
timeouts: {{startup_s: 30, request_s: 10}}
design: covering:2
axes:
  commit: [main]
  attention_backend: [FLASH_ATTN, TRITON_ATTN]
  serve.--dtype: [bfloat16, float16]
  serve.--enforce-eager: [true, false]
  env.VLLM_ENFORCE_STRICT_TOOL_CALLING: ["0", "1"]
""")
    return path


def test_a_covering_run_zooms_until_the_planted_conjunction_is_identified(tmp_path: Path, tiny_suite: Path) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("main", BUG)])
    path = matrix_file(tmp_path, tiny_suite, repo)
    matrix = load_matrix(path)
    design = choose(matrix, DesignSpec(kind="covering", strength=2))
    seen: list[PhaseRecord] = []
    outcome = run_matrix(path, runs_dir=tmp_path / "runs", run_id="z", executor=executor("local"),
                         cache_dir=tmp_path / "cache", zoom_options=ZoomOptions(on_phase=seen.append))
    manifest = outcome.run.read_manifest()
    assert isinstance(manifest, SweepManifest)
    phases = manifest.phases
    assert len(phases) >= 2 and phases[0] == PhaseRecord(1, "design", tuple(g.group_id for g in design.groups),
                                                         len(design.cells), design.describe())
    assert [p.kind for p in phases[1:]] == ["zoom"] * (len(phases) - 1) and list(phases[1:]) == seen
    # Each phase ran its own servers, all of them in this one folder, and no server twice.
    ran = [g for p in phases for g in p.groups]
    assert len(ran) == len(set(ran)) and sorted(ran) == sorted(outcome.run.done_groups())
    assert starts_in_logs(outcome.run.root) == len(ran) < len(matrix.groups())
    assert manifest.zoom is not None and manifest.zoom.startswith("stopped: every failure mode settled")
    assert outcome.zoom is not None and [m.status for m in outcome.zoom.modes] == [Status.IDENTIFIED]
    # The explanation reads every phase.
    explained = report.explain_run(outcome.run)
    (mode,) = explained.modes
    assert mode.verdict is Verdict.EXPLAINED
    assert {(t.axis, t.value) for t in mode.terms} == {("attention_backend", "TRITON_ATTN"),
                                                       ("serve.--dtype", "float16")}
    assert mode.starts == len(ran)
    # Read back as JSON and as a manifest of the version before phases: one phase, the design.
    raw = json.loads(outcome.run.manifest_path.read_text())
    assert raw["manifest_version"] == 5 and raw["phases"][0]["kind"] == "design"
    old = {k: v for k, v in raw.items() if k not in ("phases", "zoom")} | {"manifest_version": 4}
    before = from_json(old)
    assert isinstance(before, SweepManifest) and before.phases == ()
    (only,) = phases_of(before, outcome.run.done_groups())
    assert (only.phase, only.kind, len(only.groups)) == (1, "design", len(ran))


@pytest.mark.full  # a second run of real servers: the one above covers the fast tier
@pytest.mark.parametrize("flag", ["--no-zoom"])
def test_no_zoom_stops_after_the_design(flag: str, tmp_path: Path, tiny_suite: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("main", BUG)])
    path = matrix_file(tmp_path, tiny_suite, repo)
    design = choose(load_matrix(path), DesignSpec(kind="covering", strength=2))
    runs = tmp_path / "runs"
    code, out, err = run_cli(["matrix", str(path), "--dry-run", flag, "--runs-dir", str(runs)], capsys)
    assert code == 0 and "then zoom: off (--no-zoom)" in out, err
    code, out, err = run_cli(["matrix", str(path), flag, "--executor", "local", "--runs-dir", str(runs),
                              "--run-id", "n", "--cache-dir", str(tmp_path / "cache")], capsys)
    assert code == 0, err
    run = RunDir(runs / "n")
    manifest = run.read_manifest()
    assert isinstance(manifest, SweepManifest) and len(manifest.phases) == 1 and manifest.zoom is None
    assert sorted(run.done_groups()) == sorted(g.group_id for g in design.groups) == sorted(manifest.phases[0].groups)
    assert starts_in_logs(run.root) == len(design.groups)
    assert set(analysis.load_cells(run).cell_id) == {c.cell_id for c in design.cells}
    assert "zoom stopped" not in out


@pytest.mark.full  # three runs of real servers
def test_servers_run_elsewhere_are_evidence_the_zoom_reads(tmp_path: Path, tiny_suite: Path) -> None:
    """As a triage's sweep at a commit does with its bisect's servers there: the run's cut leaves
    servers out and hands the zoom their samples. On the cut, the attention backend and the dtype vary
    together, so a bug on the backend cannot be told from one on the dtype by any server the run
    may start; with the samples of the servers left out (the backend without the dtype) it is
    identified, and without them the zoom ends with no informative server left."""
    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("main", {"bugs": [{"id": "fsm", "effect": "fsm_whitespace", "rate": 1.0,
                                             "when": {"attention_backend": "TRITON_ATTN"}}]})])
    path = matrix_file(tmp_path, tiny_suite, repo)  # its design is given below
    runs = tmp_path / "runs"
    first = run_matrix(path, runs_dir=runs, run_id="first", executor=executor("local"), cache_dir=tmp_path / "cache",
                       design_spec=DesignSpec(kind="full")).run
    cells, samples = analysis.load_cells(first), analysis.load_samples(first)
    axes = {str(c): {k: json.loads(v) for k, v in a} for c, a in zip(cells["cell_id"], cells["axes"], strict=True)}
    elsewhere = [c for c, a in axes.items() if (a["attention_backend"], a["serve.--dtype"]) == ("TRITON_ATTN", "bfloat16")]
    together = {c for c, a in axes.items() if (a["attention_backend"], a["serve.--dtype"]) in
                {("FLASH_ATTN", "bfloat16"), ("TRITON_ATTN", "float16")}}
    assert len(elsewhere) == 4 and len(together) == 8
    evidence = (samples[samples["cell_id"].isin(elsewhere)].reset_index(drop=True),
                cells[cells["cell_id"].isin(elsewhere)].reset_index(drop=True))
    cut = Slice(settings=frozenset(str(k) for c, k in zip(cells["cell_id"], cells["settings_key"], strict=True)
                                   if c in together))
    summaries = {}
    for name, given in (("with", evidence), ("without", None)):
        out = run_matrix(path, runs_dir=runs, run_id=name, executor=executor("local"), cache_dir=tmp_path / "cache",
                         design_spec=DesignSpec(kind="covering", strength=1), cut=cut,
                         zoom_options=ZoomOptions(evidence=given))
        assert starts_in_logs(out.run.root) <= 8  # never a server out of the cut
        summaries[name] = out.zoom_summary or ""
    assert "identified (attention_backend=TRITON_ATTN)" in summaries["with"], summaries
    assert "no informative servers left" in summaries["without"], summaries


def test_a_budget_leaves_the_zoom_what_the_design_did_not_spend(tmp_path: Path, tiny_suite: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--budget` with a covering design: the design's servers are fitted first, and the zoom after it
    runs the most informative servers the rest still covers; the report says so."""
    from sweeper.drivers.sweep import make_plan

    repo = tmp_path / "vllm"
    make_sim_repo(repo, [("main", BUG)])
    path = matrix_file(tmp_path, tiny_suite, repo)
    plan = make_plan(path, tmp_path / "runs")
    design_s = plan.estimate().gpu_seconds
    one = plan.estimate(plan.groups[:2]).gpu_seconds - plan.estimate(plan.groups[:1]).gpu_seconds  # a server, no install
    budget_s = design_s + 1.5 * one  # the design and one zoom server
    outcome = run_matrix(path, runs_dir=tmp_path / "runs", run_id="b", executor=executor("local"),
                         cache_dir=tmp_path / "cache", budget_hours=budget_s / 3600)
    manifest = outcome.run.read_manifest()
    assert isinstance(manifest, SweepManifest) and manifest.budget is not None
    assert manifest.budget.servers == len(plan.groups)  # the whole design fits
    zooms = [p for p in manifest.phases if p.kind == "zoom"]
    assert [len(p.groups) for p in zooms] == [1]
    assert manifest.zoom is not None and manifest.zoom.startswith("stopped: the budget is spent")
    by_id = {g.group_id: g for g in plan.matrix.groups()}
    ran = tuple(by_id[g] for g in outcome.run.done_groups())
    assert plan.estimate(ran).gpu_seconds <= budget_s < plan.estimate(ran).gpu_seconds + one
    code, out, err = run_cli(["report", "b", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    assert "then zoom phases within what was left: 1 servers" in out
