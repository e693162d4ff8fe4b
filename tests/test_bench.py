"""The bench: a matrix's `bench:` section, vLLM's serving-metric definitions, and the load phase of a
sweep end to end (simulator servers, the in-process executor, real Parquet that pandas reads).

The definitions are held to hand-computed figures on made-up requests and /metrics scrapes; the phase
to a simulator whose performance model says what the figures must come out at.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import SUITE, make_sim_repo, run_cli

from sweeper.drivers.sweep import make_plan, run_matrix
from sweeper.errors import ConfigError
from sweeper.execute import bench_phase, server_metrics
from sweeper.execute.choice import choose
from sweeper.install.matrix_loader import load_matrix
from sweeper.judge import metric_names, serving
from sweeper.plan import cost
from sweeper.spec.bench import INF, LoadPoint
from sweeper.store.metrics_table import METRICS_SCHEMA, read_metrics
from sweeper.store.run_folder import open_run

ROOT = Path(__file__).resolve().parent.parent
STEP_S = 0.01
PERF = {"prefill_s_per_token": 0.0002, "decode_step_s": STEP_S, "draft_s_per_token": 0.0, "batch_slowdown": 0.0,
        "start_cv": 0.0, "request_cv": 0.0}
HEAD = "model: m\nsuite: s.yaml\ninstall: {kind: preinstalled}\naxes: {spec_method: [none]}\n"


def matrix_file(tmp_path: Path, bench: str, head: str = HEAD) -> Path:
    (tmp_path / "s.yaml").write_text("cases: [{id: a, body: {messages: [{role: user, content: hi}]}}]\n")
    path = tmp_path / "m.yaml"
    path.write_text(head + bench)
    return path


# --- the bench: section ---------------------------------------------------------------------------

def test_a_bench_section_parses_into_load_points(tmp_path: Path) -> None:
    path = matrix_file(tmp_path, "bench:\n  input_len: 64\n  output_len: 32\n"
                                 "  load: {concurrency: [1, 8], request_rate: [4, inf]}\n  seed: 3\n")
    bench = load_matrix(path).spec.bench
    assert bench is not None
    assert bench.points() == (LoadPoint(1, 4.0), LoadPoint(1, INF), LoadPoint(8, 4.0), LoadPoint(8, INF))
    assert [p.point_id for p in bench.points()] == ["concurrency=1,request_rate=4", "concurrency=1",
                                                    "concurrency=8,request_rate=4", "concurrency=8"]
    # Defaults: vLLM's where it has one (range ratio 0, burstiness 1, no warm-ups), two starts, after the replay.
    assert (bench.dataset_name, bench.range_ratio, bench.burstiness, bench.num_warmups, bench.starts, bench.after,
            bench.effective_endpoint, bench.temperature) == ("random", 0.0, 1.0, 0, 2, "replay", "completions", 0.0)
    only_rate = load_matrix(matrix_file(tmp_path, "bench: {load: {request_rate: .inf}}\n")).spec.bench
    assert only_rate is not None and [p.point_id for p in only_rate.points()] == ["request_rate=inf"]
    assert only_rate.effective_input_len == 1024 and only_rate.effective_output_len == 128  # vLLM's defaults
    suite = load_matrix(matrix_file(tmp_path, "bench: {dataset: suite, load: {concurrency: 2}}\n")).spec.bench
    assert suite is not None and suite.effective_endpoint == "chat" and suite.effective_output_len is None


def test_a_jsonl_dataset_is_read_by_the_loader_and_carried_by_value(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello there"}\n{"prompt": [1, 2, 3], "output_tokens": 5}\n')
    bench = load_matrix(matrix_file(tmp_path, "bench: {dataset: {jsonl: p.jsonl}, load: {concurrency: 1}}\n")).spec.bench
    assert bench is not None and bench.dataset_name == "jsonl:p.jsonl"
    assert [p.prompt for p in bench.dataset.prompts] == ["hello there", (1, 2, 3)]  # type: ignore[union-attr]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: "):
        load_matrix(matrix_file(tmp_path, "bench: {dataset: {jsonl: bad.jsonl}, load: {concurrency: 1}}\n"))


@pytest.mark.parametrize("bench,where,expected", [
    ("bench: {load: {concurrency: [0]}}", "bench.load.concurrency[0]", "from 1 to 4096, got 0"),
    ("bench: {load: {concurrency: [1, x]}}", "bench.load.concurrency[1]", "got 'x'"),
    ("bench: {load: {request_rate: [0]}}", "bench.load.request_rate[0]", "or inf, got 0"),
    ("bench: {load: {request_rate: [-2]}}", "bench.load.request_rate[0]", "or inf, got -2"),
    ("bench: {load: {request_rate: [4, 4]}}", "bench.load.request_rate[1]", "duplicate load point 4"),
    ("bench: {load: {}}", "bench.load", "expected concurrency: [N, ...] and/or request_rate"),
    ("bench: {load: {concurrency: 1}, bogus: 1}", "bench.bogus", "unknown key; expected one of: dataset"),
    ("bench: {load: {concurrency: 1, qps: 3}}", "bench.load.qps", "unknown key; expected one of: concurrency"),
    ("bench: {load: {concurrency: 1}, starts: 0}", "bench.starts", "greater than or equal to 1"),
    ("bench: {load: {concurrency: 1}, num_prompts: many}", "bench.num_prompts", "valid integer"),
    ("bench: {load: {concurrency: 1}, dataset: sharegpt}", "bench.dataset", "expected random, suite or {jsonl: FILE}"),
    ("bench: {load: {concurrency: 1}, after: before}", "bench.after", "expected one of 'replay' or 'instead'"),
    ("bench: {load: {concurrency: 1}, dataset: suite, input_len: 5}", "bench.input_len", "only for dataset: random"),
    ("bench: {load: {concurrency: 1}, dataset: {jsonl: nowhere.jsonl}}", "bench.dataset.jsonl", "nowhere.jsonl: no such file"),
    ("bench: {starts: 2}", "bench.load", "required key is missing"),
])
def test_bad_bench_input_is_one_line_naming_file_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              bench: str, where: str, expected: str) -> None:
    path = matrix_file(tmp_path, bench + "\n")
    code, out, err = run_cli(["matrix", str(path), "--dry-run"], capsys)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(rf"m\.yaml:5: {re.escape(where)}: .*{re.escape(expected)}", err), err


# --- vLLM's definitions, by hand -------------------------------------------------------------------

def record(start: float, ttft: float, itl: list[float], *, out: int | None, prompt: int = 10, ok: bool = True,
           error: str | None = None) -> Any:
    e2el = ttft + sum(itl)
    return SimpleNamespace(start=start, ttft=ttft if ok else None, itl=itl if ok else [], e2el=e2el if ok else None,
                           prompt_tokens=prompt if ok else None, output_tokens=out if ok else None,
                           chunks=len(itl) + 1 if ok else 0, ok=ok, error=error)


def test_figures_follow_vllm_bench_serve() -> None:
    recs = [record(0.0, 0.1, [0.02, 0.04], out=5),       # 3 chunks carry 5 tokens (speculation)
            record(0.0, 0.3, [0.05], out=2, prompt=20),
            record(0.5, 0.2, [], out=1),                  # one token: no TPOT, no ITL
            record(0.6, 0.0, [], out=None, ok=False, error="HTTP 500")]
    row = serving.figures(recs, duration=2.0, t0=0.0)
    assert (row["completed"], row["failed"], row["duration"]) == (3, 1, 2.0)
    assert (row["total_input_tokens"], row["total_output_tokens"]) == (40, 8)
    assert row["request_throughput"] == 1.5 and row["output_throughput"] == 4.0 and row["total_token_throughput"] == 24.0
    # TPOT = (E2EL - TTFT) / (output tokens - 1): 0.06 / 4 and 0.05 / 1; the first token excluded.
    assert row["mean_tpot_ms"] == pytest.approx((15.0 + 50.0) / 2)
    assert row["median_tpot_ms"] == pytest.approx(32.5)
    # ITL: one gap per chunk after the first, over every request.
    assert row["mean_itl_ms"] == pytest.approx((20 + 40 + 50) / 3)
    assert row["mean_ttft_ms"] == pytest.approx(200.0) and row["median_ttft_ms"] == pytest.approx(200.0)
    assert row["std_ttft_ms"] == pytest.approx(np.std([100, 300, 200]))  # numpy's population std, as vLLM
    assert row["p99_ttft_ms"] == pytest.approx(np.percentile([100, 300, 200], 99))
    assert row["mean_e2el_ms"] == pytest.approx((160 + 350 + 200) / 3)
    assert row["mean_ttft_ms_se"] == pytest.approx(np.std([100, 300, 200], ddof=1) / math.sqrt(3))
    assert row["max_concurrent_requests"] == 3  # vLLM's count: requests active within one whole second
    # Chunks per whole second from the first send (vLLM's peak): 3 + 2 in second 0, 1 in second 0.
    assert row["max_output_tokens_per_s"] == 6.0
    assert row["request_throughput_se"] is not None
    # A server that sends no usage: output tokens are its chunks.
    assert serving.figures([record(0.0, 0.1, [0.1, 0.1], out=None)], 1.0)["total_output_tokens"] == 3
    empty = serving.figures([record(0.0, 0.0, [], out=None, ok=False)], 1.0)
    assert empty["completed"] == 0 and empty["mean_ttft_ms"] is None  # never a silent 0


def test_throughput_se_is_batch_means_over_time_windows() -> None:
    # One request finishing every 0.1 s for 2 s (mid-window): every window completes as many: no spread.
    steady = [record(i * 0.1, 0.025, [0.025], out=2) for i in range(20)]
    assert serving.figures(steady, 2.0, 0.0)["request_throughput_se"] == pytest.approx(0.0, abs=1e-9)
    # All of them finishing in the first tenth: the windows differ, the error is large.
    burst = [record(0.0, 0.05, [0.04], out=2) for _ in range(20)]
    assert serving.figures(burst, 2.0, 0.0)["request_throughput_se"] == pytest.approx(
        np.std([20 / 0.2] + [0.0] * 9, ddof=1) / math.sqrt(10))


def scrape(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float],
           success: float = 0.0) -> dict[Any, float]:
    labels = (("engine", "0"), ("model_name", "m"))
    out = {(serving.DRAFTS, labels): drafts, (serving.DRAFT_TOKENS, labels): draft_tokens,
           (serving.ACCEPTED, labels): accepted, (serving.SUCCESS, (*labels, ("finished_reason", "length"))): success}
    for i, v in enumerate(per_pos):
        out[(serving.ACCEPTED_PER_POS, (*labels, ("position", str(i))))] = v
    return out


def test_spec_decode_figures_are_deltas_as_vllm_computes_them() -> None:
    before = scrape(100, 300, 150, [70, 50, 30])
    after = scrape(300, 900, 550, [230, 190, 130])  # 200 drafts, 600 draft tokens, 400 accepted
    got = serving.spec_decode(before, after, expected=True)
    assert got.problem is None
    c = got.columns
    assert (c["spec_decode_num_drafts"], c["spec_decode_draft_tokens"], c["spec_decode_accepted_tokens"]) == (200, 600, 400)
    assert c["spec_decode_acceptance_rate"] == pytest.approx(400 / 600 * 100)  # a percentage, as vLLM's
    assert c["spec_decode_acceptance_length"] == pytest.approx(1 + 400 / 200)  # the bonus token counted
    assert c["spec_decode_per_position_acceptance_rates"] == pytest.approx([0.8, 0.7, 0.5])
    # Its SE from the per-position counts equals the standard error of a sample of drafts that
    # accepted 0..3 tokens in those proportions (P(A >= i + 1) = rate at position i).
    counts = {0: 40, 1: 20, 2: 40, 3: 100}  # 160 reach 1, 140 reach 2, 100 reach 3: the rates above
    sample = np.repeat(list(counts), list(counts.values()))
    assert len(sample) == 200 and sample.sum() == 400
    assert c["spec_decode_acceptance_length_se"] == pytest.approx(np.std(sample) / math.sqrt(200))
    assert c["spec_decode_acceptance_rate_se"] == pytest.approx(np.std(sample) / math.sqrt(200) / 3 * 100)


def test_spec_decode_counters_that_go_backwards_or_are_missing_are_a_problem() -> None:
    before = scrape(100, 300, 150, [70, 50, 30], success=40)
    restarted = scrape(20, 60, 30, [10, 8, 4], success=5)
    got = serving.spec_decode(before, restarted, expected=True)
    assert got.problem is not None and "went backwards" in got.problem
    assert all(v is None for v in got.columns.values())
    # A non-spec counter going backwards is the same restart.
    assert "went backwards" in (serving.spec_decode(scrape(1, 3, 1, [], success=9), scrape(2, 6, 2, [], success=3),
                                                     expected=True).problem or "")
    none = {k: v for k, v in scrape(0, 0, 0, []).items() if k[0] == serving.SUCCESS}
    assert serving.spec_decode(none, none, expected=False) == serving.SpecDecode(dict.fromkeys(serving.SPEC_COLUMNS))
    missing = serving.spec_decode(none, none, expected=True)
    assert missing.problem is not None and "no spec-decode counters" in missing.problem
    # Nothing drafted (ngram on prompts it cannot match): counts of 0, no acceptance figures (vLLM prints none).
    idle = serving.spec_decode(scrape(5, 15, 5, [3]), scrape(5, 15, 5, [3]), expected=True)
    assert idle.problem is None and idle.columns["spec_decode_num_drafts"] == 0
    assert idle.columns["spec_decode_acceptance_length"] is None


def test_a_phase_is_invalid_for_the_first_reason_that_holds() -> None:
    good, bad = record(0, 0.1, [], out=1), record(0, 0, [], out=None, ok=False, error="HTTP 500: boom")
    assert serving.judge_phase([good], stopped=None, alive=True, metrics_problem=None) is None
    assert serving.judge_phase([good, bad], stopped=None, alive=True, metrics_problem=None) == \
        "1 of 2 requests failed: HTTP 500: boom"
    assert serving.judge_phase([good], stopped=None, alive=True, metrics_problem="/metrics x") == "/metrics x"
    assert (serving.judge_phase([bad], stopped="stalled: ReadTimeout", alive=True, metrics_problem=None)
            == "the load phase stopped early: stalled: ReadTimeout")
    assert serving.judge_phase([bad], stopped=None, alive=False, metrics_problem=None).startswith(  # type: ignore[union-attr]
        "the server exited during the load phase")


def test_every_metric_is_a_column_and_every_column_is_documented() -> None:
    names = set(METRICS_SCHEMA.names)
    assert set(metric_names.METRICS) <= names and set(metric_names.COUNTS) <= names
    assert set(metric_names.se_columns()) <= names and metric_names.PER_POSITION.name in names
    assert all(m.unit and m.doc for m in [*metric_names.METRICS.values(), *metric_names.COUNTS.values()])
    readme = (ROOT / "runs" / "README.md").read_text()
    section = readme[readme.index("## The metrics table"):]
    documented = set(re.findall(r"`([a-z0-9_<>]+)`", section))
    expanded = {d.replace("<x>", x) for d in documented for x in metric_names.LATENCIES}
    missing = [n for n in METRICS_SCHEMA.names if n not in expanded and f"{n.removesuffix('_se')}" not in expanded]
    assert not missing, f"columns not in runs/README.md's metrics section: {missing}"


# --- a whole sweep with a bench --------------------------------------------------------------------

def bench_matrix(root: Path, sims: list[tuple[str, dict[str, Any]]], bench: dict[str, Any],
                 axes: str = "{commit: [good], spec_method: [none, mtp], num_speculative_tokens: [2]}") -> Path:
    (root / "tiny.yaml").write_text(SUITE)
    make_sim_repo(root / "vllm", sims)
    path = root / "m.yaml"
    path.write_text(f"name: b\nmodel: m\nsuite: {root / 'tiny.yaml'}\ninstall: {{kind: sim, repo: {root / 'vllm'}}}\n"
                    f"timeouts: {{startup_s: 30, request_s: 10}}\naxes: {axes}\n"
                    + yaml.safe_dump({"bench": bench}))
    return path


BENCH = {"input_len": 20, "output_len": 11, "load": {"concurrency": [1, 4]}, "num_prompts": 8, "num_warmups": 2,
         "starts": 2}


def test_a_sweep_with_a_bench_writes_a_metrics_table_pandas_reads(tmp_path: Path) -> None:
    accept = [0.9, 0.5]
    path = bench_matrix(tmp_path, [("good", {"perf": {**PERF, "acceptance": {"mtp": accept}}})], BENCH)
    outcome = run_matrix(path, runs_dir=tmp_path / "runs", run_id="r", executor=choose("local"),
                         cache_dir=tmp_path / "cache")
    frame = pd.read_parquet(tmp_path / "runs" / "r" / "metrics")
    assert len(frame) == 2 * 2 * 2  # cells x starts x load points
    assert list(frame.columns) == METRICS_SCHEMA.names
    assert frame["valid"].all() and frame["invalid_reason"].isna().all(), frame["invalid_reason"].tolist()
    assert sorted(frame["start"].unique()) == [0, 1]
    assert set(frame["load_point"]) == {"concurrency=1", "concurrency=4"}
    assert (frame["completed"] == 8).all() and (frame["total_output_tokens"] == 8 * 11).all()
    none, mtp = frame[frame["spec_method"] == "none"], frame[frame["spec_method"] == "mtp"]
    assert none["spec_decode_acceptance_length"].isna().all()
    # Without speculation one token per step: TPOT is the step (concurrency 1: nothing else running).
    assert none[none["concurrency"] == 1]["median_tpot_ms"].median() / 1000 == pytest.approx(STEP_S, rel=0.25)
    declared = 1 + accept[0] + accept[0] * accept[1]
    pooled = mtp["spec_decode_accepted_tokens"].sum() / mtp["spec_decode_num_drafts"].sum() + 1
    assert pooled == pytest.approx(declared, abs=4 * mtp["spec_decode_acceptance_length_se"].max())
    # The same reader as the rest of the store; the cells and samples are whole beside it.
    assert len(read_metrics(outcome.run)) == 8
    cells = pd.read_parquet(tmp_path / "runs" / "r" / "cells")
    assert (cells["status"] == "ok").all() and (cells["n_samples"] == 6).all()
    assert (cells["server_starts"] == 2).all()  # the bench's second start counts as a start


def test_acceptance_length_is_exactly_the_metrics_delta(tmp_path: Path) -> None:
    """The figure is the counters' own difference over the load point, warm-ups left out."""
    from test_load import sim

    spec = '{"method": "mtp", "num_speculative_tokens": 3}'
    bench = make_plan(bench_matrix(tmp_path, [("good", {})], {**BENCH, "num_warmups": 3, "starts": 1}),
                      tmp_path / "runs").matrix.spec.bench
    assert bench is not None
    cell = SimpleNamespace(request={}, spec_method="mtp")
    with sim(tmp_path, {"perf": PERF}, "--speculative-config", spec) as server:
        before = server_metrics.parse(server_metrics.scrape(server.base_url))
        info = bench_phase.StartInfo(0, None, lambda _: {})
        target = bench_phase.Target(server.base_url, "", "m", None, 10.0, server.alive)
        one = bench.model_copy(update={"load": bench.load.model_copy(update={"concurrency": (2,)})})
        (row,) = bench_phase.run_start(one, [cell], info, target)  # type: ignore[list-item]
        after = server_metrics.parse(server_metrics.scrape(server.base_url))
    delta = server_metrics.group_metrics(before, after)  # warm-ups included: more drafts than the row's
    assert row["valid"], row["invalid_reason"]
    assert row["spec_decode_num_drafts"] < delta.drafts
    assert row["spec_decode_acceptance_length"] == pytest.approx(
        1 + row["spec_decode_accepted_tokens"] / row["spec_decode_num_drafts"])
    assert len(row["spec_decode_per_position_acceptance_rates"]) == 3


def test_a_stall_ends_the_start_and_its_other_load_points_are_not_run(tmp_path: Path) -> None:
    from test_load import sim

    hang = {"perf": PERF, "bugs": [{"id": "hang", "effect": "hang", "when": {"stream": True}, "rate": 1.0}]}
    bench = make_plan(bench_matrix(tmp_path, [("good", {})], {**BENCH, "num_warmups": 0, "starts": 1}),
                      tmp_path / "runs").matrix.spec.bench
    assert bench is not None
    cell = SimpleNamespace(request={}, spec_method="none", cell_id="c")
    with sim(tmp_path, hang) as server:
        target = bench_phase.Target(server.base_url, "", "m", None, 1.0, server.alive)
        rows = bench_phase.run_start(bench, [cell], bench_phase.StartInfo(0, None, lambda _: {}), target)  # type: ignore[list-item]
    assert [r["load_point"] for r in rows] == ["concurrency=1", "concurrency=4"]
    assert rows[0]["invalid_reason"].startswith("the load phase stopped early: stalled")
    assert rows[1]["invalid_reason"] == "not run: the server stalled at concurrency=1 of c"
    assert not any(r["valid"] for r in rows)


def test_a_start_whose_server_dies_in_its_load_phase_is_invalid_and_the_samples_are_kept(tmp_path: Path) -> None:
    # The engine dies on the 4th streamed request: the replay (not streamed) is untouched, every
    # start's load phase crashes.
    crash = {"id": "dies", "effect": "crash", "when": {"stream": True}, "after_requests": 3, "exit_after_s": 0.05}
    path = bench_matrix(tmp_path, [("good", {"perf": PERF, "bugs": [crash]})], {**BENCH, "load": {"concurrency": [1]}},
                        axes="{commit: [good], spec_method: [none]}")
    run_matrix(path, runs_dir=tmp_path / "runs", run_id="r", executor=choose("local"), cache_dir=tmp_path / "cache")
    frame = pd.read_parquet(tmp_path / "runs" / "r" / "metrics")
    assert len(frame) == 2 and not frame["valid"].any()
    assert all(r.startswith("the server exited during the load phase") for r in frame["invalid_reason"]), \
        frame["invalid_reason"].tolist()
    samples = pd.read_parquet(tmp_path / "runs" / "r" / "samples")
    cells = pd.read_parquet(tmp_path / "runs" / "r" / "cells")
    assert len(samples) == 6 and samples["passed"].all()
    assert cells["status"].tolist() == ["ok"] and cells["n_samples"].tolist() == [6]


def test_bench_instead_of_the_replay_and_a_damaged_metrics_file(tmp_path: Path) -> None:
    path = bench_matrix(tmp_path, [("good", {"perf": PERF})],
                        {**BENCH, "after": "instead", "starts": 1, "load": {"request_rate": [50]}},
                        axes="{commit: [good], spec_method: [none]}")
    outcome = run_matrix(path, runs_dir=tmp_path / "runs", run_id="r", executor=choose("local"),
                         cache_dir=tmp_path / "cache")
    run = outcome.run
    frame = read_metrics(run)
    assert len(frame) == 1 and frame["valid"].all() and frame["load_point"].tolist() == ["request_rate=50"]
    assert pd.read_parquet(tmp_path / "runs" / "r" / "samples").empty
    (gid,) = run.done_groups()
    metrics_file = tmp_path / "runs" / "r" / "metrics" / f"{gid}.parquet"
    metrics_file.write_bytes(metrics_file.read_bytes()[:-40])
    damage = open_run(tmp_path / "runs", "r", create=False).scan().damage
    assert [d.group_id for d in damage] == [gid] and "metrics/" in damage[0].why
    assert f"metrics/{gid}.parquet" in damage[0].files
    again = run_matrix(path, runs_dir=tmp_path / "runs", resume="r", executor=choose("local"),
                       cache_dir=tmp_path / "cache")
    assert again.ran == [gid] or gid in again.ran
    assert len(read_metrics(again.run)) == 1


def test_the_load_phase_is_in_the_cost_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = "bench: {load: {concurrency: [1, 8], request_rate: [2]}, num_prompts: 10, num_warmups: 2, starts: 3}\n"
    head = "model: m\nsuite: s.yaml\ninstall: {kind: preinstalled}\ncost: {start_s: 100, request_s: 1}\n" \
           "axes: {spec_method: [none, ngram], request.temperature: [0, 1]}\n"
    plain = load_matrix(matrix_file(tmp_path, "", head))
    benched = load_matrix(matrix_file(tmp_path, bench, head))
    profile = cost.profile_for(benched.spec, cost.stated("preinstalled", (0.0, 100.0, 1.0)))
    e = cost.estimate(benched.groups(), benched.spec, profile, 10)
    # Per cell and start: 2 load points of 12 requests at 1 s each (the rate's 10 / 2 s is faster).
    assert cost.load_phase_seconds(benched.spec.bench, profile) == 2 * 12.0  # type: ignore[arg-type]
    assert (e.starts, e.requests, e.bench_s) == (2 * 3, 4 * 10, 4 * 3 * 24.0)
    assert e.gpu_seconds == 6 * 100 + 40 * 1 + 288
    assert e.gpu_seconds > cost.estimate(plain.groups(), plain.spec, profile, 10).gpu_seconds
    group = benched.groups()[0]
    assert cost.server_seconds(group, profile, 10, benched.spec.bench) == 3 * 100 + 2 * 10 + 2 * 3 * 24.0
    slow = load_matrix(matrix_file(tmp_path, bench.replace("request_rate: [2]", "request_rate: [0.5]"), head))
    assert cost.load_phase_seconds(slow.spec.bench, profile) == 2 * 20.0  # type: ignore[arg-type]  # arrivals: 10 / 0.5 s
    code, out, _ = run_cli(["matrix", str(tmp_path / "m.yaml"), "--dry-run"], capsys)
    assert code == 0 and "6 starts" in out and "load phases" in out
