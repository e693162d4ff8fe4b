"""The simulator's performance model, measured the way a benchmark client measures a real vLLM.

Real simulator subprocesses on 127.0.0.1 (started and killed as in `test_sim.py`), HTTP, streamed
chunks timed by the client, and `/metrics` differences. Acceptance is counted, never timed, and its
draws are fixed by `SWEEP_SIM_START_SEED`: those tests are exact replays. The timing tests compare
ratios within one machine and hold their tolerances to a few per cent of seconds-long requests, so
that a loaded machine's late wake-ups (a few ms each, never summed: steps are paced to deadlines)
stay well inside them.
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_sim import FAST, MTP, Sim, run_sim, sim_server

from vllmsim import args, config, perf, tree
from vllmsim.behaviour import START_SEED_ENV

# --- helpers ------------------------------------------------------------------------------------


def scrape(sim: Sim) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{sim.url}/metrics", timeout=10).text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("model_name", "engine")))
            out[(sample.name, labels)] = sample.value
    return out


def delta(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


@dataclass
class Spec:
    """Spec-decode counters over a phase, from /metrics differences."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: list[float]

    @classmethod
    def between(cls, before: dict[Any, float], after: dict[Any, float], k: int) -> Spec:
        return cls(
            delta(before, after, "vllm:spec_decode_num_drafts_total"),
            delta(before, after, "vllm:spec_decode_num_draft_tokens_total"),
            delta(before, after, "vllm:spec_decode_num_accepted_tokens_total"),
            [delta(before, after, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
             for i in range(k)],
        )

    def conditional(self, position: int) -> tuple[float, float]:
        """Acceptance at `position` given the previous one was accepted, and the trials it rests on."""
        trials = self.drafts if position == 0 else self.per_pos[position - 1]
        return self.per_pos[position] / trials, trials


def z(observed: float, expected: float, trials: float) -> float:
    return (observed - expected) / math.sqrt(expected * (1 - expected) / trials)


@dataclass
class Timed:
    """One streamed request as `vllm bench serve` times it."""

    ttft: float
    e2el: float
    chunks: int
    tokens: int
    text: str
    sent: float = 0.0  # time.perf_counter() when it was sent

    @property
    def tpot(self) -> float:
        return (self.e2el - self.ttft) / (self.tokens - 1)


def streamed(body: dict[str, Any]) -> dict[str, Any]:
    """The body a streaming benchmark client sends (vLLM's `openai` backend)."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


def canonical(body: dict[str, Any]) -> str:
    """The server's identity of a request body (what its per-request draws are keyed by)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


@functools.cache
def client() -> httpx.Client:
    """One client for every request, as a benchmark client keeps one: a new httpx client builds an
    SSL context first, tens of milliseconds that would land in the TTFT."""
    return httpx.Client(timeout=60, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))


def stream_completion(sim: Sim, body: dict[str, Any]) -> Timed:
    ttft, last, chunks, tokens, text = 0.0, 0.0, 0, 0, ""
    http = client()
    sent = time.perf_counter()
    with http.stream("POST", f"{sim.url}/v1/completions", json=streamed(body)) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: "):])
            if data["choices"]:
                now = time.perf_counter()
                ttft = ttft or now - sent
                last = now - sent
                chunks += 1
                text += data["choices"][0]["text"]
            elif data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
    return Timed(ttft, last, chunks, tokens, text, sent)


def prompts(n: int, length: int = 32, salt: int = 0) -> list[list[int]]:
    """`n` distinct random-token prompts (as token ids: exactly `length` prompt tokens each)."""
    return [[1000 + (salt * 7919 + i * 131 + j * 17) % 150_000 for j in range(length)] for i in range(n)]


def load(sim: Sim, bodies: list[dict[str, Any]], concurrency: int) -> list[Timed]:
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda b: stream_completion(sim, b), bodies))


def _post_all(sim: Sim, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Every body at once, not streamed (the client does nothing until each answer is whole)."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        done = list(pool.map(lambda b: client().post(f"{sim.url}/v1/completions", json=b), bodies))
    assert all(r.status_code == 200 for r in done), [r.text for r in done]
    return done


def declared_for(sim_yaml: dict[str, Any], *flags: str, env: dict[str, str] | None = None) -> perf.Declared:
    """What the simulator declares for these `vllm serve` flags (the effective configuration's)."""
    t = tree.parse(sim_yaml)
    cfg = config.resolve(args.parse(["m", *flags], t.release), env or {}, t).config
    assert cfg is not None and t.perf is not None
    return perf.declare(t.perf, cfg.traits())


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("demo")
    out = run_sim(["make-repo", str(root / "repo"), "--json"], root)
    assert out.returncode == 0, out.stderr
    return root / "repo", json.loads(out.stdout)


def checkout(repo: Path, sha: str, where: Path) -> dict[str, str]:
    """A worktree of the history at `sha`, as the sweeper's sim install unpacks one."""
    if not where.exists():
        _git(repo, "worktree", "add", "-q", "--detach", str(where), sha)
    return {"SWEEP_SIM_TREE": str(where)}


PERF = {
    "version": "0.28.1",
    "startup_s": 0.0,
    "perf": {
        "prefill_s_per_token": 0.0,
        "decode_step_s": 0.0002,
        "acceptance": {"mtp": [0.9, 0.75, 0.6, 0.45]},
    },
}


# --- the sim.yaml schema ------------------------------------------------------------------------


def test_a_tree_without_perf_has_no_performance_model_and_one_with_it_parses_whole() -> None:
    assert tree.parse(FAST).perf is None
    t = tree.parse({**FAST, "perf": {
        "decode_step_s": 0.003, "attention_backends": {"TRITON_ATTN": 1.2}, "start_cv": 0.02,
        "acceptance": {"ngram": [0.5, 0.3]},
        "changes": [{"metric": "acceptance", "positions": [2, 3], "factor": 0.8,
                     "when": {"spec_method": "mtp", "model_runner": "V2"}},
                    {"id": "sync", "metric": "decode_step", "factor": 1.1, "when": {"async_scheduling": False}}],
    }})
    assert t.perf is not None
    first, second = t.perf.changes
    assert first.id == "acceptance-0" and first.positions == (2, 3) and first.when["spec_method"] == ("mtp",)
    assert second.id == "sync" and second.metric is tree.PerfMetric.DECODE_STEP
    assert second.when == {"async_scheduling": (False,)}
    assert t.perf.acceptance == {"ngram": (0.5, 0.3)} and t.perf.attention_backends == {"TRITON_ATTN": 1.2}


@pytest.mark.parametrize(("section", "named"), [
    ({"decode_step_s": -1}, r"perf\.decode_step_s: expected a non-negative number"),
    ({"decode_step_s": "fast"}, r"perf\.decode_step_s: expected a non-negative number"),
    ({"start_cv": 2}, r"perf\.start_cv: expected a fraction within \[0, 1\), got 2 \(write 0\.02 for 2 %\)"),
    ({"async_overlap": 1.0}, r"perf\.async_overlap: expected a fraction"),
    ({"speed": 1}, r"unknown keys perf\.speed; expected: "),
    ({"attention_backends": {"WARP_ATTN": 1.0}}, r"perf\.attention_backends\.WARP_ATTN: not an attention backend"),
    ({"attention_backends": {"FLASH_ATTN": 0}}, r"perf\.attention_backends\.FLASH_ATTN: expected a positive"),
    ({"acceptance": {"mtp": [0.9, 1.5]}}, r"perf\.acceptance\.mtp: expected a non-empty list of probabilities"),
    ({"acceptance": {"medusa2": [0.9]}}, r"perf\.acceptance\.medusa2: not a spec method"),
    ({"changes": [{"metric": "tpot", "factor": 1.1}]}, r"perf\.changes\[0\]\.metric: 'tpot' is not one of"),
    ({"changes": [{"metric": "decode_step"}]}, r"perf\.changes\[0\]\.factor: required"),
    ({"changes": [{"metric": "decode_step", "factor": "x"}]}, r"perf\.changes\[0\]\.factor: expected a positive"),
    ({"changes": [{"metric": "prefill", "factor": 2, "positions": [1]}]},
     r"perf\.changes\[0\]\.positions: only an acceptance change has draft positions"),
    ({"changes": [{"metric": "acceptance", "factor": 0.8, "positions": [-1]}]},
     r"perf\.changes\[0\]\.positions: expected a non-empty list of 0-based draft positions"),
    ({"changes": [{"metric": "acceptance", "factor": 0.8, "when": {"json_schema": True}}]},
     r"unknown keys perf\.changes\[0\]\.when\.json_schema; expected: "),
])
def test_a_bad_perf_section_is_one_line_naming_the_key(section: dict[str, Any], named: str) -> None:
    with pytest.raises(tree.TreeError, match=named) as caught:
        tree.parse({**FAST, "perf": section}, source="t/sim.yaml")
    assert str(caught.value).startswith("t/sim.yaml: ") and "\n" not in str(caught.value)


def test_declared_values_follow_backend_async_changes_and_the_effective_config() -> None:
    base = {**FAST, "version": "0.28.1", "perf": {
        "prefill_s_per_token": 0.0001, "decode_step_s": 0.004, "draft_s_per_token": 0.0002,
        "async_overlap": 0.1, "attention_backends": {"TRITON_ATTN": 1.25},
        "changes": [{"metric": "acceptance", "from_position": 2, "factor": 0.5,
                     "when": {"spec_method": "mtp", "model_runner": "V2"}},
                    {"metric": "decode_step", "factor": 1.1, "when": {"async_scheduling": False}}]}}
    mtp = declared_for(base, *MTP)
    assert mtp.acceptance == (0.9, 0.75, 0.3, 0.225)  # positions 2 and 3 halved under V2
    assert mtp.acceptance_length == pytest.approx(1 + 0.9 + 0.675 + 0.2025 + 0.2025 * 0.225)
    assert mtp.step_s() == pytest.approx(0.004 * 0.9 + 4 * 0.0002)
    v1 = declared_for(base, *MTP, env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert v1.acceptance == (0.9, 0.75, 0.6, 0.45)
    sync = declared_for(base, *MTP, "--no-async-scheduling")
    assert sync.step_s() == pytest.approx((0.004 + 4 * 0.0002) * 1.1)
    # ngram turns async scheduling off and falls back to V1: matched on the effective configuration.
    ngram = declared_for(base, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 6}')
    assert ngram.acceptance == pytest.approx((0.5, 0.35, 0.25, 0.18, 0.18 * 0.8, 0.18 * 0.64))
    assert ngram.step_s() == pytest.approx((0.004 + 6 * 0.0002) * 1.1)
    triton = declared_for(base, "--attention-backend", "TRITON_ATTN")
    assert triton.ttft_s(1000) == pytest.approx(0.125) and triton.step_s() == pytest.approx(0.0045)
    assert triton.tpot_s(100) == pytest.approx(0.0045) and triton.acceptance_length == 1.0


# --- acceptance, counted ------------------------------------------------------------------------


def test_acceptance_from_metrics_matches_the_declared_probabilities_and_paces_the_stream(tmp_path: Path) -> None:
    k, n, length = 5, 40, 200
    spec = ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": k})]
    declared = declared_for(PERF, *spec)
    assert len(declared.acceptance) == k  # the fifth position continues the list at 0.8 × 0.45
    bodies: list[dict[str, Any]] = [{"prompt": q[: 10 + i % 30], "max_tokens": length, "ignore_eos": True,
                                     "temperature": 0} for i, q in enumerate(prompts(n, 40))]
    with sim_server(tmp_path, *spec, sim_yaml=PERF, env={START_SEED_ENV: "acceptance"}) as sim:
        before = scrape(sim)
        timed = load(sim, bodies, concurrency=8)
        after = scrape(sim)
    s = Spec.between(before, after, k)
    assert s.draft_tokens == k * s.drafts and s.accepted == sum(s.per_pos)
    # Per position: the fraction of drafts accepted that far (binomial), and given the previous one.
    for i, expected in enumerate(declared.accepted_per_position):
        assert abs(z(s.per_pos[i] / s.drafts, expected, s.drafts)) < 4, (i, s)
        observed, trials = s.conditional(i)
        assert abs(z(observed, declared.acceptance[i], trials)) < 4, (i, observed, declared.acceptance[i])
    # The acceptance length (1 + accepted / drafts) within its standard error.
    dist = declared.tokens_per_step()
    var = sum(p * j * j for j, p in enumerate(dist)) - (declared.acceptance_length - 1) ** 2
    length_seen = 1 + s.accepted / s.drafts
    assert abs(length_seen - declared.acceptance_length) < 4 * math.sqrt(var / s.drafts), (length_seen, declared)
    # The counters are what paced the answers: each decode step is one streamed chunk after the first,
    # and emits 1 + its accepted drafts (the last step of a request may overshoot max_tokens, by k at most).
    assert sum(t.chunks - 1 for t in timed) == s.drafts
    assert 0 <= s.drafts + s.accepted - n * (length - 1) <= n * k
    assert [t.tokens for t in timed] == [length] * n
    assert delta(before, after, "vllm:generation_tokens_total") == n * length
    assert delta(before, after, "vllm:prompt_tokens_total") == sum(len(b["prompt"]) for b in bodies)
    assert delta(before, after, "vllm:request_success_total", finished_reason="length") == n
    assert after[("vllm:num_requests_running", ())] == 0 == after[("vllm:num_requests_waiting", ())]


def test_ignore_eos_and_min_tokens_give_exactly_the_tokens_asked_for(tmp_path: Path) -> None:
    chat = {"messages": [{"role": "user", "content": "write"}], "max_tokens": 300, "temperature": 0}
    text = {"prompt": "write", "max_tokens": 300, "temperature": 0}
    for sim_yaml in (FAST, PERF):  # unpaced and paced answers alike
        with sim_server(tmp_path, *MTP, sim_yaml=sim_yaml) as sim:
            natural = sim.chat(chat).json()
            exact = sim.chat({**chat, "ignore_eos": True}).json()
            floor = sim.chat({**chat, "min_tokens": 100}).json()
            capped = sim.chat({**chat, "min_tokens": 300}).json()
            streamed = stream_completion(sim, {**text, "ignore_eos": True})
            completion = httpx.post(f"{sim.url}/v1/completions", json={**text, "ignore_eos": True}).json()
            plain = httpx.post(f"{sim.url}/v1/completions", json={"prompt": [5, 6, 7, 8]}).json()
            refused = sim.chat({**chat, "min_tokens": 301})
        assert natural["choices"][0]["finish_reason"] == "stop" and natural["usage"]["completion_tokens"] <= 61
        assert exact["usage"]["completion_tokens"] == 300 and exact["choices"][0]["finish_reason"] == "length"
        # The natural answer's words come first: ignoring eos only carries on past it.
        assert exact["choices"][0]["message"]["content"].startswith(natural["choices"][0]["message"]["content"])
        assert floor["usage"]["completion_tokens"] == 101 and floor["choices"][0]["finish_reason"] == "stop"
        assert capped["usage"]["completion_tokens"] == 300 and capped["choices"][0]["finish_reason"] == "length"
        assert streamed.tokens == 300 and completion["usage"]["completion_tokens"] == 300
        assert completion["choices"][0]["finish_reason"] == "length"
        assert streamed.text == completion["choices"][0]["text"]
        # Prompt tokens: the ids sent, or the stand-in tokenizer's pieces; max_tokens 16 by default.
        assert plain["usage"]["prompt_tokens"] == 4 and plain["usage"]["completion_tokens"] <= 16
        assert completion["usage"]["prompt_tokens"] == 1
        assert refused.status_code == 400 and "min_tokens must be less than or equal to max_tokens" in refused.text


def test_ttft_is_queueing_plus_prefill_and_a_chunk_comes_every_step(tmp_path: Path) -> None:
    paced = {"version": "0.28.1", "startup_s": 0.0,
             "perf": {"prefill_s_per_token": 0.0002, "decode_step_s": 0.01}}
    bodies = [{"prompt": p, "max_tokens": 41, "ignore_eos": True, "temperature": 0} for p in prompts(4, 1000)]
    with sim_server(tmp_path, "--max-num-seqs", "2", sim_yaml=paced) as sim:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(stream_completion, sim, b) for b in bodies]
            seen = set()  # (running, waiting) while they run: two at a time, the others queued
            while not all(f.done() for f in futures):
                m = scrape(sim)
                seen.add((m[("vllm:num_requests_running", ())], m[("vllm:num_requests_waiting", ())]))
                time.sleep(0.01)
            timed = sorted((f.result() for f in futures), key=lambda t: t.ttft)
        after = scrape(sim)
    assert max(running for running, _ in seen) == 2 and max(waiting for _, waiting in seen) >= 1, seen
    assert after[("vllm:num_requests_running", ())] == 0
    prefill, decode = 1000 * 0.0002, 40 * 0.01
    # Sleeps are never early: lower bounds hold exactly; upper ones leave room for a loaded machine.
    for t in timed[:2]:
        assert prefill <= t.ttft < prefill + 0.15, t  # not two prefills (0.4 s), nor a decode in it
    first = min(t.sent for t in timed)
    for t in timed[2:]:  # queued until one of the first two finished, then its own prefill
        assert t.sent + t.ttft >= first + 2 * prefill + decode and t.ttft < 2 * prefill + decode + 0.2, t
    for t in timed:
        assert t.chunks == 41 and t.tokens == 41
        assert 0.8 * 0.01 < (t.e2el - t.ttft) / 40 < 1.3 * 0.01, t  # the mean ITL is one step


# --- the planted changes of sim:demo ------------------------------------------------------------


def _acceptance_at(tmp_path: Path, env: dict[str, str], n: int = 24) -> Spec:
    bodies = [{"prompt": p, "max_tokens": 180, "ignore_eos": True, "temperature": 0} for p in prompts(n)]
    with sim_server(tmp_path, *MTP, env={**env, START_SEED_ENV: "planted"}) as sim:
        before = scrape(sim)
        with ThreadPoolExecutor(12) as pool:
            done = list(pool.map(lambda b: client().post(f"{sim.url}/v1/completions", json=b), bodies))
        assert all(r.status_code == 200 for r in done)
        return Spec.between(before, scrape(sim), 4)


def test_planted_mtp_acceptance_drop_shows_only_with_v2_from_its_commit_on(
    demo: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    repo, plan = demo
    change = next(c for c in plan["perf_changes"] if c["id"] == "mtp-v2-acceptance")
    index = change["introduced"]["index"]
    assert change["metric"] == "acceptance" and change["factor"] == 0.8 and change["from_position"] == 2
    assert change["when"] == {"spec_method": ["mtp"], "model_runner": ["V2"]}
    assert plan["tag_indices"]["v0.28.0"] - 1 == index  # v0.28.0~1, in the middle of the history
    assert change["introduced"]["subject"].startswith("[Model Runner V2]")
    at = checkout(repo, plan["first_parent"][index], tmp_path / "at")
    before = checkout(repo, plan["first_parent"][index - 1], tmp_path / "before")
    base = yaml.safe_load((tmp_path / "before" / "sim.yaml").read_text())["perf"]["acceptance"]["mtp"]
    planted = [p * 0.8 if i >= 2 else p for i, p in enumerate(base)]
    v1 = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    for env, expected in ((at, planted), ({**at, **v1}, base), (before, base), ({**before, **v1}, base)):
        s = _acceptance_at(tmp_path, env)
        for i, p in enumerate(expected):
            observed, trials = s.conditional(i)
            assert abs(z(observed, p, trials)) < 4, (env, i, observed, p, trials)
        # Power: the drop at position 2 (0.6 → 0.48) is more than 6 standard errors of these counts.
        _, trials = s.conditional(2)
        assert 0.12 / math.sqrt(0.25 / trials) > 6


def _tpot(tmp_path: Path, env: dict[str, str], *flags: str) -> float:
    """Mean TPOT over two long requests, as the server timed them (its e2e and TTFT histograms): a
    loaded machine's client reading chunks late would squeeze or stretch its own timestamps."""
    n, length = 2, 800
    bodies = [{"prompt": p, "max_tokens": length, "ignore_eos": True, "temperature": 0} for p in prompts(n, salt=9)]
    with sim_server(tmp_path, *flags, env={**env, START_SEED_ENV: "tpot"}) as sim:
        before = scrape(sim)
        with ThreadPoolExecutor(n) as pool:
            done = list(pool.map(lambda b: client().post(f"{sim.url}/v1/completions", json=b), bodies))
        after = scrape(sim)
    assert all(r.json()["usage"]["completion_tokens"] == length for r in done)
    decode = (delta(before, after, "vllm:e2e_request_latency_seconds_sum")
              - delta(before, after, "vllm:time_to_first_token_seconds_sum"))
    return decode / (n * (length - 1))


def test_planted_decode_slowdown_shows_only_without_async_scheduling(
    demo: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    repo, plan = demo
    change = next(c for c in plan["perf_changes"] if c["id"] == "sync-decode-step")
    index = change["introduced"]["index"]
    assert (change["metric"], change["factor"], change["when"]) == ("decode_step", 1.1, {"async_scheduling": [False]})
    assert plan["tag_indices"]["v0.28.0"] < index < plan["commits"] - 1  # main~3, after v0.28.0
    at = checkout(repo, plan["first_parent"][index], tmp_path / "at")
    before = checkout(repo, plan["first_parent"][index - 1], tmp_path / "before")
    # The same start seed: both commits draw the same start and request factors, so the ratio of
    # their TPOTs is the declared change alone.
    sync = _tpot(tmp_path, at, "--no-async-scheduling") / _tpot(tmp_path, before, "--no-async-scheduling")
    overlapped = _tpot(tmp_path, at) / _tpot(tmp_path, before)
    assert 1.06 < sync < 1.14, sync
    assert 0.96 < overlapped < 1.04, overlapped


# --- variation between starts and between requests ----------------------------------------------

# Steps of 10 ms: ten requests at once wake a server a thousand times a second, which even a loaded
# machine keeps up with.
SPREAD = {"version": "0.28.1", "startup_s": 0.0,
          "perf": {"decode_step_s": 0.01, "start_cv": 0.25, "request_cv": 0.1}}
FACTOR_LINE = re.compile(
    r"\(EngineCore_DP0 pid=\d+\) INFO \d\d-\d\d [\d:]+ \[perf\.py:\d+\] Simulated performance: "
    r"times × (\d\.\d{6}) for this server start, drawn from LogNormal\(mean=1, cv=0\.25\)"
)


def test_start_and_request_factors_have_the_declared_spread() -> None:
    t = tree.parse(SPREAD)
    cfg = config.resolve(args.parse(["m"], t.release), {}, t).config
    assert t.perf is not None and cfg is not None
    starts = [perf.Performance(t.perf, cfg, nonce=str(i)) for i in range(4000)]
    factors = [s.start_factor for s in starts]
    assert abs(statistics.mean(factors) - 1) < 0.015 and abs(statistics.stdev(factors) - 0.25) < 0.015
    one = starts[0]
    requests = [one.request(f"body-{i}", 0).factor / one.start_factor for i in range(4000)]
    assert abs(statistics.mean(requests) - 1) < 0.01 and abs(statistics.stdev(requests) - 0.1) < 0.006
    # A start seed replays a start; the same body's repeats draw afresh.
    again = perf.Performance(t.perf, cfg, nonce="0")
    assert again.start_factor == one.start_factor
    assert again.request("b", 0).factor == one.request("b", 0).factor != one.request("b", 1).factor


def test_two_starts_differ_by_their_start_factor_and_requests_by_theirs(tmp_path: Path) -> None:
    t = tree.parse(SPREAD)
    cfg = config.resolve(args.parse(["m"], t.release), {}, t).config
    assert t.perf is not None and cfg is not None
    # Two start seeds whose factors lie far apart, so the starts' TPOTs must differ for sure.
    drawn = sorted((perf.Performance(t.perf, cfg, nonce=f"s{i}").start_factor, f"s{i}") for i in range(40))
    (slow_f, slow), (fast_f, fast) = drawn[-1], drawn[0]
    assert slow_f / fast_f > 1.4
    length = 150
    bodies = [{"prompt": p, "max_tokens": length, "ignore_eos": True, "temperature": 0}
              for p in prompts(10, salt=3)]
    means, logged = {}, {}
    for seed in (fast, slow):
        with sim_server(tmp_path, sim_yaml=SPREAD, env={START_SEED_ENV: seed}) as sim:
            tpots = [r.elapsed.total_seconds() / (length - 1) for r in _post_all(sim, bodies)]
            logged[seed] = float(FACTOR_LINE.findall(sim.log())[0])
        model = perf.Performance(t.perf, cfg, nonce=seed)
        expected = [model.request(canonical(b), 0).factor * 0.01 for b in bodies]
        # Each request's TPOT (no prefill here: its e2e latency over the tokens after the first) is
        # its own drawn factor's: the spread within a start is request_cv's. Sleeps are never early,
        # so a loaded machine only adds (a round trip, a late last wake-up: a few per cent at most).
        ratios = [seen / want for seen, want in zip(tpots, expected, strict=True)]
        assert 0.99 < statistics.mean(ratios) < 1.12, (seed, ratios)
        assert statistics.stdev(ratios) / statistics.mean(ratios) < 0.05, (seed, ratios)
        assert 0.04 < statistics.stdev(tpots) / statistics.mean(tpots) < 0.2
        means[seed] = statistics.mean(tpots)
    assert logged == {fast: pytest.approx(fast_f, abs=1e-6), slow: pytest.approx(slow_f, abs=1e-6)}
    # The two starts of one configuration differ as their drawn factors do (each matched its own above).
    assert means[slow] / means[fast] > 1.3


# --- without a perf section: today's timing -----------------------------------------------------


def test_without_perf_the_timing_is_token_latency_per_token(tmp_path: Path) -> None:
    legacy = {**FAST, "token_latency_s": 0.02}
    chat = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 15, "ignore_eos": True}
    with sim_server(tmp_path, *MTP, sim_yaml=legacy) as sim:
        before = scrape(sim)
        started = time.perf_counter()
        whole = sim.chat(chat).json()
        took = time.perf_counter() - started
        first: dict[str, float] = {}
        started = time.perf_counter()
        with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json={**chat, "stream": True}, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    delta_ = json.loads(line[6:])["choices"][0]["delta"]
                    first.setdefault("role" if "role" in delta_ else "content", time.perf_counter() - started)
        streamed_took = time.perf_counter() - started
        text = stream_completion(sim, {"prompt": "go", "max_tokens": 15, "ignore_eos": True})
        metrics = scrape(sim)
    assert whole["usage"]["completion_tokens"] == 15 and text.tokens == 15
    # Sleeps are never early: the client's times are bounded below; the server's own e2e latency
    # (free of the client's lag on a loaded machine) is bounded above too.
    for seconds in (took, streamed_took, text.e2el):
        assert seconds >= 15 * 0.02, (took, streamed_took, text)
    e2e = delta(before, metrics, "vllm:e2e_request_latency_seconds_sum") / 3
    assert 15 * 0.02 <= e2e < 15 * 0.02 + 0.1, e2e
    # As ever: the role chunk first, the first token a token_latency_s later at least, a chunk a token.
    assert first["role"] <= first["content"] and first["content"] >= 0.02 and text.chunks == 15
    # The counters are still drawn after the fact, per token, by the method's built-in acceptance.
    drafts = metrics[("vllm:spec_decode_num_drafts_total", ())]
    assert drafts + metrics[("vllm:spec_decode_num_accepted_tokens_total", ())] >= 45 > drafts > 0


def test_a_perf_section_changes_no_answer(demo: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    repo, plan = demo
    at = tmp_path / "culprit"
    checkout(repo, plan["culprit"]["sha"], at)
    without = yaml.safe_load((at / "sim.yaml").read_text())
    assert without.pop("perf")["changes"] == []
    json_ask = {"messages": [{"role": "user", "content": "list"}], "max_tokens": 60, "temperature": 0.6,
                "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {
                    "type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
                    "required": ["items"]}}}}
    asks = [json_ask] * 8 + [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True}]
    answers = []
    for env, sim_yaml in (({"SWEEP_SIM_TREE": str(at)}, None), ({}, without)):
        with sim_server(tmp_path, *MTP, sim_yaml=sim_yaml, env=env) as sim:
            answers.append([sim.chat(a).text if not a.get("stream") else _chat_text(sim, a) for a in asks])
            log = sim.log()
        assert "Failed to advance FSM" in log  # the culprit's FSM bug bites either way
    scrub = re.compile(r'"(id|created)": "?[\w-]+"?')
    paced, unpaced = ([scrub.sub("", a) for a in run] for run in answers)
    assert paced == unpaced


def _chat_text(sim: Sim, ask: dict[str, Any]) -> str:
    parts = []
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=ask, timeout=10) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    parts.append(choice["delta"].get("content") or "")
    return "".join(parts)
