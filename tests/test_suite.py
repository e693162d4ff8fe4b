"""Suite loading: the shipped suites, and one exact error line per kind of mistake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sweeper.errors import ConfigError
from sweeper.spec.checks import Exchange, parse_spec, request_schema, request_tools, run_check, schema_problem
from sweeper.spec.suite import expand, load_suite

SUITES = Path(__file__).resolve().parent.parent / "suites"


# ---------------------------------------------------------------- shipped suites

def test_structured_output_suite() -> None:
    suite = load_suite(SUITES / "structured-output.yaml")
    assert suite.name == "structured-output"
    ids = [c.case_id for c in suite.cases]
    assert len(ids) >= 20 and len(set(ids)) == len(ids)
    tools = [c for c in suite.cases if "tools" in c.body]
    schemas = [c for c in suite.cases if request_schema(c.body) is not None]
    assert len(tools) >= 5 and len(schemas) >= 15 and len(tools) + len(schemas) == len(ids)
    assert all("model" not in c.body for c in suite.cases)
    for case in suite.cases:
        names = [s.name for s in case.checks]
        assert {"http_ok", "finish_reason", "no_whitespace_tail", "log_absent"} <= set(names), case.case_id
        assert ("tool_calls_valid" if case in tools else "json_schema") in names
        assert case.body["max_tokens"] <= 512
    assert [c.source for c in suite.cases if c.case_id == "prod-1"] == [f"{SUITES}/structured-output.jsonl:1"]


def test_thinking_budget_suite() -> None:
    suite = load_suite(SUITES / "thinking-budget.yaml")
    first = suite.cases[0]
    assert first.case_id == "budget-1"
    assert {k: first.body[k] for k in ("thinking_token_budget", "max_tokens", "return_token_ids")} == {
        "thinking_token_budget": 1, "max_tokens": 32, "return_token_ids": True}
    assert first.body["chat_template_kwargs"] == {"enable_thinking": True, "preserve_thinking": True}
    assert [s.as_json() for s in first.checks] == [
        "http_ok", {"finish_reason": {"expected": ["stop"]}}, {"reasoning_tokens_at_most": {"max": 1}},
        "content_nonempty", {"first_token_id": {"id": 248069}}]
    assert len(suite.cases) >= 4
    # The answer the report expected passes every check; the broken one fails the ones that matter.
    good = {"choices": [{"message": {"content": "\n\n2", "reasoning": None}, "finish_reason": "stop",
                         "token_ids": [248069, 271, 17, 248046]}],
            "usage": {"completion_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 0}}}
    bad = {"choices": [{"message": {"content": None, "reasoning": "x" * 90}, "finish_reason": "length",
                        "token_ids": [1] * 32}],
           "usage": {"completion_tokens": 32, "completion_tokens_details": {"reasoning_tokens": 32}}}
    assert all(run_check(s, Exchange(first.request("m"), 200, good, None, ())).passed for s in first.checks)
    failed = [s.name for s in first.checks if not run_check(s, Exchange(first.request("m"), 200, bad, None, ())).passed]
    assert failed == ["finish_reason", "reasoning_tokens_at_most", "content_nonempty", "first_token_id"]


def test_every_shipped_schema_compiles() -> None:
    files = sorted((SUITES / "schemas").glob("*.json"))
    assert len(files) >= 15
    for file in files:
        assert schema_problem(json.loads(file.read_text())) is None, file.name


def _instance(schema: Any, root: Any, rich: bool) -> Any:
    """A small instance of a schema (the subset real-world schemas here use); `rich` fills optional
    properties and arrays too. hypothesis-jsonschema 0.23 does not work with the installed hypothesis."""
    if schema is True or schema == {}:
        return "x"
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return _instance(target, root, rich)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return _instance({**{k: v for k, v in schema.items() if k != key}, **schema[key][0]}, root, rich)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if kind == "object":
        props = schema.get("properties", {})
        keys = list(props) if rich else list(schema.get("required", []))
        return {k: _instance(props.get(k, {}), root, rich) for k in keys}
    if kind == "array":
        count = max(schema.get("minItems", 0), 2 if rich else 0)
        return [_instance(schema.get("items", {}), root, rich) for _ in range(count)]
    if kind == "string":
        return "a" * max(1, min(schema.get("minLength", 1), schema.get("maxLength", 8)))
    if kind in ("number", "integer"):
        return max(1, schema.get("minimum", 1))
    return {"boolean": True, "null": None}[kind]


def _structured_cases() -> list[tuple[str, Any]]:
    out = []
    for name in ("structured-output.yaml",):
        for case in load_suite(SUITES / name).cases:
            if (schema := request_schema(case.body)) is not None:
                out.append((case.case_id, schema))
            out.extend((f"{case.case_id}:{tool}", params) for tool, params in request_tools(case.body).items())
    return out


@pytest.mark.parametrize(("case_id", "schema"), _structured_cases(), ids=[c[0] for c in _structured_cases()])
def test_every_suite_schema_is_satisfiable(case_id: str, schema: Any) -> None:
    spec = parse_spec("json_schema", {"schema": schema})
    # Rich instances (arrays filled) where the generator's subset suffices, else the minimal one.
    verdicts = [run_check(spec, Exchange({}, 200, {"choices": [{"message": {"content": json.dumps(
        _instance(schema, schema, rich))}}]}, None, ())) for rich in (True, False)]
    assert any(v.passed for v in verdicts), verdicts


def test_expand_is_repeat_major() -> None:
    suite = load_suite(SUITES / "thinking-budget.yaml")
    plan = expand(suite)
    assert len(plan) == sum(c.repeat for c in suite.cases)
    assert [c.case_id for c, _ in plan[: len(suite.cases)]] == [c.case_id for c in suite.cases]
    assert {r for _, r in plan} == set(range(5))
    assert len(expand(suite, repeats_multiplier=2)) == 2 * len(plan)


def test_digest_follows_content_not_layout(tmp_path: Path) -> None:
    base = "cases:\n  - id: a\n    body: {messages: [{role: user, content: hi}]}\n"
    (tmp_path / "one.yaml").write_text(base)
    (tmp_path / "two.yaml").write_text("# a comment moves every line\n\n" + base)
    (tmp_path / "three.yaml").write_text(base.replace("hi", "hello"))
    one, two, three = (load_suite(tmp_path / f"{n}.yaml") for n in ("one", "two", "three"))
    assert one.digest == two.digest != three.digest
    assert one.cases[0].request("qwen") == {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
    assert "model" not in one.cases[0].body


def test_jsonl_drops_model_and_takes_defaults(tmp_path: Path) -> None:
    (tmp_path / "prod.jsonl").write_text(
        '{"model": "big", "messages": [{"role": "user", "content": "hi"}], "temperature": 1}\n\n'
        '{"messages": [{"role": "user", "content": "yo"}]}\n')
    (tmp_path / "s.yaml").write_text(
        "defaults: {repeat: 2, body: {temperature: 0, max_tokens: 8}}\njsonl:\n  - file: prod.jsonl\n")
    suite = load_suite(tmp_path / "s.yaml")
    assert [(c.case_id, dict(c.body), c.repeat) for c in suite.cases] == [
        ("prod-1", {"temperature": 1, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, 2),
        ("prod-3", {"temperature": 0, "max_tokens": 8, "messages": [{"role": "user", "content": "yo"}]}, 2)]


# ---------------------------------------------------------------- errors

MSG = "messages: [{role: user, content: hi}]"
BAD: list[tuple[str, str, dict[str, str], str]] = [
    # (name, suite text, other files, exact message with {d} = the directory)
    ("yaml-syntax", "cases:\n  - id: a\n    body: {messages: [\n", {},
     "{d}/s.yaml:4: invalid YAML: did not find expected node content"),
    ("unknown-key", f"cases:\n  - id: a\n    bdy: {{{MSG}}}\n", {},
     ("{d}/s.yaml:3: cases[0].bdy: unknown key; expected one of: id, body, schema_file, tools, repeat, checks, "
      "extra_checks")),
    ("unknown-top-key", f"case:\n  - id: a\n    body: {{{MSG}}}\n", {},
     "{d}/s.yaml:1: case: unknown key; expected one of: name, description, defaults, cases, jsonl"),
    ("wrong-type", f"defaults:\n  repeat: three\ncases:\n  - id: a\n    body: {{{MSG}}}\n", {},
     "{d}/s.yaml:2: defaults.repeat: Input should be a valid integer, got 'three'"),
    ("unknown-check", f"cases:\n  - id: a\n    body: {{{MSG}}}\n    checks:\n      - http_ok\n      - jsn_valid\n",
     {}, ("{d}/s.yaml:6: cases[0].checks[1]: unknown check 'jsn_valid'; expected one of: http_ok, finish_reason, "
     "json_valid, json_schema, no_whitespace_tail, content_nonempty, reasoning_tokens_at_most, first_token_id, "
     "tool_calls_valid, log_absent, content_matches")),
    ("bad-param", (f"defaults:\n  checks:\n    - {{no_whitespace_tail: {{min_run: -1}}}}\ncases:\n  - id: a\n"
     f"    body: {{{MSG}}}\n"), {},
     "{d}/s.yaml:3: defaults.checks[0]: no_whitespace_tail.min_run: expected an integer >= 0, got -1"),
    ("missing-param", f"cases:\n  - id: a\n    body: {{{MSG}}}\n    extra_checks: [log_absent]\n", {},
     ("{d}/s.yaml:4: cases[0].extra_checks[0]: log_absent: parameter 'pattern' is required; "
     "expected a regular expression")),
    ("duplicate-id", f"cases:\n  - id: a\n    body: {{{MSG}}}\n  - id: a\n    body: {{{MSG}}}\n", {},
     "{d}/s.yaml:4: id: duplicate case id 'a' (first at {d}/s.yaml:2)"),
    ("duplicate-id-jsonl", f"cases:\n  - id: p-2\n    body: {{{MSG}}}\njsonl:\n  - {{file: p.jsonl, id_prefix: p}}\n",
     {"p.jsonl": '{"messages": [{"role": "user", "content": "a"}]}\n' * 2},
     "{d}/p.jsonl:2: id: duplicate case id 'p-2' (first at {d}/s.yaml:2)"),
    ("bad-jsonl-line", "jsonl:\n  - file: p.jsonl\n",
     {"p.jsonl": '{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [}\n'},
     "{d}/p.jsonl:2: invalid JSON: Expecting value (column 15)"),
    ("jsonl-not-object", "jsonl:\n  - file: p.jsonl\n", {"p.jsonl": '["hi"]\n'},
     "{d}/p.jsonl:1: expected a JSON object (a chat-completions request body), got list"),
    ("jsonl-no-messages", "jsonl:\n  - file: p.jsonl\n", {"p.jsonl": '{"model": "m", "prompt": "hi"}\n'},
     "{d}/p.jsonl:1: messages: required key is missing"),
    ("missing-jsonl", "jsonl:\n  - file: nope.jsonl\n", {}, "{d}/s.yaml:2: jsonl[0].file: no such file: {d}/nope.jsonl"),
    ("missing-schema", f"cases:\n  - id: a\n    schema_file: schemas/nope.json\n    body: {{{MSG}}}\n", {},
     "{d}/s.yaml:3: cases[0].schema_file: no such file: {d}/schemas/nope.json"),
    ("missing-tool-schema", (f"cases:\n  - id: a\n    tools:\n      - {{name: f, parameters_file: f.json}}\n"
     f"    body: {{{MSG}}}\n"), {}, "{d}/s.yaml:4: cases[0].tools[0].parameters_file: no such file: {d}/f.json"),
    ("invalid-schema", f"cases:\n  - id: a\n    schema_file: x.json\n    body: {{{MSG}}}\n",
     {"x.json": '{"type": "objekt"}'}, ("{d}/s.yaml:3: cases[0].schema_file: x.json is not a valid JSON schema: "
     "type: 'objekt' is not valid under any of the given schemas")),
    ("schema-not-json", f"cases:\n  - id: a\n    schema_file: x.json\n    body: {{{MSG}}}\n",
     {"x.json": '{\n  "type": object\n}'}, "{d}/x.json:2: invalid JSON: Expecting value (column 11)"),
    ("model-in-body", f"cases:\n  - id: a\n    body:\n      model: qwen\n      {MSG}\n", {},
     "{d}/s.yaml:4: cases[0].body.model: not allowed in a suite; the runner sets the model of each matrix cell"),
    ("no-messages", "cases:\n  - id: a\n    body: {max_tokens: 3}\n", {},
     "{d}/s.yaml:3: cases[0].body.messages: required key is missing"),
    ("empty", "name: x\n", {}, "{d}/s.yaml:1: the suite has no cases; expected `cases:` or `jsonl:` entries"),
    ("bad-id", f"cases:\n  - id: 'a b'\n    body: {{{MSG}}}\n", {},
     "{d}/s.yaml:2: cases[0].id: String should match pattern '^[A-Za-z0-9][A-Za-z0-9._-]*$', got 'a b'"),
    ("check-cannot-apply", f"defaults:\n  checks: [json_schema]\ncases:\n  - id: a\n    body: {{{MSG}}}\n", {},
     ("{d}/s.yaml:4: cases[0].id: check json_schema cannot apply: the request has no response_format.json_schema."
     "schema; give the check a schema param (from defaults.checks)")),
    ("check-shape", f"cases:\n  - id: a\n    body: {{{MSG}}}\n    checks: [{{http_ok: null, json_valid: null}}]\n", {},
     ("{d}/s.yaml:4: cases[0].checks[0]: expected a check name or {{name: {{param: value}}}}, got "
     "{{'http_ok': None, 'json_valid': None}}")),
    ("schema-and-response-format", "cases:\n  - id: a\n    schema_file: x.json\n    body:\n      " + MSG +
     "\n      response_format: {type: json_object}\n", {"x.json": "{}"},
     "{d}/s.yaml:3: cases[0].schema_file: give either schema_file or body.response_format"),
]


@pytest.mark.parametrize(("name", "text", "files", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_suite(tmp_path: Path, name: str, text: str, files: dict[str, str], message: str) -> None:
    (tmp_path / "s.yaml").write_text(text)
    for rel, content in files.items():
        (tmp_path / rel).write_text(content)
    with pytest.raises(ConfigError) as info:
        load_suite(tmp_path / "s.yaml")
    assert str(info.value) == message.format(d=tmp_path)


def test_missing_suite_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file$"):
        load_suite(tmp_path / "nope.yaml")
