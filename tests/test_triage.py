"""`sweep triage`: a matrix and a commit range in, one bug report per failure mode out.

The demo history and a second history planted here (other conjunctions, other culprits, a mode
brought and fixed inside the range) are triaged end to end through the in-process executor; each
report's `vllm serve` and `curl` lines are run against a live simulator at the commit they name and
reproduce the failure. The server starts are counted from the servers' own logs and compared with a
full-product sweep plus `sweep bisect` of the same cells. A triage killed mid-bisect (a subprocess,
Ctrl-C) is resumed to the same reports without a probe run twice.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from conftest import make_sim_repo, run_cli, starts_in_logs

from sweeper.drivers.bisect import BisectOptions, BisectScope, Subject, bisect_cells, search_choices
from sweeper.drivers.sweep import run_matrix
from sweeper.drivers.triage import TriageOptions, TriageScope, cheapest_cells, run_triage
from sweeper.errors import StoreError
from sweeper.execute.choice import choose
from sweeper.execute.server import ServerProcess, free_port
from sweeper.install.matrix_loader import load_matrix
from sweeper.judge.explain import Count, ModeExplanation, Term, Verdict
from sweeper.spec.matrix_slice import Slice, at_commit
from sweeper.spec.matrix_slice import apply as apply_slice
from sweeper.spec.suite import load_suites
from sweeper.spec.yamlfile import load
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir
from sweeper.store.triage_record import Mode, Phase, TriageRecord, from_json, to_json

ROOT = Path(__file__).resolve().parent.parent

# ---- the second history: planted here ---------------------------------------------------------

# Whitespace tails without speculation, c1 .. c2 (fixed at c3): only the bisect of the budget's cell sees it.
TAILS = {"id": "tails", "effect": "silent_whitespace", "when": {"spec_method": ["none"]}, "rate": 0.5}
BUDGET = {"id": "budget", "effect": "thinking_budget_ignored", "when": {"spec_method": ["none"], "model_runner": ["V2"]},
          "rate": 1.0}
FSM = {"id": "fsm", "effect": "fsm_whitespace", "when": {"spec_method": ["mtp"], "strict_tool_calling": [True]},
       "rate": 0.5}
N, TAILS_IN, TAILS_OUT, BUDGET_IN, FSM_IN = 7, 1, 3, 4, 5

INVOICE_SCHEMA = {"type": "json_schema", "json_schema": {"name": "invoice", "schema": {
    "type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}}}
SUITE = {
    "name": "small",
    "defaults": {"repeat": 4, "body": {"max_tokens": 1024, "temperature": 0},
                 "checks": ["http_ok", {"finish_reason": {"expected": "stop"}}, "json_schema", "no_whitespace_tail",
                            {"log_absent": {"pattern": "Failed to advance FSM"}}]},
    # Distinct bodies: the simulator's bugs bite a body by how often a server saw it, so some body
    # fails on its first send to a fresh server (what a report's one curl does).
    "cases": [
        *({"id": f"invoice-{i}", "body": {"messages": [{"role": "user", "content": f"Extract invoice {i} as JSON."}],
                                           "response_format": INVOICE_SCHEMA}} for i in range(4)),
        {"id": "budget", "repeat": 8,
         "checks": ["http_ok", {"finish_reason": {"expected": "stop"}}, {"reasoning_tokens_at_most": {"max": 4}},
                    "content_nonempty"],
         "body": {"thinking_token_budget": 4, "chat_template_kwargs": {"enable_thinking": True},
                  "messages": [{"role": "user", "content": "What is 1+1?"}]}}],
}

MATRIX = """
name: planted
model: Qwen/Qwen3-8B
suite: small.yaml
install: {{kind: sim, repo: vllm}}
serve: {{--enable-auto-tool-choice: true, --tool-call-parser: qwen3_coder, --reasoning-parser: qwen3}}
env: {{VLLM_ENFORCE_STRICT_TOOL_CALLING: "1"}}
concurrency: 8
timeouts: {{startup_s: 30, request_s: 20}}
axes:
  commit: [{commits}]
  spec_method: [none, ngram, mtp]
  num_speculative_tokens: [2]
  env.VLLM_USE_V2_MODEL_RUNNER: ["0", "1"]
"""


def planted_history(root: Path) -> dict[str, str]:
    commits = []
    for i in range(N):
        bugs = ([TAILS] if TAILS_IN <= i < TAILS_OUT else []) + ([BUDGET] if i >= BUDGET_IN else []) \
            + ([FSM] if i >= FSM_IN else [])
        commits.append(("v0.27.0" if i == 0 else f"c{i}", {"bugs": bugs}))
    shas = make_sim_repo(root / "vllm", commits)
    (root / "small.yaml").write_text(yaml.safe_dump(SUITE))
    (root / "m.yaml").write_text(MATRIX.format(commits="main"))
    (root / "full.yaml").write_text(MATRIX.format(commits="v0.27.0, main"))
    return shas


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("triage-planted")
    return root, planted_history(root)


@pytest.fixture(scope="module")
def planted_triage(planted: tuple[Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    """The planted history triaged once, uninterrupted, in-process."""
    root, _ = planted
    tmp = tmp_path_factory.mktemp("triage-planted-runs")
    return run_triage(TriageScope(root / "m.yaml", "v0.27", "main"),
                      TriageOptions(runs_dir=tmp / "runs", run_id="t", cache_dir=tmp / "cache"),
                      executor=choose("local")).run


# ---- reading what a triage wrote --------------------------------------------------------------

def record_of(run: RunDir) -> TriageRecord:
    return from_json(json.loads((run.root / "triage.json").read_text()), "triage.json")


def blocks(markdown: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)\n```", markdown, re.DOTALL)


def by_mode(record: TriageRecord, part: str) -> Mode:
    found = [m for m in record.modes if part in m.mode]
    assert len(found) == 1, [m.mode for m in record.modes]
    return found[0]


def reproduce(md: str, repo: Path, tmp_path: Path, sends: int = 1) -> dict[str, Any]:
    """Run the report's `vllm serve` line (as the simulator, on a checkout of the commit its
    environment block names) and its `curl` line; the reply."""
    sha = re.search(r"vLLM commit\s+: ([0-9a-f]{40})", md)
    assert sha, md[:600]
    serve, curl = blocks(md, "bash")[:2]
    words = shlex.split(serve.replace("\\\n", " "))
    env = dict(w.split("=", 1) for w in words[:words.index("vllm")])
    argv = words[words.index("vllm"):]
    assert argv[:2] == ["vllm", "serve"] and curl.startswith("curl -sS http://127.0.0.1:8000/v1/chat/completions ")
    tree = tmp_path / f"tree-{sha.group(1)[:10]}"
    tree.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", sha.group(1)], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    port = free_port()
    argv = [sys.executable, "-m", "vllmsim", "serve", *argv[2:]]
    argv[argv.index("--port") + 1] = str(port)
    # A rate-based bug bites a body by how often the server saw it, and a sweep's concurrent requests
    # arrive in any order: the report's request is sent as often as its case repeats (or as the
    # report says), and one reply must fail.
    times = re.search(r"send it (\d+) times to a fresh server", md)
    replies = []
    with ServerProcess(argv, {**env, "SWEEP_SIM_TREE": str(tree), "PATH": "/usr/bin:/bin"}, port=port,
                       log_path=tmp_path / f"server-{port}.log", startup_timeout_s=60):
        for _ in range(max(int(times.group(1)) if times else 1, sends)):
            out = subprocess.run(["bash", "-c", curl.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
                                 capture_output=True, text=True, timeout=60, check=True).stdout
            replies.append(json.loads(out))
    failing = [r for r in replies if r["choices"][0]["finish_reason"] == "length"]
    reply: dict[str, Any] = (failing or replies)[0]
    reply["_log"] = (tmp_path / f"server-{port}.log").read_text()
    return reply


# ---- fast: the parts ---------------------------------------------------------------------------

def test_a_slice_keeps_the_matrix_file_and_its_paths(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(SUITE))
    (tmp_path / "m.yaml").write_text(MATRIX.format(commits="v0.27.0, main") + """
exclude:
  - {commit: v0.27.0, spec_method: ngram}
  - {spec_method: mtp, env.VLLM_USE_V2_MODEL_RUNNER: "0"}
design: covering:2
""")
    matrix = load_matrix(tmp_path / "m.yaml")
    data, pos = load(tmp_path / "m.yaml")
    at_good = apply_slice(matrix, data, pos, Slice(commit="c3"))
    assert {c.commit for c in at_good.cells} == {"c3"}
    # The rule naming another commit goes with it; the others hold; relative paths still resolve.
    assert len(at_good.cells) == 5 and at_good.suite_paths == matrix.suite_paths
    assert "design" not in at_commit(data, "c3") and at_commit(data, "c3")["exclude"] == [data["exclude"][1]]
    keep = frozenset(c.settings_key for c in at_good.cells if c.spec_method == "none")
    narrowed = apply_slice(matrix, data, pos, Slice(commit="c3", settings=keep))
    assert {c.spec_method for c in narrowed.cells} == {"none"} and len(narrowed.cells) == 2


def test_one_server_is_bisected_for_every_mode_it_holds_whatever_starts_quickest() -> None:
    """The demo at bad: the tails fail on MTP with either runner, the budget on MTP + V2 only. One
    search on the MTP V2 server serves both, though the MTP V1 server started quicker."""
    def cell(cid: str, spec: str, v2: str, start_s: float) -> dict[str, Any]:
        return {"cell_id": cid, "server_key": f"{spec}-{v2}", "startup_s": start_s,
                "axes": {"spec_method": json.dumps(spec), "env.VLLM_USE_V2_MODEL_RUNNER": json.dumps(v2)}}

    def mode(name: str, terms: tuple[Term, ...], failing: list[str]) -> ModeExplanation:
        return ModeExplanation(name, Verdict.EXPLAINED, terms, Count(8, 8), Count(0, 8), 1e-6, 1e-5, 10, ("c",),
                               ("main",), (), failing_cells=tuple((c, Count(4, 4)) for c in failing))
    cells = pd.DataFrame([cell("mtp-0", "mtp", "0", 0.8), cell("mtp-1", "mtp", "1", 1.1),
                          cell("none-1", "none", "1", 0.5)])
    tails = mode("tails", (Term("spec_method", "mtp"),), ["mtp-0", "mtp-1"])
    budget = mode("budget", (Term("spec_method", "mtp"), Term("env.VLLM_USE_V2_MODEL_RUNNER", "1", True, ("1",))),
                  ["mtp-1"])
    assert cheapest_cells([tails, budget], cells, 1.0) == {"tails": "mtp-1", "budget": "mtp-1"}
    # Alone, a mode goes to the quickest start that holds it.
    assert cheapest_cells([tails], cells, 1.0) == {"tails": "mtp-0"}


def test_the_record_reads_back_and_a_foreign_one_is_one_error() -> None:
    record = TriageRecord(run_id="t", matrix_path="m.yaml", good="v0.27", bad="main", good_sha="a" * 40,
                          bad_sha="b" * 40, design="covering:3", budget_h=1.5,
                          phases=[Phase("bad", "sweep", "bad", status="done", gpu_s=3.0, starts=6)],
                          modes=[Mode("m", conjunction="spec_method=mtp", fails_at_bad=True)])
    assert from_json(json.loads(json.dumps(to_json(record))), "x") == record
    with pytest.raises(StoreError, match=r"x: not a triage record \(schema 'sweep-bisect/2'"):
        from_json({"schema": "sweep-bisect/2"}, "x")


def test_dry_run_prints_each_phase_with_its_modelled_gpu_time(planted: tuple[Path, dict[str, str]], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = planted
    runs = tmp_path / "runs"
    code, out, err = run_cli(["triage", str(root / "m.yaml"), "--good", "v0.27", "--bad", "main",
                              "--runs-dir", str(runs), "--dry-run", "--budget", "2"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("bad: 6 cells on 6 servers at main (covering, strength 3") and "GPU-h" in lines[0]
    assert lines[1].startswith("good: the cells failing at main, at v0.27 — at most ")
    assert lines[2].startswith(f"bisect: {N - 1} commits; one cell per failure mode") and "GPU-h" in lines[2]
    assert lines[3].startswith("at-<commit>: ") and lines[-1].startswith("budget: 2 GPU-h")
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]  # no run written


def test_a_budget_too_small_for_the_first_phase_leaves_it_undone_and_says_so(
        planted: tuple[Path, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = planted
    code, out, err = run_cli(["triage", str(root / "m.yaml"), "--good", "v0.27", "--bad", "main", "--runs-dir",
                              str(tmp_path / "runs"), "--run-id", "t", "--budget", "0", "--executor", "local"], capsys)
    assert code == 0, err
    assert re.search(r"^bad\s+skipped\s+0 ", out, re.MULTILINE)
    assert "left undone by the budget: bad (the budget left 0 GPU-h; this phase is modelled at" in out
    assert not (tmp_path / "runs" / "t" / "phases" / "bad").exists()
    code, again, _ = run_cli(["report", "t", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 0 and again == out.replace(f"results: {tmp_path / 'runs' / 't'}\n", "")
    code, listed, _ = run_cli(["runs", "list", "--runs-dir", str(tmp_path / "runs"), "--json"], capsys)
    assert code == 0 and [(r["run_id"], r["kind"], r["status"]) for r in json.loads(listed)] == [("t", "triage", "done")]


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo = str(ROOT / "matrices" / "demo.yaml")
    code, _, err = run_cli(["triage", demo, "--good", "v0.27", "--bad", "main", "--design", "half"], capsys)
    assert code == 1 and err.startswith("error: ") and "--design" in err and err.count("\n") == 1
    code, _, err = run_cli(["triage", demo, "--good", "v0.27", "--bad", "main", "--budget", "-1"], capsys)
    assert code == 1 and "--budget" in err and err.count("\n") == 1
    code, _, err = run_cli(["triage", demo, "--good", "v0.27", "--bad", "main", "--expect-changes", "0"], capsys)
    assert code == 1 and err == "error: --expect-changes: expected a number of changes per range above 0, got 0\n"
    (tmp_path / "runs" / "other").mkdir(parents=True)
    code, _, err = run_cli(["triage", demo, "--good", "v0.27", "--bad", "main", "--runs-dir", str(tmp_path / "runs"),
                            "--resume", "other"], capsys)
    assert code == 1 and "not a triage run" in err and err.count("\n") == 1
    # --watch: metrics the bench measures, on a matrix with a bench; --min-effect a percentage.
    perf = str(ROOT / "matrices" / "demo-perf.yaml")
    for matrix, extra, words in ((perf, ["--watch", "mean_tpot_ms,tpot"], "--watch"),
                                 (demo, ["--watch", "mean_tpot_ms"], "bench: section"),
                                 (perf, ["--watch", "mean_tpot_ms", "--min-effect", "three"], "--min-effect")):
        code, out, err = run_cli(["triage", matrix, "--good", "v0.27", "--bad", "main", "--dry-run", *extra], capsys)
        assert code == 1 and out == "" and err.startswith("error: ") and words in err and err.count("\n") == 1, err


# ---- the demo ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_triage(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    tmp = tmp_path_factory.mktemp("triage-demo")
    outcome = run_triage(TriageScope(ROOT / "matrices" / "demo.yaml", "v0.27", "main"),
                         TriageOptions(runs_dir=tmp / "runs", run_id="t", cache_dir=tmp / "cache"),
                         executor=choose("local"))
    return outcome.run


@pytest.mark.full  # 30 server starts
@pytest.mark.timeout(1200)
def test_demo_triage_writes_three_reports_that_reproduce(demo_triage: RunDir, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    record = record_of(demo_triage)
    assert record.final and len(record.modes) == 3
    budget = by_mode(record, "reasoning_tokens_at_most")
    fsm = by_mode(record, "log_absent(Failed to advance FSM)")
    tails = next(m for m in record.modes if m not in (budget, fsm))
    # The ngram cells asking for V2 ran V1 (the term is read on what ran), MTP ran V2 as asked.
    assert budget.conjunction == "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1 (effective)"
    assert budget.brought_by and budget.brought_by["pr"] == 54120 and budget.fails_at_bad and not budget.fixed_by
    assert fsm.conjunction == "spec_method=mtp" and not fsm.fails_at_bad
    assert fsm.brought_by and fsm.brought_by["pr"] == 43911 and fsm.fixed_by and fsm.fixed_by["pr"] == 44297
    assert "no_whitespace_tail" in tails.mode and tails.conjunction == "spec_method=mtp"
    assert tails.brought_by and tails.brought_by["pr"] == 44297 and tails.fails_at_bad
    repo = demo_triage.root / "phases" / ".cache" / "sim-demo"
    for mode in (budget, fsm, tails):
        assert mode.report
        md = (demo_triage.root / mode.report).read_text()
        assert md.startswith("### Your current environment\n") and "### 🐛 Describe the bug" in md
        assert f"**Minimal failing configuration:** `{mode.conjunction}`" in md
        assert "**Brought by**" in md and ("**Fixed by**" in md) == (mode is fsm)
        assert "**What still fails at `main`**" in md
        reply = reproduce(md, repo, tmp_path)
        choice = reply["choices"][0]
        if mode is budget:
            assert choice["finish_reason"] == "length"
        else:
            # The tail of whitespace runs to max_tokens; the FSM bug says so in the log, the tails do not.
            assert choice["finish_reason"] == "length" and choice["message"]["content"].endswith((" ", "\n"))
            assert ("Failed to advance FSM" in reply["_log"]) == (mode is fsm)
            assert ("Failed to advance FSM" in md) == (mode is fsm)
    # The bisect's one search served both modes at bad, and the sweep at #43911 did not start again
    # the server the bisect had started there (a design of strength 1 over the rest, and the zoom).
    assert len(json.loads((demo_triage.root / "phases" / "bisect" / "manifest.json").read_text())["settings_keys"]) == 1
    at = next(p for p in record.phases if p.name.startswith("at-"))
    assert 0 < at.starts <= 4, at
    html = (demo_triage.root / "reports" / "triage.html").read_text()
    assert html.count("<h2 id='mode-") == 3 and "#54120" in html
    code, out, err = run_cli(["report", "t", "--runs-dir", str(demo_triage.root.parent)], capsys)
    assert code == 0, err
    assert out.startswith("triage t: ") and "GPU-h" in out and "reused:" in out
    assert re.search(r"^bisect\s+done\s+\d+", out, re.MULTILINE) and out.count("\nmode ") == 3


# ---- the planted history -----------------------------------------------------------------------

@pytest.mark.full  # a triage, a full-product sweep and a bisect of the same cells: ~115 server starts
@pytest.mark.timeout(1800)
def test_planted_history_is_triaged_with_fewer_starts_than_sweep_and_bisect(
        planted: tuple[Path, dict[str, str]], planted_triage: RunDir, tmp_path: Path) -> None:
    root, shas = planted
    record = record_of(planted_triage)
    assert len(record.modes) == 3, [m.mode for m in record.modes]
    budget = by_mode(record, "reasoning_tokens_at_most")
    fsm = by_mode(record, "log_absent")
    tails = next(m for m in record.modes if m not in (budget, fsm))
    # The runner falls back to V1 under ngram and MTP here: only spec none runs V2, which says it.
    assert budget.conjunction == "VLLM_USE_V2_MODEL_RUNNER=1 (effective)"
    assert budget.brought_by and budget.brought_by["sha"] == shas[f"c{BUDGET_IN}"]
    assert fsm.conjunction == "spec_method=mtp" and fsm.brought_by and fsm.brought_by["sha"] == shas[f"c{FSM_IN}"]
    assert tails.conjunction == "spec_method=none" and not tails.fails_at_bad
    assert tails.brought_by and tails.brought_by["sha"] == shas[f"c{TAILS_IN}"]
    assert tails.fixed_by and tails.fixed_by["sha"] == shas[f"c{TAILS_OUT}"]
    for mode in (budget, fsm, tails):
        assert mode.report
        md = (planted_triage.root / mode.report).read_text()
        reply = reproduce(md, root / "vllm", tmp_path, sends=4)
        assert reply["choices"][0]["finish_reason"] == "length"
    triage_starts = starts_in_logs(planted_triage.root)
    assert triage_starts == record.starts

    # The same cells bisected alone, after a full-product sweep of good and bad.
    runs = tmp_path / "alone"
    run_matrix(root / "full.yaml", runs_dir=runs, run_id="full", executor=choose("local"), cache_dir=tmp_path / "cache")
    bisected = json.loads((planted_triage.root / "phases" / "bisect" / "manifest.json").read_text())["settings_keys"]
    matrix = load_matrix(root / "full.yaml")
    cells = sorted({c.settings_key: c for c in matrix.cells if c.settings_key in bisected}.values(), key=lambda c: c.cell_id)
    bisect_cells(Subject(matrix, cells, load_suites(matrix.suite_paths)), BisectScope(good="v0.27", bad="main"),
                 BisectOptions(runs_dir=runs, run_id="b", cache_dir=tmp_path / "cache"), executor=choose("local"),
                 on_event=lambda _: None)
    sweep_starts, bisect_starts = starts_in_logs(runs / "full"), starts_in_logs(runs / "b")
    # `pytest -s -k planted_history` prints the figures BENCHMARKS.md (T1) quotes.
    print(f"planted starts: triage {triage_starts} { {p.name: p.starts for p in record.phases} }, "
          f"full sweep {sweep_starts}, bisect alone {bisect_starts}")
    assert triage_starts <= 2 * bisect_starts, (triage_starts, bisect_starts)
    # On this matrix (6 servers a commit) a covering design of strength 3 saves no start; the sweep
    # at the commit that brought the tails (a mode absent at both ends) starts none of the servers
    # the bisect started there, and only those of the others that explain needs to identify the
    # mode there, the bisect's samples there read with its own (whether the bisect's cell there is
    # the V1 or the V2 server of spec none varies from run to run: without them, the zoom could not
    # tell spec_method=none from its V1 half when the V2 one was the bisect's). Sweep and bisect
    # alone leave that mode unexplained, for as many starts or more.
    at = next(p for p in record.phases if p.name.startswith("at-"))
    assert at.starts <= 4, at
    zoomed = json.loads((planted_triage.root / "phases" / at.name / "manifest.json").read_text())["zoom"]
    assert "tail: identified (spec_method=none)" in zoomed, zoomed
    assert triage_starts <= sweep_starts + bisect_starts, (triage_starts, sweep_starts, bisect_starts)


SLOTS = 4  # the interrupted triage's parallel starts


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.full  # a real `sweep triage` in a subprocess, interrupted mid-bisect and resumed
@pytest.mark.timeout(1800)
def test_interrupted_triage_resumes_to_the_same_reports(planted: tuple[Path, dict[str, str]], planted_triage: RunDir,
                                                        tmp_path: Path) -> None:
    root, _ = planted
    runs = tmp_path / "runs"
    # In-process slots, not Ray: what is under test is the triage's own record and its drivers'
    # resume; a bisect interrupted on Ray is `test_bisect_e2e`'s (a local Ray costs this test a minute).
    args = [sys.executable, "-m", "sweeper", "triage", str(root / "m.yaml"), "--good", "v0.27", "--bad", "main",
            "--runs-dir", str(runs), "--executor", "local", "--gpus", str(SLOTS), "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, "RAY_ADDRESS": ""}
    # A test run started in the background of a shell without job control inherits SIGINT ignored,
    # and so would the triage: it would run to its end through the Ctrl-C. A terminal's Ctrl-C is
    # what is under test, so the triage gets the default disposition, as a foreground command has.
    proc = subprocess.Popen([*args, "--run-id", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env, preexec_fn=_interruptible)  # noqa: PLW1509 (one signal call)
    probes = runs / "r" / "phases" / "bisect" / "probes"
    deadline = time.monotonic() + 900
    # The first stored probe: the bisect has dozens to go (the 47 starts of the planted history), so
    # the Ctrl-C lands mid-bisect even on a loaded machine, where waiting for the fifth once let the
    # triage finish before the signal came.
    while not (probes.is_dir() and any(probes.glob("*.parquet"))):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no bisect probe in time"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.rstrip().splitlines()[-1].rstrip("`").endswith("--resume r")
    before = analysis.load_table(RunDir(runs / "r" / "phases" / "bisect"), "probes").to_pandas()
    assert not record_of(RunDir(runs / "r")).final
    proc = subprocess.Popen([*args, "--resume", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-3000:]
    record = record_of(RunDir(runs / "r"))
    assert record.final and "triage r: " in out
    # The same reports as a triage never interrupted (in-process, in its own folder).
    whole = record_of(planted_triage)
    assert [(m.mode, m.conjunction, (m.brought_by or {}).get("sha"), (m.fixed_by or {}).get("sha"))
            for m in record.modes] == \
        [(m.mode, m.conjunction, (m.brought_by or {}).get("sha"), (m.fixed_by or {}).get("sha")) for m in whole.modes]
    bisect_run = RunDir(runs / "r" / "phases" / "bisect")
    after = analysis.load_table(bisect_run, "probes").to_pandas()
    # No probe run twice: every probe kept under its name, each start once on disk.
    assert set(before.group_id) <= set(after.group_id) and not after.group_id.duplicated().any()
    cells = analysis.load_table(bisect_run, "cells").to_pandas()
    assert set(after.group_id) <= set(cells.group_id)
    # Each stored start logged once. A start whose log was written as the Ctrl-C landed, before its
    # samples, was never evidence: its probe runs again on resume, under a name of its own.
    logged = {p.stem: p.read_text().count("vLLM API server version") for p in (bisect_run.root / "logs").glob("*.log")}
    assert all(logged.get(gid) == 1 for gid in cells.group_id.unique()), logged
    assert len(set(logged) - set(cells.group_id)) <= SLOTS, sorted(set(logged) - set(cells.group_id))
    # The sweeps before the interruption were not run again either: each group they stored started
    # once. (A start that was under way when the Ctrl-C landed stored nothing and may run again.)
    for phase in ("bad", "good"):
        run = RunDir(runs / "r" / "phases" / phase)
        stored = set(analysis.load_table(run, "cells").to_pandas().group_id)
        logged = {p.stem: p.read_text().count("vLLM API server version") for p in (run.root / "logs").glob("*.log")}
        assert stored and all(logged.get(gid) == 1 for gid in stored), logged


def test_the_zoom_under_a_budget_pays_the_design_and_every_earlier_zoom_phase(
        planted: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """A triage's zoom hook prices a zoom phase's servers beside those the sweep has planned already
    (the design's, earlier zoom phases'): a second phase gets only what the first left, and a commit
    the design installed is not paid for again."""
    from sweeper.drivers.sweep import make_plan
    from sweeper.drivers.triage import Triage
    from sweeper.plan.design import DesignSpec

    root, _ = planted
    # Three axes of 3 x 2 x 2 at one commit: a covering of strength 2 leaves servers for a zoom.
    text = MATRIX.format(commits="main").replace("suite: small.yaml", f"suite: {root / 'small.yaml'}") \
        .replace("repo: vllm", f"repo: {root / 'vllm'}") + "  async_scheduling: [true, false]\n"
    (tmp_path / "m.yaml").write_text(text)
    t = Triage(TriageScope(tmp_path / "m.yaml", "v0.27", "main"),
               TriageOptions(runs_dir=tmp_path / "runs", run_id="t", budget_h=100.0,
                             design=DesignSpec(kind="covering", strength=2)), None, lambda _: None)
    plan = make_plan(tmp_path / "m.yaml", t.phases, design_spec=t.design, cut=Slice(commit=t.bad_ref))
    rest = tuple(g for g in plan.matrix.groups() if g.group_id not in {h.group_id for h in plan.groups})
    assert len(rest) >= 2
    one = plan.estimate(plan.groups + rest[:1]).gpu_seconds - plan.estimate(plan.groups).gpu_seconds
    # Room for the design and one more server (no install: the design installed the commit).
    t.record.budget_h = (plan.estimate().gpu_seconds + 1.5 * one) / 3600
    phase = t.record.add_phase(Phase("bad", "sweep", "bad"))
    phase.modelled_gpu_s = plan.estimate().gpu_seconds  # the phase under way: paid once, through `held`
    afford = t._afford(plan, phase)
    assert afford is not None
    first = afford(rest, plan.groups)
    assert first == rest[:1]
    assert afford(rest[1:], plan.groups + first) == ()  # the first zoom phase spent the room


@pytest.mark.full  # a whole triage, in-process, of a one-cell history
@pytest.mark.timeout(600)
def test_the_triage_bisects_with_the_search_it_was_given(tmp_path: Path, tiny_suite: Path) -> None:
    """`--expect-changes` and `--bumps` reach the triage's bisect as they reach `sweep bisect`'s."""
    from conftest import crash_history

    crash_history(tmp_path, tiny_suite, 4, crash_from=2, after_requests=1)
    options = TriageOptions(runs_dir=tmp_path / "runs", run_id="t", cache_dir=tmp_path / "cache",
                            **search_choices(0, 2.0))
    run = run_triage(TriageScope(tmp_path / "m.yaml", "v0.27", "c3"), options, executor=choose("local")).run
    verdict = json.loads((run.root / "phases" / "bisect" / "bisect.json").read_text())
    assert verdict["expected_changes"] == 2.0 and verdict["quiet_scan"] is None and verdict["bump_width"] is None
