"""Every value is a value: the level each axis takes in each unit of evidence (a cell on one server
start), as explain reads it. Pure.

* A value the cell asked for is its level; where the cell's effective configuration differs from the
  request (`effective_differs`), the value that ran stands in and the level is marked substituted.
* `null` (the version's default) is a level of its own, `default`, resolved to the value that ran
  where the cells table records it (async scheduling left to its default, silently off for ngram).
* An axis missing from a cell (an `include` rule added it to other cells only, or an include-only
  cell lacks it) is the level `unset`: a confound made by include rules shows as two axes that never
  vary apart. Only the number of speculative tokens without a spec method is not applicable (None):
  the matrix collapses it there, so it only restates `spec_method=none`.
* Effective settings no axis asks for (async scheduling, the model runner, the attention backend)
  are dimensions of their own, named with " (effective)".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

COMMIT = "commit"
DEFAULT = "default"
UNSET = "unset"
EFFECTIVE_SUFFIX = " (effective)"
# Axis -> (the name `effective_differs` uses, the cell column of the effective value).
EFFECTIVE_OF = {
    "spec_method": ("spec_method", "effective_spec_method"),
    "num_speculative_tokens": ("num_speculative_tokens", "effective_num_speculative_tokens"),
    "async_scheduling": ("async_scheduling", "effective_async_scheduling"),
    "attention_backend": ("attention_backend", "effective_attention_backend"),
    "env.VLLM_USE_V2_MODEL_RUNNER": ("model_runner", "effective_model_runner"),
}
# Effective settings that are dimensions of their own when no axis asks for them.
EFFECTIVE_ONLY = {
    "async_scheduling": "effective_async_scheduling",
    "model_runner": "effective_model_runner",
    "attention_backend": "effective_attention_backend",
}


def value_text(value: Any) -> str | None:
    """An axis value as a term shows it; None for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def axes_map(raw: Any) -> dict[str, Any]:
    """A stored `axes` map (pairs or a dict of JSON texts) as axis -> value."""
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return {}
    pairs = raw.items() if isinstance(raw, dict) else raw
    return {str(k): json.loads(v) for k, v in pairs}


def level(values: Mapping[str, Any], axis: str) -> str | None:
    """The level of `axis` in a cell whose axis values are `values`."""
    if axis not in values:
        if axis == "num_speculative_tokens" and values.get("spec_method", "none") in (None, "none"):
            return None  # collapsed by the matrix: no speculation, no token count
        return UNSET
    text = value_text(values[axis])
    return DEFAULT if text is None else text


@dataclass
class Units:
    """One entry per unit of evidence: its cell, its server start, its commit, and its levels."""

    cell: list[str]
    start: list[str]
    commit: list[str]
    dims: dict[str, list[str | None]]  # dimension -> level per unit (the value that ran)
    requested: dict[str, list[str | None]]
    substituted: dict[str, list[bool]]


def units(keys: Sequence[tuple[str, str]], axes: Mapping[str, Mapping[str, Any]], commit: Mapping[str, str],
          effective: Mapping[str, Mapping[str, Any]]) -> Units:
    """The levels of every (cell, start) in `keys`; `axes` per cell, `effective` the cells-table row
    per cell (may be empty: requested values only)."""
    cells = [c for c, _ in keys]
    names = list(dict.fromkeys(k for c in dict.fromkeys(cells) for k in axes[c] if k != COMMIT))
    requested = {n: [level(axes[c], n) for c in cells] for n in names}
    dims = {n: list(v) for n, v in requested.items()}
    substituted = {n: [False] * len(cells) for n in names}
    for name in names:
        if name not in EFFECTIVE_OF:
            continue
        diff_name, column = EFFECTIVE_OF[name]
        for i, cid in enumerate(cells):
            row = effective.get(cid)
            value = value_text(row.get(column)) if row is not None else None
            if row is None or value is None:
                continue
            raw = row.get("effective_differs")
            differs = [] if raw is None else [str(x) for x in raw]
            if diff_name not in differs and requested[name][i] != DEFAULT:
                continue
            if name == "env.VLLM_USE_V2_MODEL_RUNNER":
                # Stated in the axis' own terms, so the term reads as the user's setting.
                value = {"V2": "1", "V1": "0"}.get(value, value)
            if value != requested[name][i]:
                dims[name][i], substituted[name][i] = value, True
    covered = {EFFECTIVE_OF[n][0] for n in names if n in EFFECTIVE_OF}
    for name, column in EFFECTIVE_ONLY.items():
        if name in covered or not effective:
            continue
        values = [value_text(effective[c].get(column)) if c in effective else None for c in cells]
        key = name + EFFECTIVE_SUFFIX
        dims[key], requested[key], substituted[key] = values, list(values), [False] * len(cells)
    return Units(cells, [s for _, s in keys], [commit[c] for c in cells], dims, requested, substituted)
