"""`sweep triage` on a metric mode: an `expect:` bound broken at bad is bisected by the metric bisect and
reported as a perf bug (issue 51, item 4). On a reduced copy of `matrices/demo-perf.yaml` (the MTP cells
with async scheduling, both model runners, the same `bench:` and `expect:`), between v0.27 and main, the
acceptance-length mode is located at the planted commit (v0.28.0~1, #43904) and its report carries the
`vllm bench serve` line of the load point, the before → after at the two ends and the commit with its PR."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sweeper.drivers.triage import TriageOptions, TriageScope, run_triage
from sweeper.execute.choice import choose
from sweeper.store.triage_record import from_json

ROOT = Path(__file__).resolve().parent.parent
PLANTED_PR = 43904  # vllmsim: "[Model Runner V2] Share the draft KV cache across MTP steps", at v0.28.0~1


def reduced_demo_perf(root: Path) -> Path:
    raw = yaml.safe_load((ROOT / "matrices" / "demo-perf.yaml").read_text())
    raw["suite"] = str(ROOT / "suites" / "structured-output.yaml")
    raw["axes"] = {"commit": ["v0.27.0", "main"], "spec_method": ["mtp"], "num_speculative_tokens": [4],
                   "async_scheduling": [True], "env.VLLM_USE_V2_MODEL_RUNNER": ["0", "1"]}
    assert raw["expect"] == {"spec_decode_acceptance_length": {"min": 3.09}}
    path = root / "demo-perf-small.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.full  # a triage: two sweeps and a metric bisect, ~70 s
@pytest.mark.timeout(600)
def test_an_expect_mode_is_bisected_on_its_metric_and_reported_as_a_perf_bug(tmp_path: Path) -> None:
    matrix = reduced_demo_perf(tmp_path)
    out = run_triage(TriageScope(matrix, "v0.27", "main"),
                     TriageOptions(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache"), executor=choose("local"))
    record = from_json(out.run.read_json("triage.json"), "triage.json")
    [mode] = [m for m in record.modes if m.mode.startswith("expect:spec_decode_acceptance_length")]
    # The metric bisect ran as its own phase, the sweeps' starts told as evidence; the failure bisect did not.
    phase = record.phase("metric-bisect-1")
    assert phase is not None and phase.status == "done" and "reused" in phase.note
    assert record.phase("bisect") is None
    b = mode.brought_by
    assert b is not None, "the acceptance mode was not located"
    assert b["pr"] == PLANTED_PR and "Share the draft KV cache" in b["subject"]
    assert b["confidence"] >= 0.99 and b["metric"] == "spec_decode_acceptance_length"
    # The planted fall (3.16 → 3.02, about -4.5 %) inside the interval, which lies below the minimum effect.
    assert b["effect_low"] <= -0.03 and b["effect_low"] <= b["effect"] <= b["effect_high"] < 0
    assert b["before"] > 3.09 > b["after"]
    md = (out.run.root / str(mode.report)).read_text()
    bench = [line for line in re.findall(r"```bash\n(.*?)\n```", md, re.DOTALL) if "vllm bench serve" in line]
    assert bench, md
    assert "--ignore-eos" in bench[0] and ("--max-concurrency" in bench[0] or "--request-rate" in bench[0])
    assert f"--max-concurrency {b['load_point'].removeprefix('concurrency=')}" in bench[0]
    assert "vllm serve" in md and "VLLM_USE_V2_MODEL_RUNNER=1" in md
    # Before/after at the two ends with intervals, and the commit with its PR and its size.
    assert re.search(r"\| before: same settings \|.*`v0\.27` \|.*\[[\d.]+, [\d.]+\]", md), md
    assert re.search(r"\| after \(failing\) \|.*`main` \|.*\[[\d.]+, [\d.]+\]", md), md
    assert f"**Brought by** `{b['short']}`" in md and f"(#{PLANTED_PR})" in md and "95 % interval" in md


SYNC_STEP_PR = 43922  # vllmsim: "[Core] Copy sampled token ids to the host every synchronous step", at main~3


@pytest.mark.full  # a triage: two sweeps and a metric bisect
@pytest.mark.timeout(600)
def test_a_watched_metric_that_got_worse_is_a_mode_without_any_bound(tmp_path: Path) -> None:
    """`--watch mean_tpot_ms`: no `expect:` section; the decode step planted 10 % slower without async
    scheduling (main~3, #43922) is a mode of the cells without it, explained as such, bisected to its commit
    and reported; the cells with async scheduling, the same at both ends, are not."""
    raw = yaml.safe_load((ROOT / "matrices" / "demo-perf.yaml").read_text())
    raw.pop("expect")
    raw["suite"] = str(ROOT / "suites" / "structured-output.yaml")
    raw["axes"] = {"commit": ["v0.27.0", "main"], "spec_method": ["none"], "async_scheduling": [True, False],
                   "env.VLLM_USE_V2_MODEL_RUNNER": ["0"]}
    raw["bench"]["starts"] = 3  # a stray start on a busy machine weighs less against five that agree
    matrix = tmp_path / "demo-perf-tpot.yaml"
    matrix.write_text(yaml.safe_dump(raw, sort_keys=False))
    lines: list[str] = []
    out = run_triage(TriageScope(matrix, "v0.27", "main"),
                     TriageOptions(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache", watch=("mean_tpot_ms",),
                                   min_effect=0.05), executor=choose("local"), on_event=lines.append)
    record = from_json(out.run.read_json("triage.json"), "triage.json")
    # Two cells x two load points x three starts at bad, each against its cell's mean at good: the six
    # starts without async scheduling are worse by 10 % planted (a start may stray under 5 % on a busy
    # machine, as one with async scheduling may stray over it; explain weighs starts, not single ones).
    [watch] = [line for line in lines if line.startswith("watch: ")]
    worse = re.match(r"watch: (\d+) of 12 start x load point comparisons worse by 5 % or more at main than at "
                     r"v0\.27", watch)
    assert worse is not None and 4 <= int(worse.group(1)) <= 8, watch
    [mode] = record.modes
    assert mode.mode == "expect:mean_tpot_ms change<=+5% vs v0.27", mode.mode
    assert mode.conjunction == "async_scheduling=false", mode.conjunction
    b = mode.brought_by
    assert b is not None, "the TPOT mode was not located"
    assert b["pr"] == SYNC_STEP_PR and b["metric"] == "mean_tpot_ms" and b["confidence"] >= 0.99
    assert 0.05 <= b["effect_low"] <= b["effect"] <= b["effect_high"]  # the planted +10 %
    md = (out.run.root / str(mode.report)).read_text()
    assert "vllm bench serve" in md and f"(#{SYNC_STEP_PR})" in md and "--no-async-scheduling" in md
