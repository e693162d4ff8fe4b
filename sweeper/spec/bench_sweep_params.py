"""`vllm bench sweep` parameter files as a matrix's axes: such a user's files run unchanged.

    vllm_bench_sweep:
      serve_params: serve_params.json   # what `vllm bench sweep serve --serve-params` takes
      bench_params: bench_params.json   # what `--bench-params` takes

vLLM's format (vllm/benchmarks/sweep/param_sweep.py; shared/VLLM.md): a file is a list of records,
or a dict `{name: record}` (the name is the record's `_benchmark_name`, names unique); each record
is one whole combination of parameters, never multiplied within a file. A key is a CLI option
without its dashes, `_` and `-` alike (`max_num_seqs` is `--max-num-seqs`); a dotted key sets one
field of a JSON option (`speculative_config.num_speculative_tokens`, only the part before the first
dot is respelled); `true`/`false` become `--flag`/`--no-flag` (dotted: `--a.b=true`); a mapping is
passed as JSON. A key a record leaves out keeps the base command's value. `vllm bench sweep serve`
runs every serve record × every bench record (`--link-vars` would drop pairs; not taken here).

How they become a matrix (`apply`, before the matrix is parsed, so every later step, `--dry-run`
included, sees ordinary axes):

* **serve records** → one `serve.--flag` axis per flag any record sets (booleans as the flag or its
  `--no-` form, each an axis of its own), each record's value or, where a record leaves the flag out,
  the matrix's own `serve:` value; then `exclude` rules for every combination of those values that
  is no record, so the cells' servers are exactly the records, times the matrix's other axes
  (commits, env, ...). Two records with the same parameters are one server (vLLM would start both).
* **bench records** → the load points of the matrix's `bench:` section: `max_concurrency` is a
  concurrency, `request_rate` a request rate (absent: all at once, vLLM's default), and the
  records must be every concurrency × every rate (the `bench:` section's load points are a product).
  The other keys vLLM's random dataset takes (`random_input_len`, `random_output_len`,
  `random_range_ratio`, `num_prompts`, `num_warmups`, `seed`, `burstiness`, `temperature`,
  `dataset_name: random`, `ignore_eos`) must be the same in every record and set the section's
  field; a key the sweeper's load generator has no meaning for is an error naming it.

Errors name the matrix file, the line of `vllm_bench_sweep` and the key (for a param file: the file
and the record).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.errors import ConfigError, clip
from sweeper.spec.yamlfile import Positions, read_text

SECTION = "vllm_bench_sweep"
NAME = "_benchmark_name"
MAX_RECORDS = 1000
MAX_PRODUCT = 10_000  # value combinations of the serve axes before the records' exclusions
MAX_EXCLUDES = 1000   # the matrix's own cap on exclude rules

# `vllm bench serve` options (as JSON keys) -> the `bench:` field they set, where the sweeper's load
# generator has that meaning. `ignore_eos` maps to nothing: the sweeper's random requests always
# generate exactly output_len tokens.
BENCH_FIELDS = {
    "random_input_len": "input_len", "random_output_len": "output_len", "random_range_ratio": "range_ratio",
    "num_prompts": "num_prompts", "num_warmups": "num_warmups", "seed": "seed", "burstiness": "burstiness",
    "temperature": "temperature",
}
LOAD_KEYS = ("max_concurrency", "request_rate")


@dataclass(frozen=True)
class Record:
    """One record of a param file: its name (vLLM's `_benchmark_name`, or its text) and parameters."""

    name: str
    params: Mapping[str, Any]


def read_records(path: str | Path) -> tuple[Record, ...]:
    """A param file as vLLM reads it: a list of records or a dict of named ones."""
    file = str(path)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc.msg}", file=file, line=exc.lineno) from None
    return records(data, file)


def records(data: Any, file: str) -> tuple[Record, ...]:
    if isinstance(data, dict):
        data = [{NAME: name, **(params if isinstance(params, dict) else {"": params})} for name, params in data.items()]
    if not isinstance(data, list):
        raise ConfigError(f"expected a list of records or a dict of named ones, got {type(data).__name__}", file=file)
    if len(data) > MAX_RECORDS:
        raise ConfigError(f"{len(data):,} records; at most {MAX_RECORDS:,}", file=file)
    out: list[Record] = []
    seen: set[str] = set()
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or "" in rec:
            raise ConfigError(f"expected a record (a mapping of parameters), got {clip(rec)}", file=file,
                              key=f"[{i}]")
        name = str(rec[NAME]) if NAME in rec else ""
        if name and name in seen:
            raise ConfigError(f"duplicate {NAME} {clip(name)}", file=file, key=f"[{i}]")
        seen.add(name)
        params = {str(k): v for k, v in rec.items() if k != NAME}
        out.append(Record(name or "-".join(f"{k}={v}" for k, v in params.items()), params))
    return tuple(out)


def flag_name(key: str) -> str:
    """The CLI option of a param key: `max_num_seqs` -> `--max-num-seqs`; only the part before the
    first dot is respelled (`speculative_config.num_speculative_tokens` -> `--speculative-config.num_speculative_tokens`)."""
    head, dot, rest = key.lstrip("-").partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def serve_flags(record: Record, file: str) -> dict[str, Any]:
    """A serve record as the matrix's serve flags: `true` is the bare flag, a mapping JSON."""
    out: dict[str, Any] = {}
    for key, value in record.params.items():
        if isinstance(value, bool) and "." not in key:
            flag, value = flag_name(key if value else "no-" + key.lstrip("-")), True
        elif isinstance(value, bool):
            flag, value = flag_name(key), "true" if value else "false"
        elif value is None or isinstance(value, list):
            raise ConfigError(f"expected a scalar, boolean or mapping, got {clip(value)}", file=file,
                              key=f"{record.name}.{key}")
        else:
            flag = flag_name(key)
        if flag in out:
            raise ConfigError(f"{flag} is set twice (its `_` and `-` spellings are the same option)",
                              file=file, key=f"{record.name}.{key}")
        out[flag] = value
    return out


def serve_axes(recs: Sequence[Record], base: Mapping[str, Any], file: str) -> tuple[list[tuple[str, list[Any]]], list[dict[str, Any]]]:
    """The `serve.--flag` axes and the exclude rules that leave exactly `recs`' servers (see the
    module docstring); `base`: the matrix's `serve:` flags, what a record that leaves a flag out keeps."""
    per = [serve_flags(r, file) for r in recs]
    flags = list(dict.fromkeys(f for p in per for f in p))
    rows = [tuple(p.get(f, base.get(f)) for f in flags) for p in per]
    values = [list(dict.fromkeys(_canon(row[i]) for row in rows)) for i in range(len(flags))]
    if not flags:
        return [], []
    product = math.prod(len(v) for v in values)
    if product > MAX_PRODUCT:
        raise ConfigError(f"the serve records' flags make {product:,} combinations to narrow down; at most "
                          f"{MAX_PRODUCT:,} (split the file)", file=file)
    wanted = {tuple(_canon(v) for v in row) for row in rows}
    excludes = [dict(zip((f"serve.{f}" for f in flags), map(json.loads, combo), strict=True))
                for combo in itertools.product(*values) if combo not in wanted]
    if len(excludes) > MAX_EXCLUDES:
        raise ConfigError(f"the serve records need {len(excludes):,} exclusions; at most {MAX_EXCLUDES:,} "
                          "(split the file)", file=file)
    axes = [(f"serve.{f}", [json.loads(v) for v in vals]) for f, vals in zip(flags, values, strict=True)]
    return axes, excludes


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def bench_fields(recs: Sequence[Record], file: str) -> dict[str, Any]:
    """The `bench:` fields the bench records set: `load` (every concurrency × every rate) and the
    fields every record shares (see the module docstring)."""
    shared: dict[str, tuple[str, Any]] = {}
    points: list[tuple[int | None, float]] = []
    for rec in recs:
        params = {k.lstrip("-").replace("-", "_"): v for k, v in rec.params.items()}
        for key, value in params.items():
            where = f"{rec.name}.{key}"
            if key in LOAD_KEYS:
                continue
            if key == "dataset_name":
                if value != "random":
                    raise ConfigError(f"the sweeper's load generator makes vLLM's random dataset only, got "
                                      f"{clip(value)}", file=file, key=where)
                continue
            if key == "ignore_eos":
                continue  # the sweeper's random requests always generate exactly output_len tokens
            if key not in BENCH_FIELDS:
                raise ConfigError(f"not a `vllm bench serve` option the sweeper's load generator takes; "
                                  f"known: {', '.join([*LOAD_KEYS, *BENCH_FIELDS, 'dataset_name', 'ignore_eos'])}",
                                  file=file, key=where)
            if key in shared and _canon(shared[key][1]) != _canon(value):
                raise ConfigError(f"differs between records ({clip(shared[key][1])} in {shared[key][0]}); the "
                                  "bench: section takes one value (split into matrices)", file=file, key=where)
            shared.setdefault(key, (rec.name, value))
        concurrency = params.get("max_concurrency")
        rate = params.get("request_rate", math.inf)
        rate = math.inf if isinstance(rate, str) and rate.strip().lower() in ("inf", "infinity") else rate
        points.append((concurrency, rate))
    out: dict[str, Any] = {BENCH_FIELDS[k]: v for k, (_, v) in shared.items()}
    if not points:
        return out
    concurrencies = list(dict.fromkeys(c for c, _ in points))
    rates = list(dict.fromkeys(r for _, r in points))
    if None in concurrencies and len(concurrencies) > 1:
        raise ConfigError("max_concurrency is set in some records and not in others; the bench: section's "
                          "load points are every concurrency × every rate", file=file, key="max_concurrency")
    if set(points) != set(itertools.product(concurrencies, rates)) or len(set(points)) != len(points):
        raise ConfigError("the records' (max_concurrency, request_rate) pairs are not every concurrency × every "
                          "rate, as the bench: section's load points are (split into matrices)", file=file)
    load: dict[str, Any] = {"request_rate": [r if r != math.inf else "inf" for r in rates]}
    if concurrencies != [None]:
        load["concurrency"] = concurrencies
    out["load"] = load
    return out


def apply(data: Any, pos: Positions, matrix_path: str) -> Any:
    """The matrix data with its `vllm_bench_sweep` section turned into axes, exclude rules and
    `bench:` fields (reads the two files, relative to the matrix); data without one, as it is."""
    if not isinstance(data, dict) or SECTION not in data:
        return data
    section = data[SECTION]
    where = (SECTION,)
    if not isinstance(section, dict) or not section or set(section) - {"serve_params", "bench_params"}:
        raise pos.error(where, "expected serve_params and/or bench_params: the JSON files "
                               "`vllm bench sweep serve` takes")
    out = {k: v for k, v in data.items() if k != SECTION}

    def read(key: str) -> tuple[tuple[Record, ...], str] | None:
        name = section.get(key)
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise pos.error((*where, key), f"expected a file name, got {clip(name)}")
        p = Path(name).expanduser()
        file = str(p if p.is_absolute() else Path(matrix_path).parent / p)
        return read_records(file), file

    serve = read("serve_params")
    if serve is not None:
        axes = dict(out.get("axes") or {})
        base = dict(out.get("serve") or {})
        new_axes, excludes = serve_axes(serve[0], base, serve[1])
        for name, values in new_axes:
            if name in axes:
                raise pos.error(("axes", name), f"also set by {SECTION}.serve_params: one place only")
            axes[name] = values
        out["axes"] = axes
        # A flag the records vary is an axis now; the matrix's own value is where records leave it out.
        out["serve"] = {k: v for k, v in base.items() if f"serve.{k}" not in axes}
        out["exclude"] = [*(out.get("exclude") or []), *excludes]
    bench = read("bench_params")
    if bench is not None:
        fields = bench_fields(bench[0], bench[1])
        section_bench = dict(out.get("bench") or {})
        for key, value in fields.items():
            if key in section_bench and _canon(section_bench[key]) != _canon(value):
                raise pos.error(("bench", key), f"also set by {SECTION}.bench_params ({clip(value)}): one place only")
            section_bench[key] = value
        out["bench"] = section_bench
    return out
