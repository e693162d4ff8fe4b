"""The `bench:` section of a matrix: a load phase on every server start, measuring serving metrics.

Parsed once into typed, frozen objects (`BenchSpec`, `LoadPoint`); every bad value is one line
naming the file, line and key (`sweeper.spec.yamlfile.validate`). Pure: the loader's part (the
JSONL file read into its prompts) is `read_bench_files`.

    bench:
      dataset: random            # random (default) | suite | {jsonl: prompts.jsonl}
      input_len: 128             # random: prompt tokens (token ids sent as the prompt)
      output_len: 64             # random, jsonl: tokens generated (ignore_eos + min_tokens: exactly that)
      range_ratio: 0             # random: lengths uniform in [len·(1−r), len·(1+r)], as vLLM's
      load:                      # the load points: every concurrency × every request rate
        concurrency: [1, 8]      # requests in flight at most (vLLM's --max-concurrency)
        request_rate: [4, inf]   # requests/s, Poisson arrivals (gamma with `burstiness`), seeded
      burstiness: 1.0
      num_prompts: 100           # per load point
      num_warmups: 0             # per load point, before the /metrics scrape; never measured
      starts: 2                  # server starts per server key that run the bench (each a fresh server)
      seed: 0                    # prompts and arrivals
      after: replay              # replay: after the correctness replay on the first start; instead: no replay
      temperature: 0
      endpoint: completions      # completions (random, jsonl) | chat (suite: always)

Only `load` is required. Definitions follow `vllm bench serve` (see `sweeper.judge.metric_names`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pydantic

from sweeper.errors import clip
from sweeper.spec.yamlfile import PathKey, Positions, path_problem

MAX_PROMPTS = 1_000_000
MAX_LEN = 1_000_000
MAX_STARTS = 100
MAX_CONCURRENCY = 4096
MAX_RATE = 1e6
MAX_POINTS = 100
INF = math.inf

Count = Annotated[int, pydantic.Strict()]
Number = Annotated[float, pydantic.Strict(), pydantic.Field(allow_inf_nan=False)]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


def _as_list(value: Any) -> Any:
    """One value or a list of them: `concurrency: 8` is `concurrency: [8]`."""
    return value if isinstance(value, list) else [value]


def _rate(value: Any) -> float:
    """A request rate: a positive number of requests per second, or inf (all at once)."""
    if isinstance(value, str) and value.strip().lower() in ("inf", ".inf", "infinity"):
        return INF
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"expected a positive number of requests per second or inf, got {clip(value)}")
    if value == INF:
        return INF
    if not 0 < value <= MAX_RATE:
        raise ValueError(f"expected a positive number of requests per second (at most {MAX_RATE:g}) or inf, "
                         f"got {clip(value)}")
    return float(value)


def _concurrency(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(f"expected a whole number of requests in flight from 1 to {MAX_CONCURRENCY}, "
                         f"got {clip(value)}")
    return value


Rate = Annotated[float, pydantic.BeforeValidator(_rate)]
Concurrency = Annotated[int, pydantic.BeforeValidator(_concurrency)]


class Load(_Strict):
    """The load points: every `concurrency` with every `request_rate` (either alone is fine)."""

    concurrency: Annotated[tuple[Concurrency, ...], pydantic.BeforeValidator(_as_list)] = ()
    request_rate: Annotated[tuple[Rate, ...], pydantic.BeforeValidator(_as_list)] = ()


class JsonlPrompt(_Strict):
    """One line of a `jsonl:` dataset (vLLM's custom dataset): the prompt as text or token ids, and
    optionally its own number of output tokens."""

    prompt: str | tuple[Annotated[Count, pydantic.Field(ge=0)], ...]
    output_tokens: Annotated[Count, pydantic.Field(ge=1, le=MAX_LEN)] | None = None


class JsonlDataset(_Strict):
    """Prompts from a JSON Lines file. The loader reads the file into `prompts` (`read_bench_files`):
    workers get the prompts by value, never a path on the driver's disk."""

    jsonl: str = pydantic.Field(min_length=1)
    prompts: tuple[JsonlPrompt, ...] = ()


@dataclass(frozen=True)
class LoadPoint:
    """One load point: at most `concurrency` requests in flight (None: no limit), arriving at
    `request_rate` per second (inf: all at once) with gamma inter-arrival times of `burstiness`."""

    concurrency: int | None
    request_rate: float = INF
    burstiness: float = 1.0

    @property
    def point_id(self) -> str:
        """`concurrency=8`, `request_rate=4`, `concurrency=8,request_rate=4`: names the row."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency={self.concurrency}")
        if self.request_rate != INF or self.concurrency is None:
            parts.append(f"request_rate={self.request_rate:g}")
        return ",".join(parts)


class BenchSpec(_Strict):
    """The `bench:` section as written (see the module's docstring)."""

    dataset: Literal["random", "suite"] | JsonlDataset = "random"
    input_len: Annotated[Count, pydantic.Field(ge=1, le=MAX_LEN)] | None = None
    output_len: Annotated[Count, pydantic.Field(ge=1, le=MAX_LEN)] | None = None
    range_ratio: Annotated[Number, pydantic.Field(ge=0, lt=1)] = 0.0
    # Random token ids are drawn below this (default: the model folder's tokenizer, else 30,000).
    vocab_size: Annotated[Count, pydantic.Field(ge=2, le=10_000_000)] | None = None
    load: Load
    burstiness: Annotated[Number, pydantic.Field(gt=0, le=1000)] = 1.0
    num_prompts: Annotated[Count, pydantic.Field(ge=1, le=MAX_PROMPTS)] = 100
    num_warmups: Annotated[Count, pydantic.Field(ge=0, le=MAX_PROMPTS)] = 0
    starts: Annotated[Count, pydantic.Field(ge=1, le=MAX_STARTS)] = 2
    seed: Annotated[Count, pydantic.Field(ge=0, le=2**32 - 1)] = 0
    after: Literal["replay", "instead"] = "replay"
    temperature: Annotated[Number, pydantic.Field(ge=0, le=100)] = 0.0
    endpoint: Literal["completions", "chat"] | None = None

    @pydantic.field_validator("dataset", mode="before")
    @classmethod
    def _dataset(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("random", "suite"):
            raise ValueError(f"expected random, suite or {{jsonl: FILE}}, got {clip(value)}")
        return value

    @property
    def dataset_name(self) -> str:
        """`random`, `suite` or `jsonl:<file>`: the `dataset` column of the metrics table."""
        return f"jsonl:{self.dataset.jsonl}" if isinstance(self.dataset, JsonlDataset) else self.dataset

    @property
    def random(self) -> bool:
        return self.dataset == "random"

    @property
    def effective_input_len(self) -> int | None:
        return (self.input_len or DEFAULT_INPUT_LEN) if self.random else None

    @property
    def effective_output_len(self) -> int | None:
        if self.dataset == "suite":
            return None
        return self.output_len or DEFAULT_OUTPUT_LEN

    @property
    def effective_endpoint(self) -> Literal["completions", "chat"]:
        if self.endpoint is not None:
            return self.endpoint
        return "chat" if self.dataset == "suite" else "completions"

    def points(self) -> tuple[LoadPoint, ...]:
        """The load points, concurrency-major: every concurrency with every rate."""
        concurrencies: tuple[int | None, ...] = self.load.concurrency or (None,)
        rates = self.load.request_rate or (INF,)
        return tuple(LoadPoint(c, r, self.burstiness) for c in concurrencies for r in rates)

    def requests_per_point(self) -> int:
        """Requests one load point sends, warm-ups included."""
        return self.num_prompts + self.num_warmups


# vLLM's random dataset defaults (`--random-input-len`, `--random-output-len`).
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128


def check_bench(bench: BenchSpec | None, pos: Positions) -> None:
    """What the model alone cannot say: settings that belong to another dataset, an empty or too
    large set of load points, a duplicate load point."""
    if bench is None:
        return
    where: PathKey = ("bench",)
    if not bench.random:
        for key in ("input_len", "range_ratio", "vocab_size"):
            if key in bench.model_fields_set:
                raise pos.error((*where, key), f"only for dataset: random (this bench's dataset is "
                                               f"{bench.dataset_name})")
    if bench.dataset == "suite":
        if "output_len" in bench.model_fields_set:
            raise pos.error((*where, "output_len"), "not for dataset: suite (each case says its own max_tokens)")
        if bench.endpoint == "completions":
            raise pos.error((*where, "endpoint"), "dataset: suite sends chat requests: expected chat")
    if isinstance(bench.dataset, JsonlDataset):
        if problem := path_problem(bench.dataset.jsonl):
            raise pos.error((*where, "dataset", "jsonl"), f"{problem}; expected a JSON Lines file of prompts")
        if "prompts" in bench.dataset.model_fields_set:
            raise pos.error((*where, "dataset", "prompts"), "unknown key; expected one of: jsonl")
    if not bench.load.concurrency and not bench.load.request_rate:
        raise pos.error((*where, "load"), "expected concurrency: [N, ...] and/or request_rate: [R, ...]")
    for key in ("concurrency", "request_rate"):
        values = getattr(bench.load, key)
        for i, value in enumerate(values):
            if value in values[:i]:
                raise pos.error((*where, "load", key, i), f"duplicate load point {value:g}")
    if len(bench.points()) > MAX_POINTS:
        raise pos.error((*where, "load"), f"{len(bench.points())} load points; at most {MAX_POINTS}")


MAX_JSONL_PROMPTS = 1_000_000


def read_bench_files(bench: BenchSpec | None, pos: Positions, matrix_path: str) -> BenchSpec | None:
    """The loader's part: a `jsonl:` dataset's file read into its prompts (a name relative to the
    matrix's folder), each line checked; `bench` itself when it names no file."""
    if bench is None or not isinstance(bench.dataset, JsonlDataset):
        return bench
    from pathlib import Path

    from sweeper.errors import ConfigError
    from sweeper.spec.yamlfile import jsonl_lines, parse_json, read_text

    where: PathKey = ("bench", "dataset", "jsonl")
    path = Path(bench.dataset.jsonl).expanduser()
    path = path if path.is_absolute() else Path(matrix_path).parent / path
    try:
        text = read_text(path)
    except ConfigError as exc:
        raise pos.error(where, f"prompts file {path}: {exc.message}") from None
    prompts = []
    for number, line in jsonl_lines(text):
        data = parse_json(line, str(path), number)
        try:
            prompts.append(JsonlPrompt.model_validate(data))
        except pydantic.ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            key = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("str", "tuple"))) or "line"
            raise ConfigError(f"{key}: {err['msg']}; expected {{\"prompt\": text or token ids, "
                              "\"output_tokens\": N}", file=str(path), line=number) from None
        if len(prompts) > MAX_JSONL_PROMPTS:
            raise ConfigError(f"more than {MAX_JSONL_PROMPTS:,} prompts", file=str(path), line=number)
    if not prompts:
        raise pos.error(where, f"prompts file {path} holds no prompts")
    dataset = bench.dataset.model_copy(update={"prompts": tuple(prompts)})
    return bench.model_copy(update={"dataset": dataset})
