"""Replay suites: the requests a sweep sends to every cell, with the checks that judge each answer.

A suite is a YAML file; it is parsed once into frozen `Suite`/`Case` objects (request bodies stay
JSON, the rest is typed). Every mistake becomes one `ConfigError` line: `file:line: key: what`.

Format (paths are relative to the suite file)::

    name: structured-output          # optional, default: the file name; letters, digits, . _ -
    description: Replays of …        # optional
    defaults:                        # optional; applies to every case and JSONL line
      repeat: 3                      # times each case is sent (default 1)
      checks: [http_ok, {finish_reason: {expected: stop}}, json_schema]   # default [http_ok]
      body: {max_tokens: 256, temperature: 0}   # merged under each body (shallow: the case wins)
    cases:
      - id: invoice-json             # unique in the suite; letters, digits, . _ -
        body:                        # an OpenAI chat-completions body, without `model`
          messages: [{role: user, content: "…"}]
        schema_file: schemas/x.json  # optional: sets body.response_format to a json_schema request
                                     #   for this schema (name: the file's stem)
        tools:                       # optional: builds body.tools from parameter-schema files
          - {name: calculate_area, description: "…", parameters_file: schemas/y.json}
        repeat: 5                    # optional, else defaults.repeat
        checks: [...]                # optional: replaces defaults.checks
        extra_checks: [...]          # optional: appended to the checks
    jsonl:                           # optional: request bodies as logged in production
      - file: prod.jsonl             # one chat-completions body per line; `model` is dropped
        id_prefix: prod              # case ids are <id_prefix>-<line>; default: the file's stem
        repeat: 1                    # optional, else defaults.repeat
        checks: [...]                # optional, else defaults.checks
        extra_checks: [...]          # optional

Top-level keys starting with `x-` are ignored: define YAML anchors there (`x-tool-checks: &tc [...]`)
and reuse them (`checks: *tc`).

A check is written as its name (`json_valid`) or as a one-key mapping to its parameters
(`{log_absent: {pattern: "Failed to advance FSM"}}`); `sweeper.spec.checks.CHECKS` lists them.
A check that can never apply to a case's request (json_schema without a schema,
tool_calls_valid without tools) is an error at load time.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from sweeper.errors import ConfigError, clip
from sweeper.spec import checks as checks_mod
from sweeper.spec.checks import CheckSpec
from sweeper.spec.yamlfile import (
    PathKey,
    Positions,
    dotted,
    jsonl_lines,
    load,
    parse_json,
    read_text,
    validate,
)

_SLUG = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_ID_CHARS = 128
MAX_REPEAT = 1_000_000


@dataclass(frozen=True)
class Case:
    """One request of a suite. `body` is JSON without `model`; treat it as read-only."""

    case_id: str
    body: Mapping[str, Any]
    repeat: int
    checks: tuple[CheckSpec, ...]
    source: str  # "file:line" it came from

    def request(self, model: str) -> dict[str, Any]:
        """The body to send to a server that serves `model` (a fresh copy, safe to modify)."""
        return {"model": model, **copy.deepcopy(dict(self.body))}


@dataclass(frozen=True)
class Suite:
    name: str
    path: str
    cases: tuple[Case, ...]
    digest: str  # sha256 over ids, bodies, repeats and checks: stored results are reused only if equal


def expand(suite: Suite, repeats_multiplier: int = 1) -> list[tuple[Case, int]]:
    """Every (case, repeat index) to send, repeat-major: the repeats of one case are spread over the
    run rather than sent back to back, so one transient server state does not judge them all."""
    if repeats_multiplier < 1:
        raise ValueError(f"repeats_multiplier must be >= 1, got {repeats_multiplier}")
    rounds = max((c.repeat for c in suite.cases), default=0) * repeats_multiplier
    return [(case, r) for r in range(rounds) for case in suite.cases if r < case.repeat * repeats_multiplier]


# ---------------------------------------------------------------- YAML shape

class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


class _Defaults(_Strict):
    repeat: int = pydantic.Field(1, ge=1, le=MAX_REPEAT)
    checks: list[Any] = ["http_ok"]
    body: dict[str, Any] = {}


class _Tool(_Strict):
    name: str = pydantic.Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters_file: str


class _CaseIn(_Strict):
    id: str = pydantic.Field(pattern=_SLUG, max_length=MAX_ID_CHARS)
    body: dict[str, Any] = {}  # a missing body is reported as missing body.messages
    schema_file: str | None = None
    tools: list[_Tool] | None = None
    repeat: int | None = pydantic.Field(None, ge=1, le=MAX_REPEAT)
    checks: list[Any] | None = None
    extra_checks: list[Any] = []


class _JsonlIn(_Strict):
    file: str
    id_prefix: str | None = pydantic.Field(None, pattern=_SLUG, max_length=MAX_ID_CHARS)
    repeat: int | None = pydantic.Field(None, ge=1, le=MAX_REPEAT)
    checks: list[Any] | None = None
    extra_checks: list[Any] = []


class _SuiteIn(_Strict):
    name: str | None = pydantic.Field(None, pattern=_SLUG, max_length=MAX_ID_CHARS)
    description: str = ""
    defaults: _Defaults | None = None
    cases: list[_CaseIn] = []
    jsonl: list[_JsonlIn] = []


# ---------------------------------------------------------------- loading

def load_suite(path: str | Path) -> Suite:
    """Parse and validate a suite file and the files it references."""
    data, pos = load(path)
    if data is None:
        raise ConfigError("empty file; expected a suite mapping with `cases:` or `jsonl:`", file=str(path))
    if not isinstance(data, dict):
        # Only its kind: the file may be anything (`/etc/passwd`), and its contents are not ours to print.
        kind = "a list" if isinstance(data, list) else "a single value"
        raise ConfigError(f"expected a suite mapping with `cases:` or `jsonl:`, got {kind}", file=str(path), line=1)
    # Top-level `x-…` keys are ignored: a place to define YAML anchors (`&tool_checks`) for reuse.
    data = {k: v for k, v in data.items() if not k.startswith("x-")}
    raw = validate(_SuiteIn, data, pos)
    defaults = raw.defaults or _Defaults.model_validate({})
    loader = _Loader(Path(path), pos)
    default_checks = loader.checks(defaults.checks, ("defaults", "checks"))
    loader.check_body(defaults.body, ("defaults", "body"), partial=True)

    cases: list[Case] = []
    for i, c in enumerate(raw.cases):
        cases.append(loader.yaml_case(c, ("cases", i), defaults, default_checks))
    for i, j in enumerate(raw.jsonl):
        cases.extend(loader.jsonl_cases(j, ("jsonl", i), defaults, default_checks))
    if not cases:
        raise pos.error((), "the suite has no cases; expected `cases:` or `jsonl:` entries")

    seen: dict[str, str] = {}
    for case in cases:
        if case.case_id in seen:
            file, _, line = case.source.rpartition(":")
            raise ConfigError(f"duplicate case id {case.case_id!r} (first at {seen[case.case_id]})",
                              file=file, line=int(line), key="id")
        seen[case.case_id] = case.source
    return Suite(name=raw.name or _stem_slug(Path(path)), path=str(path), cases=tuple(cases),
                 digest=_digest(cases))


def _digest(cases: list[Case]) -> str:
    content = [{"id": c.case_id, "body": c.body, "repeat": c.repeat, "checks": [s.as_json() for s in c.checks]}
               for c in cases]
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _not_finite(body: Any) -> str | None:
    """The top-level field of `body` holding an infinite or NaN float, if any (YAML has them, JSON not)."""
    for field, value in body.items():
        todo = [value]
        while todo:
            item = todo.pop()
            if isinstance(item, float) and not math.isfinite(item):
                return str(field)
            if isinstance(item, dict):
                todo.extend(item.values())
            elif isinstance(item, list):
                todo.extend(item)
    return None


def _stem_slug(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", path.stem).strip("-._") or "suite"


class _Loader:
    """Turns validated YAML pieces into cases; knows the suite file for positions and relative paths."""

    def __init__(self, path: Path, pos: Positions) -> None:
        self.path, self.pos = path, pos
        self._json_cache: dict[Path, Any] = {}

    def where(self, key: PathKey) -> str:
        return f"{self.pos.file}:{self.pos.line(key)}"

    def checks(self, entries: list[Any], key: PathKey) -> tuple[CheckSpec, ...]:
        out = []
        for j, entry in enumerate(entries):
            if isinstance(entry, str):
                name, params = entry, None
            elif isinstance(entry, dict) and len(entry) == 1:
                name, params = next(iter(entry.items()))
            else:
                raise self.pos.error((*key, j), f"expected a check name or {{name: {{param: value}}}}, got "
                                                f"{clip(entry)}")
            try:
                out.append(checks_mod.parse_spec(name, params))
            except ValueError as exc:
                raise self.pos.error((*key, j), str(exc)) from None
        return tuple(out)

    def check_body(self, body: Mapping[str, Any], key: PathKey, *, partial: bool = False,
                   jsonl_file: str | None = None, jsonl_line: int | None = None) -> None:
        """Reject what a request body must not carry; `partial` bodies (defaults) need no messages."""
        def fail(sub: str, message: str) -> ConfigError:
            if jsonl_file is not None:
                return ConfigError(message, file=jsonl_file, line=jsonl_line, key=sub)
            return self.pos.error((*key, sub), message)

        if "model" in body and jsonl_file is None:
            raise fail("model", "not allowed in a suite; the runner sets the model of each matrix cell")
        if where := _not_finite(body):
            raise fail(where, "expected a finite number (JSON has no .inf or .nan)")
        if not partial:
            messages = body.get("messages")
            if messages is None:
                raise fail("messages", "required key is missing")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise fail("messages", "expected a non-empty list of message objects")
        schema = checks_mod.request_schema(body)
        if schema is not None and (problem := checks_mod.schema_problem(schema)):
            raise fail("response_format", f"json_schema.schema is not a valid JSON schema: {problem}")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise fail("tools", f"expected a list of tools, got {clip(tools)}")
        for name, params in checks_mod.request_tools(body).items():
            if params is not None and (problem := checks_mod.schema_problem(params)):
                raise fail("tools", f"parameters of tool {name!r} are not a valid JSON schema: {problem}")

    def applicable(self, specs: tuple[CheckSpec, ...], body: Mapping[str, Any], fail: Any) -> None:
        for spec in specs:
            problem = checks_mod.applicability(spec, body)
            if problem:
                raise fail(f"check {spec.name} cannot apply: {problem}")

    def read(self, file: Path, key: PathKey) -> str:
        """A file the suite names; a failure to read it is reported at the key that names it."""
        try:
            return read_text(file)
        except ConfigError as exc:
            if exc.message == "no such file":
                raise self.pos.error(key, f"no such file: {file}") from None
            raise self.pos.error(key, f"cannot use {file}: {exc.message}") from None

    def read_json(self, rel: str, key: PathKey) -> Any:
        file = self.path.parent / rel
        if file not in self._json_cache:
            self._json_cache[file] = parse_json(self.read(file, key), str(file))
        return self._json_cache[file]

    def read_schema(self, rel: str, key: PathKey) -> Any:
        schema = self.read_json(rel, key)
        problem = checks_mod.schema_problem(schema)
        if problem:
            raise self.pos.error(key, f"{rel} is not a valid JSON schema: {problem}")
        return schema

    def yaml_case(self, c: _CaseIn, key: PathKey, defaults: _Defaults,
                  default_checks: tuple[CheckSpec, ...]) -> Case:
        self.check_body(c.body, (*key, "body"), partial=True)
        body = {**defaults.body, **c.body}
        if c.schema_file is not None:
            if "response_format" in body:
                raise self.pos.error((*key, "schema_file"), "give either schema_file or body.response_format")
            schema = self.read_schema(c.schema_file, (*key, "schema_file"))
            name = re.sub(r"[^A-Za-z0-9_-]", "_", Path(c.schema_file).stem)[:64]
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        if c.tools is not None:
            if "tools" in body:
                raise self.pos.error((*key, "tools"), "give either tools or body.tools")
            body["tools"] = [
                {"type": "function", "function": {
                    "name": t.name, "description": t.description,
                    "parameters": self.read_schema(t.parameters_file, (*key, "tools", k, "parameters_file"))}}
                for k, t in enumerate(c.tools)]
        self.check_body(body, (*key, "body"))
        own = self.checks(c.checks, (*key, "checks")) if c.checks is not None else None
        specs = (own if own is not None else default_checks) + self.checks(c.extra_checks, (*key, "extra_checks"))
        origin = dotted((*key, "checks")) if own is not None else "defaults.checks"
        self.applicable(specs, body, lambda m: self.pos.error((*key, "id"), f"{m} (from {origin})"))
        return Case(case_id=c.id, body=body, repeat=c.repeat or defaults.repeat, checks=specs,
                    source=self.where(key))

    def jsonl_cases(self, j: _JsonlIn, key: PathKey, defaults: _Defaults,
                    default_checks: tuple[CheckSpec, ...]) -> list[Case]:
        file = self.path.parent / j.file
        lines = jsonl_lines(self.read(file, (*key, "file")))
        own = self.checks(j.checks, (*key, "checks")) if j.checks is not None else None
        specs = (own if own is not None else default_checks) + self.checks(j.extra_checks, (*key, "extra_checks"))
        prefix = j.id_prefix or _stem_slug(file)
        out = []
        for n, line in lines:
            body = parse_json(line, str(file), n)
            if not isinstance(body, dict):
                raise ConfigError(f"expected a JSON object (a chat-completions request body), got "
                                  f"{type(body).__name__}", file=str(file), line=n)
            body.pop("model", None)  # production logs name the model they were served by
            body = {**defaults.body, **body}
            self.check_body(body, (), jsonl_file=str(file), jsonl_line=n)
            self.applicable(specs, body, lambda m, n=n: ConfigError(m, file=str(file), line=n))
            out.append(Case(case_id=f"{prefix}-{n}", body=body, repeat=j.repeat or defaults.repeat,
                            checks=specs, source=f"{file}:{n}"))
        if not out:
            raise self.pos.error((*key, "file"), f"{file} holds no request bodies")
        return out


def load_suites(paths: tuple[Path, ...]) -> Suite:
    """One suite, or several combined: case ids become `<suite>/<case>`."""
    suites = [load_suite(p) for p in paths]
    if len(suites) == 1:
        return suites[0]
    cases = tuple(dataclasses.replace(c, case_id=f"{s.name}/{c.case_id}") for s in suites for c in s.cases)
    digest = hashlib.sha256("".join(s.digest for s in suites).encode()).hexdigest()
    return Suite(name="+".join(s.name for s in suites), path=",".join(s.path for s in suites), cases=cases,
                 digest=digest)
