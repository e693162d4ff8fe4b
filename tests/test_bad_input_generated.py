"""Generated malformed inputs: hypothesis mutates a valid matrix, suite, JSONL file and JSON schema
into at least 1,000 invalid ones, across the families of bad input (control bytes, bad UTF-8,
recursive aliases, deep nesting, unsupported tags, bad counts, bad axis names, duplicate keys,
alias bombs, cut-off documents, wrong types, paths that are not files, bad JSONL, huge values).

Every one goes through the real command line (`sweep matrix m.yaml --dry-run`, or `sweep suite show
s.yaml`): exit 1, at most 2 lines on stderr naming the file, nothing on stdout, no traceback, under
5 s of CPU and 500 MB of Python allocations, and no planted `!!python/object/apply` runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeper import cli

# 300 in the full tier keeps every family in (each at least 5 times) within about two minutes;
# SWEEP_GENERATED_EXAMPLES=1000 (or more) searches deeper.
EXAMPLES = int(os.environ.get("SWEEP_GENERATED_EXAMPLES", "300"))
MATRIX = """name: gen
model: m
suite: s.yaml
install: {kind: preinstalled}
repeats: 2
concurrency: 4
gpus_per_cell: 1
timeouts: {startup_s: 30, request_s: 10}
env: {A: "1"}
request: {max_tokens: 8}
axes:
  spec_method: [none, ngram]
  env.B: ["0", "1"]
  request.temperature: [0, 0.5]
"""
SUITE = """name: gen
defaults:
  repeat: 2
  body: {max_tokens: 16}
  checks: [http_ok]
cases:
  - id: a
    body: {messages: [{role: user, content: hi}]}
  - id: b
    schema_file: x.json
    body: {messages: [{role: user, content: json please}]}
jsonl:
  - file: p.jsonl
"""
JSONL = '{"messages": [{"role": "user", "content": "from history"}], "max_tokens": 4}\n'
SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}\n'
VALID = {"m.yaml": MATRIX, "s.yaml": SUITE, "p.jsonl": JSONL, "x.json": SCHEMA}

CONTROL = [chr(c) for c in (*range(9), 11, 12, *range(14, 32), 127)]
BAD_UTF8 = [b"\xff", b"\xfe", b"\xc0", b"\x80", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]
TAGS = ["!!python/object/apply:os.system", "!!python/name:os.system", "!!python/object/new:os.system",
        "!!python/tuple", "!!binary", "!custom", "!!set", "!!omap", "!!pairs", "!!timestamp", "!<tag:x.org,1:y>"]
BAD_TYPED = ["!!int abc", "!!int 1.5", "!!float x", "!!bool maybe", "!!null x", "!!int ''"]
COUNT_KEYS = {"repeats": (1, 1000), "concurrency": (1, 4096), "gpus_per_cell": (0, 64)}


@dataclass
class Case:
    family: str
    files: dict[str, str | bytes] = field(default_factory=dict)  # over VALID
    names: str = "m.yaml"          # the file the error line must name
    or_names: str | None = None    # or this one (a path that names something unreadable)
    command: str = "matrix"        # or "suite"
    planted: bool = False          # a python tag that would create the file `pwned`


def replace_line(text: str, key: str, value: str) -> str:
    """`key: old` (at line start) -> `key: value`."""
    out, n = re.subn(rf"^{re.escape(key)}: .*$", lambda _: f"{key}: {value}", text, count=1, flags=re.MULTILINE)
    assert n == 1, key
    return out


def yaml_str(text: str) -> str:
    """A YAML double-quoted scalar for any text (JSON escapes are YAML escapes)."""
    return json.dumps(text)


@st.composite
def insert_control(draw: st.DrawFn) -> Case:
    name = draw(st.sampled_from(["m.yaml", "s.yaml", "p.jsonl", "x.json"]))
    text = VALID[name]
    at = draw(st.integers(0, len(text)))
    # JSON allows DEL (and tabs between tokens); YAML allows neither DEL nor C0 controls but tab.
    ch = draw(st.sampled_from([c for c in CONTROL if c != "\x7f"] if name.endswith(("jsonl", "json")) else CONTROL))
    return Case("control-byte", {name: text[:at] + ch + text[at:]}, names=name)


@st.composite
def insert_bad_utf8(draw: st.DrawFn) -> Case:
    name = draw(st.sampled_from(["m.yaml", "s.yaml", "p.jsonl", "x.json"]))
    data = VALID[name].encode()
    at = draw(st.integers(0, len(data)))
    return Case("not-utf8", {name: data[:at] + draw(st.sampled_from(BAD_UTF8)) + data[at:]}, names=name)


@st.composite
def recursive_alias(draw: st.DrawFn) -> Case:
    inner = draw(st.sampled_from(["[*r]", "{k: *r}", "[1, [2, *r]]", "{a: [x, {b: *r}]}", "[*r, *r]"]))
    if draw(st.booleans()):
        return Case("recursive-alias", {"m.yaml": replace_line(MATRIX, "request", f"&r {inner}")})
    return Case("recursive-alias", {"s.yaml": f"x-r: &r {inner}\n" + SUITE}, names="s.yaml",
                command=draw(st.sampled_from(["matrix", "suite"])))


@st.composite
def deep_nesting(draw: st.DrawFn) -> Case:
    depth = draw(st.integers(101, 2000))
    opener = draw(st.sampled_from(["[", "{"]))
    if opener == "[":
        yaml_deep = json_deep = "[" * depth + "]" * depth
    else:
        yaml_deep = json_deep = '{"k": ' * depth + "1" + "}" * depth
    where = draw(st.sampled_from(["m.yaml", "s.yaml", "p.jsonl", "x.json"]))
    if where == "m.yaml":
        return Case("deep-nesting", {"m.yaml": replace_line(MATRIX, "request", f"{{x: {yaml_deep}}}")})
    if where == "s.yaml":
        return Case("deep-nesting", {"s.yaml": SUITE.replace("body: {max_tokens: 16}", f"body: {{x: {yaml_deep}}}")},
                    names="s.yaml", command="suite")
    if where == "p.jsonl":
        return Case("deep-nesting", {"p.jsonl": JSONL + '{"messages": [], "x": ' + json_deep + "}\n"},
                    names="p.jsonl", command="suite")
    return Case("deep-nesting", {"x.json": '{"type": "object", "x": ' + json_deep + "}"}, names="x.json",
                command="suite")


@st.composite
def bad_tag(draw: st.DrawFn) -> Case:
    if draw(st.booleans()):
        tag = draw(st.sampled_from(TAGS))
        planted = tag.startswith("!!python/object")
        value = f"{tag} ['touch pwned']" if planted else f"{tag} x"
        if tag in ("!!set", "!!omap", "!!pairs"):
            value = f"{tag} {{a: null}}" if tag == "!!set" else f"{tag} [{{a: 1}}]"
    else:
        value, planted = draw(st.sampled_from(BAD_TYPED)), False
    where = draw(st.sampled_from(["name", "request", "repeats", "suite-case", "suite-checks"]))
    if where == "request":
        return Case("tag", {"m.yaml": replace_line(MATRIX, "request", f"{{x: {value}}}")}, planted=planted)
    if where.startswith("suite"):
        line = "    checks: " if where == "suite-checks" else "    body: "
        text = SUITE.replace("  - id: a\n", f"  - id: a\n{line}{value}\n", 1) if where == "suite-checks" else \
            SUITE.replace("  - id: a\n    body: {messages: [{role: user, content: hi}]}\n",
                          f"  - id: a\n{line}{{messages: {value}}}\n")
        return Case("tag", {"s.yaml": text}, names="s.yaml", command="suite", planted=planted)
    return Case("tag", {"m.yaml": replace_line(MATRIX, where, value)}, planted=planted)


def bad_count_values(low: int, high: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["true", "false", ".inf", "-.inf", ".nan", "[]", "{}", "''", "1e30", "abc", "[1]"]),
        st.integers(max_value=low - 1).map(str),
        st.integers(min_value=high + 1, max_value=10**30).map(str),
        st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f) if abs(f) < 1e15 else True)
        .map(repr),
        st.text(alphabet="abcxyz", min_size=1, max_size=6).filter(lambda t: t not in ("y", "n")).map(yaml_str),
    )


@st.composite
def bad_count(draw: st.DrawFn) -> Case:
    where = draw(st.sampled_from([*COUNT_KEYS, "startup_s", "request_s", "suite-repeat", "case-repeat"]))
    if where in COUNT_KEYS:
        low, high = COUNT_KEYS[where]
        value = draw(bad_count_values(max(low, 1) if where != "gpus_per_cell" else 0, high))
        if where == "gpus_per_cell" and re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", value) and 0 <= float(value) <= 64:
            value = "65"  # a fraction of a GPU is a valid request
        return Case("count", {"m.yaml": replace_line(MATRIX, where, value)})
    if where in ("startup_s", "request_s"):
        value = draw(st.sampled_from(["0", "-1", ".inf", ".nan", "true", "false", "abc", "[]", "-0.5"]))
        return Case("count", {"m.yaml": replace_line(MATRIX, "timeouts", f"{{{where}: {value}}}")})
    value = draw(bad_count_values(1, 10**6))
    if where == "suite-repeat":
        return Case("count", {"s.yaml": SUITE.replace("  repeat: 2\n", f"  repeat: {value}\n")}, names="s.yaml",
                    command="suite")
    return Case("count", {"s.yaml": SUITE.replace("  - id: a\n", f"  - id: a\n    repeat: {value}\n")},
                names="s.yaml", command="suite")


IDENT = st.text(alphabet="ABCXYZabcxyz_019", min_size=0, max_size=6)
BREAKERS = ["=", " ", ".", "$", "/", "é", "\n", "\t", "\0", ":", "[", "*", "+", "'", '"', "\u2028"]


def broken_name(leading_ok: str) -> st.SearchStrategy[str]:
    """Names that a rule like `[A-Za-z_][A-Za-z0-9_]*` refuses: empty, a leading digit or dash, or
    a character outside the rule somewhere."""
    return st.one_of(
        st.just(""),
        st.builds(lambda d, rest: d + rest, st.sampled_from(["0", "9", "-"]), IDENT),
        st.builds(lambda a, c, b: leading_ok + a + c + b, IDENT, st.sampled_from(BREAKERS), IDENT),
    )


@st.composite
def bad_axis_name(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(["env", "serve", "request", "bare", "env-key", "serve-key"]))
    if kind in ("env", "env-key"):
        name = draw(broken_name("A"))
        if kind == "env-key":
            return Case("axis-name", {"m.yaml": replace_line(MATRIX, "env", f"{{{yaml_str(name)}: '1'}}")})
        axis = f"env.{name}"
    elif kind in ("serve", "serve-key"):
        name = draw(st.one_of(broken_name("--a"), IDENT.map(lambda t: t.lstrip("-")), st.just("--"),
                              st.just("-x"), IDENT.map(lambda t: f"--{t}.")))
        if kind == "serve-key":
            return Case("axis-name", {"m.yaml": MATRIX + f"serve: {{{yaml_str(name)}: x}}\n"})
        axis = f"serve.{name}"
    elif kind == "request":
        axis = "request." + draw(st.one_of(broken_name("a"), IDENT.map(lambda t: f"a.{t}b")))
    else:
        axis = draw(st.one_of(broken_name("a"), st.sampled_from(["commits", "spec", "Commit", "env", "serve.",
                                                                  "request", "flags.x", "vllm.x"])))
    return Case("axis-name", {"m.yaml": MATRIX + f"  {yaml_str(axis)}: ['1']\n"})


@st.composite
def duplicate_key(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(["top", "typed", "case-id", "suite-twice", "axis"]))
    if kind == "top":
        key = draw(st.sampled_from(["name", "model", "repeats", "concurrency", "env", "request"]))
        line = re.search(rf"^{key}: .*$", MATRIX, re.MULTILINE).group(0)  # type: ignore[union-attr]
        return Case("duplicate-key", {"m.yaml": MATRIX + line + "\n"})
    if kind == "typed":
        a, b = draw(st.sampled_from([("'1'", "1"), ("'null'", "null"), ("'1.5'", "1.5")]))
        return Case("duplicate-key", {"m.yaml": replace_line(MATRIX, "request", f"{{{a}: x, {b}: y}}")})
    if kind == "case-id":
        return Case("duplicate-key", {"s.yaml": SUITE.replace("  - id: b\n", "  - id: a\n")}, names="s.yaml",
                    command="suite")
    if kind == "suite-twice":
        return Case("duplicate-key", {"m.yaml": replace_line(MATRIX, "suite", "[s.yaml, ./s.yaml]")})
    return Case("duplicate-key", {"m.yaml": MATRIX + "  spec_method: [mtp]\n"})


@st.composite
def alias_bomb(draw: st.DrawFn) -> Case:
    levels, width = draw(st.integers(6, 12)), draw(st.integers(10, 12))
    lines = [f"x0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    bomb = "\n".join(lines) + "\n"
    if draw(st.booleans()):
        return Case("alias-bomb", {"s.yaml": bomb + SUITE}, names="s.yaml", command="suite")
    return Case("alias-bomb", {"m.yaml": MATRIX.replace("request: {max_tokens: 8}\n", "request:\n" + "".join(
        "  " + line + "\n" for line in bomb.splitlines()))})


@st.composite
def cut_off(draw: st.DrawFn) -> Case:
    name = draw(st.sampled_from(["m.yaml", "s.yaml", "p.jsonl", "x.json"]))
    text = VALID[name]
    if name.endswith(".yaml"):
        # Inside a flow collection: `[` or `{` opened and never closed.
        opens = [m.start() for m in re.finditer(r"[\[{]", text)]
        start = draw(st.sampled_from(opens))
        depth, end = 0, start
        for end in range(start, len(text)):
            depth += text[end] in "[{"
            depth -= text[end] in "]}"
            if depth == 0:
                break
        at = draw(st.integers(start + 1, end))
        return Case("cut-off", {name: text[:at]}, names=name, command="suite" if name == "s.yaml" else "matrix")
    at = draw(st.integers(1, text.rindex("}")))
    return Case("cut-off", {name: text[:at]}, names=name, command="suite")


@st.composite
def wrong_type(draw: st.DrawFn) -> Case:
    options = [
        ("m.yaml", "model", "[m]"), ("m.yaml", "model", "''"), ("m.yaml", "model", "{a: 1}"),
        ("m.yaml", "suite", "5"), ("m.yaml", "suite", "{a: b}"), ("m.yaml", "install", "preinstalled"),
        ("m.yaml", "install", "{kind: nope}"), ("m.yaml", "env", "[A]"), ("m.yaml", "env", "{A: [1]}"),
        ("m.yaml", "request", "[1, 2]"), ("m.yaml", "timeouts", "5"), ("m.yaml", "name", "[a]"),
        ("m.yaml", "axes", "[]"), ("m.yaml", "axes", "x"), ("m.yaml", "axes", "{}"),
        ("m.yaml", "axes", "{spec_method: []}"), ("m.yaml", "axes", "{spec_method: none}"),
        ("m.yaml", "axes", "{commit: [a, b]}"),
        ("s.yaml", "cases", "{}"), ("s.yaml", "cases", "[5]"), ("s.yaml", "cases", "[{id: a}]"),
        ("s.yaml", "cases", "[{body: {messages: []}}]"), ("s.yaml", "cases", "[{id: a, body: x}]"),
        ("s.yaml", "cases", "[{id: a, body: {messages: []}, checks: [nope]}]"),
        ("s.yaml", "cases", "[{id: a, body: {messages: []}, checks: 5}]"),
        ("s.yaml", "cases", "[{id: '', body: {messages: []}}]"), ("s.yaml", "jsonl", "5"),
        ("s.yaml", "jsonl", "[{file: nope.jsonl}]"), ("s.yaml", "defaults", "[]"), ("s.yaml", "name", "[a]"),
    ]
    name, key, value = draw(st.sampled_from(options))
    if name == "m.yaml" and key == "axes":
        return Case("wrong-type", {name: MATRIX.split("axes:\n")[0] + f"axes: {value}\n"})
    if name == "m.yaml":
        return Case("wrong-type", {name: replace_line(MATRIX, key, value)})
    text = SUITE.split("cases:\n")[0] if key != "cases" else SUITE.split("cases:\n")[0] + "jsonl:\n  - file: p.jsonl\n"
    if key == "name":
        text = replace_line(SUITE, key, value)
    elif key == "defaults":
        text = SUITE.replace("defaults:\n  repeat: 2\n  body: {max_tokens: 16}\n  checks: [http_ok]\n",
                             f"defaults: {value}\n")
    elif key == "jsonl":
        text = SUITE.replace("jsonl:\n  - file: p.jsonl\n", f"jsonl: {value}\n")
    else:
        text = text + f"cases: {value}\n"
    return Case("wrong-type", {name: text}, names=name, command=draw(st.sampled_from(["suite", "matrix"])))


@st.composite
def not_a_file(draw: st.DrawFn) -> Case:
    which = draw(st.sampled_from(["suite", "schema", "jsonl"]))
    target = draw(st.sampled_from(["/dev/zero", "/dev/null", ".", "/", "nope.yaml", "'\\0x'", "''",
                                   "a" * 5000, "b" * 300 + ".yaml", "/proc/self/mem"]))
    target = yaml_str("x\0y") if target == "'\\0x'" else target
    also = target if target.startswith("/") else None
    if which == "suite":
        return Case("not-a-file", {"m.yaml": replace_line(MATRIX, "suite", target)}, or_names=also)
    if which == "schema":
        return Case("not-a-file", {"s.yaml": SUITE.replace("schema_file: x.json", f"schema_file: {target}")},
                    names="s.yaml", command="suite", or_names=also)
    return Case("not-a-file", {"s.yaml": SUITE.replace("  - file: p.jsonl", f"  - file: {target}")},
                names="s.yaml", command="suite", or_names=also)


@st.composite
def bad_jsonl(draw: st.DrawFn) -> Case:
    line = draw(st.sampled_from([
        '{"messages": [], "temperature": NaN}', '{"messages": [], "x": Infinity}', "{'messages': []}",
        '{"messages": [],}', "[1, 2]", '"text"', "42", "null", '{"messages": "hi"}', '{"no": "messages"}',
        '{"messages": [{"role": "user", "content": "a"}]} {"messages": []}', '{"messages": [] ', "{" * 3,
        '{"messages": [{"role": "user", "content": "a\u2028b"}], "x": 1e999}',
        '{"messages": [], "messages": []}',
    ]))
    at = draw(st.integers(0, 1))
    lines = [JSONL.rstrip("\n")]
    lines.insert(at, line)
    return Case("jsonl", {"p.jsonl": "\n".join(lines) + "\n"}, names="p.jsonl", command="suite")


@st.composite
def huge_value(draw: st.DrawFn) -> Case:
    size = draw(st.integers(2**14, 2**17))
    where = draw(st.sampled_from(["commit", "name-key", "env-value", "axis-value"]))
    blob = draw(st.sampled_from("abz0-")) * size
    if where == "commit":
        return Case("huge-value", {"m.yaml": MATRIX + f"  commit: [{blob if blob[0] != '-' else 'a' + blob}]\n"})
    if where == "name-key":
        return Case("huge-value", {"m.yaml": MATRIX.replace("name: gen\n", f"name: gen\n{blob}x: 1\n")})
    if where == "env-value":
        return Case("huge-value", {"m.yaml": replace_line(MATRIX, "env", f"{{A: [{blob}]}}")})
    return Case("huge-value", {"m.yaml": MATRIX.replace('env.B: ["0", "1"]', f'env.B: [{{x: {blob}}}]')})


FAMILIES: dict[str, Callable[[], st.SearchStrategy[Case]]] = {
    "control-byte": insert_control, "not-utf8": insert_bad_utf8, "recursive-alias": recursive_alias,
    "deep-nesting": deep_nesting, "tag": bad_tag, "count": bad_count, "axis-name": bad_axis_name,
    "duplicate-key": duplicate_key, "alias-bomb": alias_bomb, "cut-off": cut_off, "wrong-type": wrong_type,
    "not-a-file": not_a_file, "jsonl": bad_jsonl, "huge-value": huge_value,
}


def run_case(case: Case, folder: Path) -> tuple[int, str, str]:
    for name, content in {**VALID, **case.files}.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    argv = ["suite", "show", str(folder / "s.yaml")] if case.command == "suite" else \
        ["matrix", str(folder / "m.yaml"), "--dry-run", "--runs-dir", str(folder / "runs")]
    out, err, code = io.StringIO(), io.StringIO(), 0
    old = sys.argv
    sys.argv = ["sweep", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


def test_the_valid_files_are_valid(tmp_path: Path) -> None:
    for command in ("matrix", "suite"):
        code, out, err = run_case(Case("valid", command=command), tmp_path)
        assert (code, err) == (0, ""), err
        assert out


@pytest.mark.full
@pytest.mark.timeout(1800)
def test_generated_malformed_inputs_are_one_line_and_exit_1() -> None:
    seen: Counter[str] = Counter()
    timings: list[tuple[float, str]] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(*(make() for make in FAMILIES.values())))
    def check(case: Case) -> None:
        seen[case.family] += 1
        with tempfile.TemporaryDirectory(prefix="sweep-gen-") as tmp:
            folder = Path(tmp)
            tracemalloc.reset_peak()
            cpu = time.process_time()
            code, out, err = run_case(case, folder)
            cpu = time.process_time() - cpu
            timings.append((cpu, case.family))
            peak = tracemalloc.get_traced_memory()[1]
            shown = f"{case.family}: {err[:300]!r}"
            assert code == 1, shown
            assert out == "", shown
            assert "Traceback" not in err and err.startswith("error: ") and err.endswith("\n"), shown
            assert err.count("\n") <= 2, shown
            assert case.names in err or (case.or_names and case.or_names in err), shown
            assert cpu < 5, f"{shown}: {cpu:.1f} s of CPU"
            assert peak < 500 * 2**20, f"{shown}: {peak / 2**20:.0f} MB"
            assert not (folder / "pwned").exists() and not Path("pwned").exists(), shown

    tracemalloc.start()
    try:
        check()
    finally:
        tracemalloc.stop()
    print("slowest:", sorted(timings, reverse=True)[:5], "total CPU s:", round(sum(t for t, _ in timings), 1))
    assert sum(seen.values()) >= EXAMPLES, seen
    assert set(seen) == set(FAMILIES), seen
    if EXAMPLES >= 300:
        assert min(seen.values()) >= (10 if EXAMPLES >= 1000 else 5), seen  # every family, several times
