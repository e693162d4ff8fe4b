"""Named, parameterised checks of one request/response exchange: pass/fail plus a one-line detail.

Pure: no I/O. A check is a function of an `Exchange` (the request as sent, the HTTP status, the
parsed response, transport error text and the server-log lines carrying this request's id).
Suites name checks with parameters; `parse_spec` validates those once at load time, and
`run_check` judges an exchange. Streams must be reassembled into the non-stream response shape
before they reach a check. An answer that failed on the wire (`sweeper.spec.status.Transport`) fails
as that: one verdict named `transport: <verdict>`, in place of the checks that read the answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing.exceptions

from sweeper.spec.status import Transport

DETAIL_MAX = 240  # characters; details land in Parquet rows and terminal tables


@dataclass(frozen=True)
class CheckSpec:
    """A check by name with its validated parameters (plain JSON values, defaults filled in)."""

    name: str
    params: Mapping[str, Any]

    def as_json(self) -> Any:
        """The canonical JSON form, as a suite would write it: a name, or {name: params}."""
        return {self.name: dict(self.params)} if self.params else self.name


@dataclass(frozen=True)
class Exchange:
    """One request sent and what came back."""

    request: Mapping[str, Any]
    http_status: int | None
    response: Mapping[str, Any] | None
    error: str | None = None
    log_lines: tuple[str, ...] = ()
    # How the answer failed on the wire (`error` says what came); None when it came whole.
    transport: Transport | None = None


@dataclass(frozen=True)
class Verdict:
    check: str
    passed: bool
    detail: str


class _Fail(Exception):
    """Raised inside a check (or an accessor it uses): the check fails with this detail."""


@dataclass(frozen=True)
class Param:
    """One check parameter: `convert` validates a raw value (ValueError "expected …") and normalises it."""

    doc: str
    convert: Callable[[Any], Any]
    default: Any = None
    required: bool = False


@dataclass(frozen=True)
class CheckDef:
    """A registered check. `fn` returns None on pass or the failure detail; `requires` says, from the
    request body alone, why the check can never apply to it (caught when the suite loads)."""

    name: str
    doc: str
    fn: Callable[[Mapping[str, Any], Exchange], str | None]
    params: Mapping[str, Param] = field(default_factory=dict)
    requires: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None
    # False for checks that judge no part of the answer's body (the status, the server log): they
    # are still judged when the answer broke on the wire.
    reads_body: bool = True


# ---------------------------------------------------------------- parameter converters

def _str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _str_or_list(value: Any) -> list[str]:
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    raise ValueError(f"expected a string or a non-empty list of strings, got {value!r}")


def _count(value: Any) -> int:
    # bool is an int in Python; `max: true` is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return value


def _positive(value: Any) -> int:
    if _count(value) < 1:
        raise ValueError(f"expected an integer >= 1, got {value!r}")
    return int(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")  # noqa: TRY004 - parse_spec promises ValueError
    return value


def _regex(value: Any) -> str:
    pattern = _str(value)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"expected a regular expression, got {pattern!r} ({exc})") from None
    return pattern


def _schema(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON schema object, got {value!r}")  # noqa: TRY004
    problem = schema_problem(value)
    if problem:
        raise ValueError(f"expected a valid JSON schema: {problem}")
    return value


# ---------------------------------------------------------------- helpers

def clip(text: str, limit: int = DETAIL_MAX) -> str:
    text = " ".join(text.split("\n")) if "\n" in text and len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(text: str, limit: int = 60) -> str:
    """A short repr of response text for a detail line (escapes newlines, keeps the end visible)."""
    if len(text) > limit:
        text = "…" + text[-limit:]
    return repr(text)


def _choice(ex: Exchange) -> Mapping[str, Any]:
    choices = ex.response.get("choices") if ex.response is not None else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise _Fail("response has no choices")
    return choices[0]


def _message(ex: Exchange) -> Mapping[str, Any]:
    message = _choice(ex).get("message")
    if not isinstance(message, Mapping):
        raise _Fail("response has no choices[0].message")
    return message


def _content(ex: Exchange) -> str:
    content = _message(ex).get("content")
    if content is None:
        raise _Fail("content is null")
    if not isinstance(content, str):
        raise _Fail(f"content is not a string but {type(content).__name__}")
    return content


def _tool_calls(ex: Exchange) -> list[Mapping[str, Any]]:
    calls = _message(ex).get("tool_calls") or []
    if not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls):
        raise _Fail("tool_calls is not a list of objects")
    return calls


def _arguments(call: Mapping[str, Any]) -> tuple[str, str]:
    function = call.get("function")
    if not isinstance(function, Mapping):
        raise _Fail("a tool call has no function")
    name, arguments = function.get("name"), function.get("arguments")
    return (name if isinstance(name, str) else repr(name)), (arguments if isinstance(arguments, str) else "")


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Fail(f"{what} is not JSON: {exc.msg} at char {exc.pos} (length {len(text)}, "
                    f"ends {_show(text, 40)})") from None


def _dig(data: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(part)
    return data


def request_schema(body: Mapping[str, Any]) -> Any:
    """The JSON schema a structured-output request asks for, or None."""
    return _dig(body, "response_format", "json_schema", "schema")


def request_tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """Tool name → parameters schema (None when the tool declares none) of a request's `tools`."""
    tools = body.get("tools")
    out: dict[str, Any] = {}
    if isinstance(tools, list):
        for tool in tools:
            name = _dig(tool, "function", "name")
            if isinstance(name, str):
                out[name] = _dig(tool, "function", "parameters")
    return out


# ---------------------------------------------------------------- JSON schema validators

def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_validators: dict[tuple[str, bool], Any] = {}


def _validator(schema: Any, formats: bool) -> Any:
    """A compiled validator, cached by the schema's hash: a replay checks the same schemas many times."""
    key = (hashlib.sha256(_canonical(schema).encode()).hexdigest(), formats)
    validator = _validators.get(key)
    if validator is None:
        # The schema's own "$schema" picks the draft; 2020-12 where it names none.
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER if formats else None)
        if len(_validators) >= 1024:
            _validators.clear()
        _validators[key] = validator
    return validator


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a usable JSON schema, or None."""
    if not isinstance(schema, (dict, bool)):
        return f"expected an object, got {type(schema).__name__}"
    try:
        _validator(schema, False)
    except jsonschema.exceptions.SchemaError as exc:
        return clip(f"{'/'.join(map(str, exc.absolute_path)) or '(root)'}: {exc.message}", 160)
    return None


def _validate(instance: Any, schema: Any, formats: bool, what: str) -> str | None:
    try:
        validator = _validator(schema, formats)
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    except jsonschema.exceptions.SchemaError as exc:
        return clip(f"{what}: the schema is invalid: {exc.message}")
    except referencing.exceptions.Unresolvable as exc:
        return clip(f"{what}: the schema has an unresolvable reference: {exc}")
    if error is None:
        return None
    where = "/".join(map(str, error.absolute_path)) or "(root)"
    return clip(f"{what} violates the schema at {where}: {error.message}")


# ---------------------------------------------------------------- the checks

def _http_ok(_: Mapping[str, Any], ex: Exchange) -> str | None:
    if ex.http_status is None:
        return clip(f"no HTTP answer: {ex.error or 'unknown error'}")
    if ex.http_status != 200:
        message = _dig(ex.response, "error", "message") or _dig(ex.response, "message") or ex.error or ""
        return clip(f"HTTP {ex.http_status}" + (f": {message}" if message else ""))
    return None


def _finish_reason(p: Mapping[str, Any], ex: Exchange) -> str | None:
    got = _choice(ex).get("finish_reason")
    if got in p["expected"]:
        return None
    expected = p["expected"][0] if len(p["expected"]) == 1 else p["expected"]
    usage = _dig(ex.response, "usage", "completion_tokens")
    tokens = f" after {usage} completion tokens" if isinstance(usage, int) else ""
    return f"finish_reason {got!r}{tokens}, expected {expected!r}"


def _json_valid(_: Mapping[str, Any], ex: Exchange) -> str | None:
    _json(_content(ex), "content")
    return None


def _json_schema(p: Mapping[str, Any], ex: Exchange) -> str | None:
    schema = p.get("schema") or request_schema(ex.request)
    if schema is None:
        return "no schema: the request has no response_format.json_schema.schema and no schema param"
    return _validate(_json(_content(ex), "content"), schema, p["formats"], "content")


def _whitespace_tail(text: str) -> int:
    """Length of the degenerate tail: whitespace, and `"` + newline pairs (a seen degeneration)."""
    i = len(text)
    while i > 0 and text[i - 1].isspace():
        i -= 2 if text[i - 1] == "\n" and i >= 2 and text[i - 2] == '"' else 1
    return len(text) - i


def _no_whitespace_tail(p: Mapping[str, Any], ex: Exchange) -> str | None:
    message = _message(ex)
    texts: list[tuple[str, str]] = []
    if isinstance(message.get("content"), str):
        texts.append(("content", message["content"]))
    for i, call in enumerate(_tool_calls(ex)):
        name, arguments = _arguments(call)
        texts.append((f"tool call {i} ({name}) arguments", arguments))
    for what, text in texts:
        run = _whitespace_tail(text)
        if run >= p["min_run"]:
            return clip(f"{what}: ends in {run} whitespace characters {_show(text[-run:], 24)} "
                        f"after {_show(text[:-run], 40)}")
    return None


def _content_nonempty(_: Mapping[str, Any], ex: Exchange) -> str | None:
    content = _content(ex)
    return None if content.strip() else f"content is blank: {_show(content)}"


def _reasoning_tokens_at_most(p: Mapping[str, Any], ex: Exchange) -> str | None:
    got = _dig(ex.response, "usage", "completion_tokens_details", "reasoning_tokens")
    if not isinstance(got, int) or isinstance(got, bool):
        return "usage.completion_tokens_details.reasoning_tokens is not reported"
    return None if got <= p["max"] else f"{got} reasoning tokens, expected at most {p['max']}"


def _first_token_id(p: Mapping[str, Any], ex: Exchange) -> str | None:
    ids = _choice(ex).get("token_ids")
    if not isinstance(ids, list):
        return "response has no choices[0].token_ids (does the request set return_token_ids: true?)"
    if not ids:
        return "no tokens were generated"
    shown = ids[:8] + (["…"] if len(ids) > 8 else [])
    return None if ids[0] == p["id"] else f"first token id {ids[0]}, expected {p['id']} (ids {shown})"


def _tool_calls_valid(p: Mapping[str, Any], ex: Exchange) -> str | None:
    tools = request_tools(ex.request)
    calls = _tool_calls(ex)
    if len(calls) < p["min_calls"]:
        return f"{len(calls)} tool calls, expected at least {p['min_calls']}"
    for i, call in enumerate(calls):
        name, arguments = _arguments(call)
        if name not in tools:
            return clip(f"tool call {i} names {name!r}, not a tool of the request ({', '.join(tools)})")
        value = _json(arguments, f"tool call {i} ({name}) arguments")
        if tools[name] is not None:
            problem = _validate(value, tools[name], p["formats"], f"tool call {i} ({name}) arguments")
            if problem:
                return problem
    return None


def _log_absent(p: Mapping[str, Any], ex: Exchange) -> str | None:
    pattern = re.compile(p["pattern"])
    hits = [line for line in ex.log_lines if pattern.search(line)]
    if not hits:
        return None
    more = f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""
    return clip(f"server log{more}: {hits[0].strip()}")


def _content_matches(p: Mapping[str, Any], ex: Exchange) -> str | None:
    content = _content(ex)
    return None if re.search(p["pattern"], content) else f"content {_show(content)} does not match /{p['pattern']}/"


def _needs_schema(p: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    if p.get("schema") is None and request_schema(body) is None:
        return "the request has no response_format.json_schema.schema; give the check a schema param"
    return None


def _needs_tools(_: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    return None if request_tools(body) else "the request has no tools"


_FORMATS = Param("also check string `format`s (date-time, email, …); off because structured-output "
                 "backends differ in which formats they enforce", _bool, default=False)

CHECKS: Mapping[str, CheckDef] = MappingProxyType({d.name: d for d in (
    CheckDef("http_ok", "The server answered HTTP 200.", _http_ok, reads_body=False),
    CheckDef("finish_reason", "choices[0].finish_reason is one of `expected`.", _finish_reason,
             {"expected": Param("a finish reason or a list of them", _str_or_list, default=["stop"])}),
    CheckDef("json_valid", "The content parses as JSON.", _json_valid),
    CheckDef("json_schema", "The content is JSON valid against `schema`, by default the request's "
             "response_format.json_schema.schema.", _json_schema,
             {"schema": Param("a JSON schema (default: the request's)", _schema),
              "formats": _FORMATS}, requires=_needs_schema),
    CheckDef("no_whitespace_tail", "Neither the content nor any tool call's arguments end in `min_run` or "
             "more whitespace characters (or `\"`+newline pairs): the structured-output degeneration.",
             _no_whitespace_tail, {"min_run": Param("shortest run that fails", _positive, default=16)}),
    CheckDef("content_nonempty", "The content has a non-whitespace character.", _content_nonempty),
    CheckDef("reasoning_tokens_at_most", "usage.completion_tokens_details.reasoning_tokens <= `max`.",
             _reasoning_tokens_at_most, {"max": Param("most reasoning tokens allowed", _count, required=True)}),
    CheckDef("first_token_id", "The first generated token id (choices[0].token_ids, needs "
             "return_token_ids) is `id`.", _first_token_id,
             {"id": Param("the token id, e.g. 248069 for Qwen3's </think>", _count, required=True)}),
    CheckDef("tool_calls_valid", "At least `min_calls` tool calls; each names a tool of the request and its "
             "arguments are JSON valid against that tool's parameters.", _tool_calls_valid,
             {"min_calls": Param("fewest tool calls expected", _count, default=1), "formats": _FORMATS},
             requires=_needs_tools),
    CheckDef("log_absent", "No server log line for this request matches `pattern`.", _log_absent,
             {"pattern": Param("a regular expression", _regex, required=True)}, reads_body=False),
    CheckDef("content_matches", "The content matches `pattern` (re.search).", _content_matches,
             {"pattern": Param("a regular expression", _regex, required=True)}),
)})


# ---------------------------------------------------------------- API

def parse_spec(name: str, params: Mapping[str, Any] | None) -> CheckSpec:
    """Validate a check name and its parameters; ValueError says what was expected."""
    definition = CHECKS.get(name)
    if definition is None:
        raise ValueError(f"unknown check {name!r}; expected one of: {', '.join(CHECKS)}")
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"{name}: expected a mapping of parameters, got {params!r}")
    given = dict(params or {})
    unknown = sorted(set(given) - set(definition.params))
    if unknown:
        allowed = ", ".join(definition.params) or "none"
        raise ValueError(f"{name}: unknown parameter {unknown[0]!r}; expected: {allowed}")
    out: dict[str, Any] = {}
    for key, param in definition.params.items():
        if key in given:
            try:
                out[key] = param.convert(given[key])
            except ValueError as exc:
                raise ValueError(f"{name}.{key}: {exc}") from None
        elif param.required:
            raise ValueError(f"{name}: parameter {key!r} is required; expected {param.doc}")
        elif param.default is not None:
            out[key] = param.default
    return CheckSpec(name, MappingProxyType(out))


def applicability(spec: CheckSpec, body: Mapping[str, Any]) -> str | None:
    """Why `spec` can never pass for a request with this body (None when it can apply)."""
    requires = CHECKS[spec.name].requires
    return requires(spec.params, body) if requires else None


TRANSPORT_LABEL = "transport: "


def transport_label(kind: Transport) -> str:
    """The failed-check name of a wire failure, e.g. `transport: invalid_utf8`: a failure mode of
    its own, told apart from every check and from the other wire failures."""
    return f"{TRANSPORT_LABEL}{kind.value}"


def run_check(spec: CheckSpec, ex: Exchange) -> Verdict:
    definition = CHECKS[spec.name]
    if ex.transport is not None and definition.reads_body:
        return Verdict(spec.name, False, clip(f"not judged: the answer broke on the wire "
                                              f"({transport_label(ex.transport)}): {ex.error or ''}"))
    if spec.name != "http_ok":
        # A transport failure or an error status is a failure of every check, with the reason.
        if ex.http_status is None or ex.response is None:
            why = ex.error or (f"HTTP {ex.http_status}, body not JSON" if ex.http_status else "no answer")
            return Verdict(spec.name, False, clip(f"no response: {why}"))
        if ex.http_status != 200:
            return Verdict(spec.name, False, f"no completion: HTTP {ex.http_status}")
    try:
        detail = definition.fn(spec.params, ex)
    except _Fail as exc:
        detail = str(exc)
    return Verdict(spec.name, detail is None, "" if detail is None else clip(detail))


def run_checks(specs: Sequence[CheckSpec], ex: Exchange) -> tuple[Verdict, ...]:
    """Every check's verdict. When the answer broke on the wire, the checks that read its body say
    nothing (they would all fail as consequences): the wire failure is one verdict in their place,
    and the checks that read no body (`http_ok`, `log_absent`) are judged as always."""
    if ex.transport is None:
        return tuple(run_check(spec, ex) for spec in specs)
    kept = tuple(run_check(spec, ex) for spec in specs if not CHECKS[spec.name].reads_body)
    return (*kept, Verdict(transport_label(ex.transport), False, clip(ex.error or ex.transport.value)))
