"""Every check passing, failing and not applicable; parameter validation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sweeper.spec.checks import (
    CHECKS,
    DETAIL_MAX,
    Exchange,
    parse_spec,
    run_check,
    run_checks,
    transport_label,
)
from sweeper.spec.status import Transport

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
          "required": ["items"]}
STRUCTURED = {"messages": [{"role": "user", "content": "x"}],
              "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
TOOLS = {"messages": [{"role": "user", "content": "x"}],
         "tools": [{"type": "function", "function": {"name": "area", "parameters": {
             "type": "object", "properties": {"r": {"type": "number"}}, "required": ["r"]}}}]}


def ok(content: Any = "hello", *, request: Any = None, finish: str = "stop", logs: tuple[str, ...] = (),
       tool_calls: list[Any] | None = None, usage: Any = None, token_ids: Any = None) -> Exchange:
    choice: dict[str, Any] = {"message": {"role": "assistant", "content": content}, "finish_reason": finish}
    if tool_calls is not None:
        choice["message"]["tool_calls"] = tool_calls
    if token_ids is not None:
        choice["token_ids"] = token_ids
    response: dict[str, Any] = {"choices": [choice]}
    if usage is not None:
        response["usage"] = usage
    return Exchange(request=request or STRUCTURED, http_status=200, response=response, error=None, log_lines=logs)


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


TIMEOUT = Exchange(request=STRUCTURED, http_status=None, response=None, error="read timeout after 60 s", log_lines=())
HTTP_500 = Exchange(request=STRUCTURED, http_status=500, response={"error": {"message": "engine dead"}},
                    error=None, log_lines=())
NO_CHOICES = Exchange(request=STRUCTURED, http_status=200, response={"id": "x"}, error=None, log_lines=())
WS = " \n\t" * 10

CASES: list[tuple[str, dict[str, Any] | None, Exchange, bool, str]] = [
    # (check, params, exchange, passed, detail must contain)
    ("http_ok", None, ok(), True, ""),
    ("http_ok", None, TIMEOUT, False, "no HTTP answer: read timeout after 60 s"),
    ("http_ok", None, HTTP_500, False, "HTTP 500: engine dead"),
    ("finish_reason", None, ok(), True, ""),
    ("finish_reason", None, ok(finish="length", usage={"completion_tokens": 512}), False,
     "finish_reason 'length' after 512 completion tokens, expected 'stop'"),
    ("finish_reason", {"expected": ["tool_calls", "stop"]}, ok(finish="tool_calls"), True, ""),
    ("finish_reason", {"expected": "tool_calls"}, ok(), False, "finish_reason 'stop', expected 'tool_calls'"),
    ("finish_reason", None, NO_CHOICES, False, "response has no choices"),
    ("json_valid", None, ok('{"a": 1}'), True, ""),
    ("json_valid", None, ok('{"items": ' + WS), False, "content is not JSON: Expecting value"),
    ("json_valid", None, ok(None), False, "content is null"),
    ("json_schema", None, ok('{"items": [1, 2]}'), True, ""),
    ("json_schema", None, ok('{"items": [1, "2"]}'), False, "content violates the schema at items/1: '2' is not of type"),
    ("json_schema", None, ok('{"items": [1'), False, "content is not JSON"),
    ("json_schema", {"schema": {"type": "array"}}, ok("[]"), True, ""),
    ("json_schema", {"schema": {"type": "array"}}, ok("{}"), False, "{} is not of type 'array'"),
    ("json_schema", None, ok("{}", request={"messages": []}), False, "no schema"),
    ("json_schema", {"schema": {"type": "string", "format": "ipv4"}, "formats": True}, ok('"10.0.0.256"'),
     False, "is not a 'ipv4'"),
    ("json_schema", {"schema": {"type": "string", "format": "ipv4"}}, ok('"10.0.0.256"'), True, ""),
    ("no_whitespace_tail", None, ok('{"items": [1]}\n'), True, ""),
    ("no_whitespace_tail", None, ok('{"items": ' + WS), False, "content: ends in 31 whitespace characters"),
    ("no_whitespace_tail", None, ok('{"note": "a' + '"\n' * 8), False, "ends in 16 whitespace characters"),
    ("no_whitespace_tail", {"min_run": 40}, ok('{"items": ' + WS), True, ""),
    ("no_whitespace_tail", None, ok(None, request=TOOLS, tool_calls=[call("area", '{"r": ' + " " * 20)]), False,
     "tool call 0 (area) arguments: ends in 21 whitespace"),
    ("content_nonempty", None, ok("\n\n2"), True, ""),
    ("content_nonempty", None, ok(" \n"), False, "content is blank"),
    ("content_nonempty", None, ok(None), False, "content is null"),
    ("reasoning_tokens_at_most", {"max": 1}, ok(usage={"completion_tokens_details": {"reasoning_tokens": 0}}), True, ""),
    ("reasoning_tokens_at_most", {"max": 1}, ok(usage={"completion_tokens_details": {"reasoning_tokens": 32}}),
     False, "32 reasoning tokens, expected at most 1"),
    ("reasoning_tokens_at_most", {"max": 1}, ok(usage={"completion_tokens": 4}), False, "is not reported"),
    ("first_token_id", {"id": 248069}, ok(token_ids=[248069, 271, 17, 248046]), True, ""),
    ("first_token_id", {"id": 248069}, ok(token_ids=[1, 2]), False, "first token id 1, expected 248069"),
    ("first_token_id", {"id": 248069}, ok(), False, "return_token_ids"),
    ("first_token_id", {"id": 248069}, ok(token_ids=[]), False, "no tokens were generated"),
    ("tool_calls_valid", None, ok(None, request=TOOLS, tool_calls=[call("area", '{"r": 2.5}')]), True, ""),
    ("tool_calls_valid", None, ok(None, request=TOOLS, tool_calls=[call("volume", "{}")]), False,
     "tool call 0 names 'volume', not a tool of the request (area)"),
    ("tool_calls_valid", None, ok(None, request=TOOLS, tool_calls=[call("area", '{"r": ')]), False,
     "tool call 0 (area) arguments is not JSON"),
    ("tool_calls_valid", None, ok(None, request=TOOLS, tool_calls=[call("area", '{"r": "big"}')]), False,
     "arguments violates the schema at r: 'big' is not of type 'number'"),
    ("tool_calls_valid", None, ok("I can't", request=TOOLS, tool_calls=[]), False, "0 tool calls, expected at least 1"),
    ("tool_calls_valid", {"min_calls": 0}, ok("I can't", request=TOOLS), True, ""),
    ("log_absent", {"pattern": "Failed to advance FSM"}, ok(logs=("INFO chatcmpl-1 finished",)), True, ""),
    ("log_absent", {"pattern": "Failed to advance FSM"},
     ok(logs=("ERROR [backend_xgrammar.py:167] Failed to advance FSM for request chatcmpl-1 for tokens 71093.",) * 2),
     False, "server log (+1 more): ERROR [backend_xgrammar.py:167] Failed to advance FSM"),
    ("content_matches", {"pattern": r"^\s*2\s*$"}, ok("\n\n2"), True, ""),
    ("content_matches", {"pattern": r"^\d+$"}, ok("two"), False, "content 'two' does not match /^\\d+$/"),
]


@pytest.mark.parametrize(("name", "params", "exchange", "passed", "detail"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_check(name: str, params: dict[str, Any] | None, exchange: Exchange, passed: bool, detail: str) -> None:
    verdict = run_check(parse_spec(name, params), exchange)
    assert (verdict.check, verdict.passed) == (name, passed), verdict.detail
    assert detail in verdict.detail
    assert passed == (verdict.detail == "")


def test_table_covers_every_check_both_ways() -> None:
    assert {(c[0], c[3]) for c in CASES} == {(n, p) for n in CHECKS for p in (True, False)}


@pytest.mark.parametrize("name", [n for n in CHECKS if n != "http_ok"])
@pytest.mark.parametrize(("exchange", "detail"), [
    (TIMEOUT, "no response: read timeout after 60 s"), (HTTP_500, "no completion: HTTP 500")])
def test_transport_failure_fails_every_check(name: str, exchange: Exchange, detail: str) -> None:
    params = {"max": 1, "id": 1, "pattern": "x"}
    spec = parse_spec(name, {k: v for k, v in params.items() if k in CHECKS[name].params})
    assert run_check(spec, exchange).detail == detail


def test_details_are_bounded_single_lines() -> None:
    huge = ok("x" * 10_000 + "\n" * 5000)
    verdicts = run_checks([parse_spec("json_valid", None), parse_spec("no_whitespace_tail", None),
                           parse_spec("content_matches", {"pattern": "y" * 500})], huge)
    assert [v.passed for v in verdicts] == [False, False, False]
    assert all(len(v.detail) <= DETAIL_MAX and "\n" not in v.detail for v in verdicts)


@pytest.mark.parametrize(("name", "params", "message"), [
    ("jsn_valid", None, "unknown check 'jsn_valid'; expected one of: http_ok, finish_reason,"),
    ("finish_reason", {"expect": "stop"}, "finish_reason: unknown parameter 'expect'; expected: expected"),
    ("http_ok", {"x": 1}, "http_ok: unknown parameter 'x'; expected: none"),
    ("finish_reason", {"expected": 3}, "finish_reason.expected: expected a string or a non-empty list of strings, got 3"),
    ("reasoning_tokens_at_most", None, "reasoning_tokens_at_most: parameter 'max' is required; expected most"),
    ("reasoning_tokens_at_most", {"max": True}, "reasoning_tokens_at_most.max: expected an integer >= 0, got True"),
    ("first_token_id", {"id": "248069"}, "first_token_id.id: expected an integer >= 0, got '248069'"),
    ("no_whitespace_tail", {"min_run": 0}, "no_whitespace_tail.min_run: expected an integer >= 1, got 0"),
    ("log_absent", {"pattern": "(unclosed"}, "log_absent.pattern: expected a regular expression, got '(unclosed'"),
    ("json_schema", {"schema": {"type": "objekt"}}, "json_schema.schema: expected a valid JSON schema: type:"),
    ("json_schema", {"formats": "yes"}, "json_schema.formats: expected true or false, got 'yes'"),
    ("log_absent", ["pattern"], "log_absent: expected a mapping of parameters"),
])
def test_bad_params(name: str, params: Any, message: str) -> None:
    with pytest.raises(ValueError, match="expected") as info:
        parse_spec(name, params)
    assert str(info.value).startswith(message)


def test_spec_defaults_and_json_form() -> None:
    spec = parse_spec("finish_reason", None)
    assert dict(spec.params) == {"expected": ["stop"]}
    assert json.dumps(spec.as_json()) == '{"finish_reason": {"expected": ["stop"]}}'
    assert parse_spec("http_ok", None).as_json() == "http_ok"


def test_validators_are_cached_by_schema_content() -> None:
    from sweeper.spec import checks
    spec = parse_spec("json_schema", None)
    run_check(spec, ok('{"items": []}'))
    before = len(checks._validators)
    again = {**STRUCTURED, "response_format": json.loads(json.dumps(STRUCTURED["response_format"]))}
    assert run_check(spec, ok('{"items": []}', request=again)).passed
    assert len(checks._validators) == before


def test_draft_is_taken_from_the_schema() -> None:
    # exclusiveMaximum is a boolean in draft 4 and a number since draft 6.
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer", "maximum": 5,
              "exclusiveMaximum": True}
    spec = parse_spec("json_schema", {"schema": draft4})
    assert not run_check(spec, ok("5")).passed
    assert run_check(spec, ok("4")).passed


def test_an_answer_broken_on_the_wire_fails_as_that_alone() -> None:
    """The wire failure is one verdict, named; the checks that read the body are not judged (they
    would fail as consequences), the status and the server log are judged as always."""
    specs = [parse_spec("http_ok", None), parse_spec("finish_reason", None), parse_spec("json_schema", None),
             parse_spec("log_absent", {"pattern": "FSM"})]
    ex = ok('{"items": [1]}', logs=("ERROR Failed to advance FSM",))
    broken = Exchange(request=ex.request, http_status=200, response=ex.response, log_lines=ex.log_lines,
                      error="invalid UTF-8 at byte 12 of the body: b'\\xff'", transport=Transport.INVALID_UTF8)
    got = {v.check: (v.passed, v.detail) for v in run_checks(specs, broken)}
    assert got == {"http_ok": (True, ""), "log_absent": (False, "server log: ERROR Failed to advance FSM"),
                   "transport: invalid_utf8": (False, "invalid UTF-8 at byte 12 of the body: b'\\xff'")}
    # Asked alone, a check that reads the body says why it was not judged.
    verdict = run_check(parse_spec("finish_reason", None), broken)
    assert not verdict.passed and verdict.detail.startswith("not judged: the answer broke on the wire "
                                                            "(transport: invalid_utf8)")
    # No status line at all: http_ok fails too, with the wire's words.
    reset = Exchange(request=ex.request, http_status=None, response=None, error="the server reset the connection "
                     "before answering", transport=Transport.RESET)
    assert [(v.check, v.passed) for v in run_checks(specs[:2], reset)] == [("http_ok", False),
                                                                           ("transport: reset", False)]
    assert transport_label(Transport.TOO_LARGE) == "transport: too_large"
