"""The bench phase of a server group: every load point of every cell on a server start, as metrics rows.

The runner calls `run_start` on each start that benches (the first, after or instead of the replay;
then `starts − 1` fresh starts of the same server, `run_more_starts`). Per cell and load point: the
prompts (`prompts_for`), a /metrics scrape after the warm-ups and one after the measured requests,
the load generator (`sweeper.execute.load`), and the figures (`sweeper.judge.serving`). A start or a
load point that cannot be trusted (the server stalled, crashed, failed requests, its /metrics went
missing or backwards, or it never started) is rows with `valid=false` and the reason: never a silent
number, and never at the cost of the cell's other results.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from sweeper.errors import ServerError
from sweeper.execute import server_metrics
from sweeper.execute.load import CHAT, COMPLETIONS, Pace, PhaseOutcome, Prompt, run_load_sync
from sweeper.judge import serving
from sweeper.judge.verdict import NO_TRACEBACK
from sweeper.spec.bench import BenchSpec, JsonlDataset, LoadPoint
from sweeper.spec.matrix import Cell, canonical
from sweeper.spec.suite import Suite, expand
from sweeper.vllm import crash

# After a load point with failed requests: how long a server is given to exit (a dead engine's API server
# answers 500, then exits: its reason is the exit, not the failures).
EXIT_GRACE_S = 3.0
# Random token ids are drawn below this when neither the bench nor the model's folder says the vocabulary.
DEFAULT_VOCAB = 30_000
# Words for random prompts sent as text (a chat endpoint takes no token ids).
_WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
          "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week",
          "company", "system", "program", "question", "work", "government", "number", "night", "point", "home",
          "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book",
          "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend",
          "father", "power", "hour", "game", "line", "end", "member", "law")


@dataclass(frozen=True)
class StartInfo:
    """One server start that benches: its index among the server key's starts, its seconds to
    healthy, and what the rows of every cell share."""

    start: int
    startup_s: float | None
    common: Callable[[Cell], Mapping[str, Any]]  # the cell's identity columns (the runner's)
    version: str | None = None


@dataclass(frozen=True)
class Target:
    """The server a start benches and what every request of it needs: its URL and key, the model name
    requests carry, the suite (for `dataset: suite`), the request timeout, whether its process is
    alive, and the group's deadline (a `time.monotonic()` value, or None)."""

    base_url: str
    api_key: str
    model: str
    suite: Suite | None
    timeout_s: float
    alive: Callable[[], bool]
    deadline: float | None = None
    # The model's folder when it is one (the matrix's `model`): random token ids stay inside its tokenizer.
    model_dir: str | None = None
    # The server's log so far: an invalid load point whose engine died names vLLM's root cause.
    log_text: Callable[[], str] | None = None


@dataclass
class BenchRows:
    """What the bench phases of a group measured: metrics rows, and the seconds they took."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0  # load phases only (the extra starts' start-up is in `start_s`)
    start_s: float = 0.0  # seconds the extra starts took to become healthy
    starts: int = 0  # extra starts made


# --- datasets -----------------------------------------------------------------------------------

def token_space(model: str, vocab_size: int | None) -> tuple[int, frozenset[int]]:
    """Token ids random prompts are drawn below, and the ones never drawn (special tokens): the
    bench's `vocab_size`, else the model folder's tokenizer (its vocabulary less its added tokens),
    else its config's `vocab_size`, else DEFAULT_VOCAB."""
    if vocab_size is not None:
        return vocab_size, frozenset()
    folder = Path(model).expanduser()
    try:
        data = json.loads((folder / "tokenizer.json").read_text())
        vocab = data.get("model", {}).get("vocab", {})
        added = frozenset(int(t["id"]) for t in data.get("added_tokens", []) if "id" in t)
        if vocab:
            return len(vocab), added
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    try:
        size = json.loads((folder / "config.json").read_text()).get("vocab_size")
        if isinstance(size, int) and size > 1:
            return size, frozenset()
    except (OSError, ValueError, AttributeError):
        pass
    return DEFAULT_VOCAB, frozenset()


def random_token_prompts(n: int, *, input_len: int, output_len: int, range_ratio: float, vocab: int,
                         excluded: frozenset[int], seed: int) -> list[tuple[list[int], int]]:
    """(token ids, output length) of `n` random prompts, as vLLM's random dataset makes them: lengths
    uniform in [⌊len·(1−r)⌋, ⌈len·(1+r)⌉] (outputs at least 1), each prompt a run of consecutive
    allowed ids from a random offset. Seeded: the same seed gives the same prompts."""
    rng = np.random.default_rng(seed)
    allowed = np.array([t for t in range(vocab) if t not in excluded], dtype=np.int64)

    def lengths(mean: int, minimum: int) -> np.ndarray:
        low = max(minimum, int(np.floor(mean * (1 - range_ratio))))
        high = max(low, int(np.ceil(mean * (1 + range_ratio))))
        return rng.integers(low, high + 1, size=n)

    ins, outs = lengths(input_len, 1), lengths(output_len, 1)
    offsets = rng.integers(0, vocab, size=n)
    return [((allowed[(offsets[i] + i + np.arange(ins[i])) % len(allowed)]).tolist(), int(outs[i]))
            for i in range(n)]


def _as_text(ids: Sequence[int]) -> str:
    return " ".join(_WORDS[t % len(_WORDS)] for t in ids)


def prompts_for(bench: BenchSpec, cell: Cell, *, model: str, suite: Suite | None,
                model_dir: str | None = None) -> list[Prompt]:
    """The `num_prompts` requests of one cell's load point: the cell's request fields over the
    dataset's bodies (the same prompts for every start and load point: the seed decides them).
    `model` is the name requests carry; `model_dir` the folder whose tokenizer bounds random ids
    (default: `model`, when it names a folder)."""
    endpoint = CHAT if bench.effective_endpoint == "chat" else COMPLETIONS
    fixed: dict[str, Any] = {"temperature": bench.temperature}
    if bench.dataset == "suite":
        pairs = list(expand(suite, 1)) if suite is not None else []
        if not pairs:
            raise ValueError("dataset: suite, but the suite has no cases")
        bodies: list[tuple[dict[str, Any], int | None, int | None]] = [
            (pairs[i % len(pairs)][0].request(model), None, None) for i in range(bench.num_prompts)]
        fixed = {}  # a suite's cases are sent as they are, less streaming (set by the load generator)
    elif isinstance(bench.dataset, JsonlDataset):
        lines = bench.dataset.prompts
        bodies = []
        for i in range(bench.num_prompts):
            line = lines[i % len(lines)]
            out = line.output_tokens or bench.effective_output_len or 1
            prompt: Any = line.prompt if isinstance(line.prompt, str) else list(line.prompt)
            bodies.append((_body(endpoint, model, prompt, out), None if isinstance(prompt, str) else len(prompt), out))
    else:
        vocab, excluded = token_space(model_dir or model, bench.vocab_size)
        made = random_token_prompts(bench.num_prompts, input_len=bench.effective_input_len or 1,
                                    output_len=bench.effective_output_len or 1, range_ratio=bench.range_ratio,
                                    vocab=vocab, excluded=excluded, seed=bench.seed)
        bodies = [(_body(endpoint, model, ids if endpoint == COMPLETIONS else _as_text(ids), out), len(ids), out)
                  for ids, out in made]
    out_prompts = []
    for body, prompt_len, output_len in bodies:
        merged = {**body, **fixed}
        for key, value in cell.request.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        merged.pop("stream", None)
        merged.pop("stream_options", None)
        out_prompts.append(Prompt(endpoint, merged, prompt_len, output_len))
    return out_prompts


def _body(endpoint: str, model: str, prompt: Any, output_len: int) -> dict[str, Any]:
    """A request that generates exactly `output_len` tokens (ignore_eos, min_tokens)."""
    body: dict[str, Any] = {"model": model}
    if endpoint == COMPLETIONS:
        body["prompt"] = prompt
        body["max_tokens"] = output_len
    else:
        body["messages"] = [{"role": "user", "content": prompt if isinstance(prompt, str) else _as_text(prompt)}]
        body["max_completion_tokens"] = output_len
    body["min_tokens"] = output_len
    body["ignore_eos"] = True
    return body


# --- one start ------------------------------------------------------------------------------------

def _point_columns(bench: BenchSpec, point: LoadPoint) -> dict[str, Any]:
    return {
        "load_point": point.point_id, "concurrency": point.concurrency, "request_rate": point.request_rate,
        "burstiness": point.burstiness, "dataset": bench.dataset_name, "endpoint": bench.effective_endpoint,
        "input_len": bench.effective_input_len, "output_len": bench.effective_output_len,
        "num_prompts": bench.num_prompts, "num_warmups": bench.num_warmups, "seed": bench.seed,
        "temperature": bench.temperature if bench.dataset != "suite" else None,
    }


def invalid_rows(bench: BenchSpec, cells: Sequence[Cell], info: StartInfo, reason: str) -> list[dict[str, Any]]:
    """Rows of a start whose load phase never ran (the server never started, or was already gone):
    every cell and load point, `valid` false with the reason."""
    return [_invalid_row(bench, cell, point, info, reason) for cell in cells for point in bench.points()]


def _invalid_row(bench: BenchSpec, cell: Cell, point: LoadPoint, info: StartInfo, reason: str) -> dict[str, Any]:
    return {**info.common(cell), "vllm_version": info.version, "start": info.start, "startup_s": info.startup_s,
            **_point_columns(bench, point), "valid": False, "invalid_reason": reason}


def run_start(bench: BenchSpec, cells: Sequence[Cell], info: StartInfo, target: Target) -> list[dict[str, Any]]:
    """Every load point of every cell on one healthy server start, in that order. After a load point
    whose server stalled, the start's other load points are not run (its stuck requests hold the
    server: each would wait out the timeout too): their rows say so."""
    rows: list[dict[str, Any]] = []
    stalled: str | None = None
    for cell in cells:
        try:
            prompts = prompts_for(bench, cell, model=target.model, suite=target.suite, model_dir=target.model_dir)
        except ValueError as exc:
            rows += invalid_rows(bench, [cell], info, f"no prompts: {exc}")
            continue
        for point in bench.points():
            if stalled is not None or not target.alive():
                why = stalled or "the server was gone before this load point"
                rows.append(_invalid_row(bench, cell, point, info, why))
                continue
            rows.append(_point(bench, cell, point, prompts, info, target))
            if str(rows[-1]["invalid_reason"] or "").startswith(STALLED):
                stalled = f"not run: the server stalled at {point.point_id} of {cell.cell_id}"
    return rows


STALLED = "the load phase stopped early: stalled"


def _point(bench: BenchSpec, cell: Cell, point: LoadPoint, prompts: Sequence[Prompt], info: StartInfo,
           target: Target) -> dict[str, Any]:
    scrapes: dict[str, server_metrics.Scrape] = {}

    def before() -> None:
        scrapes["before"] = server_metrics.try_scrape(target.base_url, target.api_key)

    pace = Pace(point.concurrency, point.request_rate, point.burstiness, bench.seed, bench.num_warmups,
                target.timeout_s)
    outcome: PhaseOutcome = run_load_sync(target.base_url, prompts, pace, api_key=target.api_key,
                                          alive=target.alive, deadline=target.deadline, after_warmup=before)
    if any(not r.ok for r in outcome.records):
        _exits_soon(target)  # an engine that died answers 500 and exits a moment later: say it exited
    still_alive = target.alive()
    after = (server_metrics.try_scrape(target.base_url, target.api_key) if still_alive
             else server_metrics.Scrape(None, "the server is gone"))
    spec, problem = _spec_decode(scrapes.get("before"), after, expected=cell.spec_method != "none")
    reason = serving.judge_phase(outcome.records, stopped=outcome.stopped, alive=still_alive,
                                 metrics_problem=problem)
    if reason is not None and target.log_text is not None:
        reason = _with_root_cause(reason, target.log_text())
    return {
        **info.common(cell), "vllm_version": info.version, "start": info.start, "startup_s": info.startup_s,
        **_point_columns(bench, point), "warmups_failed": outcome.warmups_failed,
        "started_at": datetime.fromtimestamp(outcome.started_at, UTC),
        "valid": reason is None, "invalid_reason": reason,
        **serving.figures(outcome.records, outcome.duration, outcome.t0), **spec,
    }


def _with_root_cause(reason: str, log_text: str) -> str:
    """The reason, with the engine's root cause when the log says the engine died (a crash repeated
    with one cause is the release's, which a metric bisect counts as untestable)."""
    if not crash.engine_died(log_text):
        return reason
    cause = crash.root_cause(log_text)
    return serving.with_crash(reason, cause.signature if cause is not None else NO_TRACEBACK)


def _exits_soon(target: Target) -> None:
    """Wait up to EXIT_GRACE_S for a server that failed requests to exit (vLLM's API server shuts down
    once its engine core is gone)."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while target.alive() and time.monotonic() < deadline:
        time.sleep(0.05)


def _spec_decode(before: server_metrics.Scrape | None, after: server_metrics.Scrape,
                 *, expected: bool) -> tuple[dict[str, Any], str | None]:
    texts = []
    for when, scrape in (("before", before), ("after", after)):
        if scrape is None or scrape.text is None:
            why = scrape.error if scrape is not None else "not taken"
            return dict.fromkeys(serving.SPEC_COLUMNS), f"/metrics could not be read {when} the load point: {why}"
        texts.append(scrape.text)
    try:
        result = serving.spec_decode(server_metrics.parse(texts[0]), server_metrics.parse(texts[1]),
                                     expected=expected)
    except ValueError as exc:
        return dict.fromkeys(serving.SPEC_COLUMNS), f"/metrics is not Prometheus text: {exc}"[:300]
    return dict(result.columns), result.problem


# --- the extra starts -----------------------------------------------------------------------------

def run_more_starts(bench: BenchSpec, cells: Sequence[Cell], server: Any, target: Target, *, first: int,
                    common: Callable[[Cell], Mapping[str, Any]], version: str | None) -> BenchRows:
    """Starts `first` to `bench.starts − 1` of the group's server (a `ServerProcess`, stopped): each a
    fresh start of the same command that only benches (`target`'s URL and liveness are the server's
    own). A start that fails is its rows, invalid with the reason; the next start is still tried."""
    out = BenchRows()
    for start in range(first, bench.starts):
        if target.deadline is not None and time.monotonic() >= target.deadline:
            info = StartInfo(start, None, common, version)
            out.rows += invalid_rows(bench, cells, info, "timeouts.group_s ran out before this start")
            continue
        t = time.monotonic()
        try:
            with server:
                out.starts += 1
                out.start_s += server.startup_s or 0.0
                info = StartInfo(start, server.startup_s, common, version)
                t_load = time.monotonic()
                here = dataclasses.replace(target, base_url=server.base_url, alive=server.alive,
                                           log_text=server.log_text)
                out.rows += run_start(bench, cells, info, here)
                out.seconds += time.monotonic() - t_load
        except ServerError as exc:
            out.starts += 1
            out.start_s += time.monotonic() - t
            info = StartInfo(start, None, common, version)
            out.rows += invalid_rows(bench, cells, info, f"the server did not start: {exc}"[:500])
    return out


def axes_of(cell: Cell) -> list[tuple[str, str]]:
    """The `axes` column as the samples and cells tables encode it."""
    return [(k, canonical(v)) for k, v in cell.values.items()]
