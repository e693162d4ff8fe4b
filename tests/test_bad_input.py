"""Malformed matrices and suites through the real command line: exit 1, exactly one line on stderr
naming the file and the problem, no traceback, and quickly (pytest-timeout marks bound each case).

Each case writes its files to tmp_path and runs `sweep matrix m.yaml --dry-run` (or `sweep suite show
s.yaml`) through `sweeper.cli.main`, the console script's entry point; a few also run as a separate
process under a memory limit.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import run_cli

SUITE = "cases: [{id: a, body: {messages: [{role: user, content: hi}]}}]\n"
HEAD = "model: m\nsuite: s.yaml\ninstall: {kind: preinstalled}\n"
SIM_HEAD = "model: m\nsuite: s.yaml\ninstall: {kind: sim, repo: \"sim:demo\"}\n"  # several commits
AXES = "axes:\n  spec_method: [none]\n"
MSG = "messages: [{role: user, content: hi}]"


def matrix(extra: str = "", axes: str = AXES, head: str = HEAD) -> str:
    return head + extra + axes


def suite_with(case_extra: str = "", top: str = "") -> str:
    return top + f"cases:\n  - id: a\n    body: {{{MSG}}}\n" + case_extra


def bomb(levels: int, width: int = 10) -> str:
    """A billion-laughs document: `width ** levels` strings from a few hundred bytes."""
    lines = [f"x0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


Setup = Callable[[Path], None]


@dataclass
class Bad:
    id: str
    files: dict[str, str | bytes] = field(default_factory=dict)  # over the defaults m.yaml, s.yaml
    where: str = "m.yaml"       # the file the line must name
    says: str = ""              # a fragment of what was expected
    line: int | None = None     # the line it must name, when there is one
    command: str = "matrix"     # or "suite": `sweep suite show s.yaml`
    setup: Setup | None = None  # files that are not text: links, pipes, devices
    absent: tuple[str, ...] = ()  # text that must not appear (a file's contents)


def symlink_loop(tmp: Path) -> None:
    (tmp / "m.yaml").unlink()
    (tmp / "m.yaml").symlink_to(tmp / "m.yaml")


def directory(tmp: Path) -> None:
    (tmp / "m.yaml").unlink()
    (tmp / "m.yaml").mkdir()


def fifo_suite(tmp: Path) -> None:
    os.mkfifo(tmp / "pipe.yaml")


def sparse(name: str, size: int) -> Setup:
    def make(tmp: Path) -> None:
        with open(tmp / name, "wb") as f:
            f.truncate(size)
    return make


def fake_passwd(tmp: Path) -> None:
    (tmp / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nsecretuser:x:1000:1000::/home/s:/bin/sh\n")


BAD: list[Bad] = [
    # --- bytes YAML does not allow (ReaderError used to escape)
    Bad("nul-byte", {"m.yaml": matrix("name: a\0b\n")}, says="control character '\\x00'", line=4),
    Bad("ctrl-0x01", {"m.yaml": matrix("name: a\x01b\n")}, says="control character '\\x01'", line=4),
    Bad("escape", {"m.yaml": matrix("description: \x1b[31mred\n")}, says="control character '\\x1b'", line=4),
    Bad("ctrl-in-suite", {"s.yaml": SUITE + "name: a\x07\n"}, where="s.yaml", says="control character",
        command="suite"),
    Bad("not-utf8", {"m.yaml": matrix().encode() + b"name: \xff\xfe\n"}, says="not UTF-8"),
    # --- recursion (RecursionError used to escape)
    Bad("self-alias", {"m.yaml": matrix("request: &r {x: [*r]}\n")}, says="recursive", line=4),
    Bad("self-alias-list", {"s.yaml": suite_with(top="x-r: &r [*r]\n")}, where="s.yaml", says="recursive",
        command="suite"),
    Bad("deep-yaml-1000", {"m.yaml": matrix(f"request: {{x: {nested(1000)}}}\n")}, says="invalid YAML"),
    Bad("deep-yaml-150", {"m.yaml": matrix("request:\n" + "".join(
        "  " * (i + 1) + f"k{i}:\n" for i in range(150)))}, says="nested deeper than 100 levels"),
    Bad("deep-schema", {"s.yaml": suite_with("    schema_file: x.json\n"), "x.json": nested(1000)},
        where="x.json", says="nested deeper than 100", command="suite"),
    Bad("deep-jsonl", {"s.yaml": "jsonl:\n  - file: p.jsonl\n",
                       "p.jsonl": '{"messages": [{"role": "user", "content": "a"}], "x": ' + nested(5000) + "}\n"},
        where="p.jsonl", says="nested deeper than 100", line=1, command="suite"),
    # --- alias bombs: refused while parsing, before anything is built
    Bad("alias-bomb-1e5", {"m.yaml": matrix(bomb(5))}, says="aliases expand to more than 100,000"),
    Bad("alias-bomb-1e6-request", {"m.yaml": matrix("request:\n" + "".join(
        "  " + line + "\n" for line in bomb(6).splitlines()))}, says="aliases expand to more than 100,000"),
    Bad("alias-bomb-1e9-suite", {"s.yaml": bomb(9) + SUITE}, where="s.yaml", says="aliases expand",
        command="suite"),
    # --- tags outside plain data: an error, never dropped
    Bad("int-abc", {"m.yaml": matrix("repeats: !!int abc\n")}, says="'abc' is not a valid !!int", line=4),
    Bad("bool-abc", {"m.yaml": matrix("repeats: !!bool abc\n")}, says="not a valid !!bool", line=4),
    Bad("python-tag-list", {"m.yaml": matrix("request: {x: !!python/object/apply:os.system [echo]}\n")},
        says="unsupported tag '!!python/object/apply:os.system'", line=4),
    Bad("python-tag-map", {"s.yaml": suite_with(
        "    checks: !!python/object/apply:os.system {args: [touch pwned]}\n")},
        where="s.yaml", says="unsupported tag", line=4, command="suite"),
    Bad("python-name", {"m.yaml": matrix("name: !!python/name:os.system ''\n")}, says="unsupported tag"),
    Bad("binary-tag", {"m.yaml": matrix("name: !!binary aGk=\n")}, says="unsupported tag '!!binary'"),
    Bad("local-tag", {"m.yaml": matrix("name: !custom x\n")}, says="unsupported tag '!custom'"),
    Bad("huge-int", {"m.yaml": matrix("repeats: " + "9" * 5000 + "\n")}, says="number too large", line=4),
    Bad("two-documents", {"m.yaml": matrix() + "---\nmodel: n\n"}, says="one YAML document"),
    Bad("duplicate-key-after-types", {"m.yaml": matrix("request: {'1': a, 1: b}\n")},
        says="duplicate key '1'", line=4),
    Bad("duplicate-key", {"m.yaml": matrix("repeats: 2\nrepeats: 3\n")}, says="duplicate key 'repeats'", line=5),
    Bad("mapping-as-key", {"m.yaml": matrix("request:\n  ? [a, b]\n  : 1\n")}, says="plain scalars"),
    Bad("undefined-alias", {"m.yaml": matrix("request: {x: *nope}\n")}, says="names no anchor"),
    # --- files that are not files
    Bad("symlink-loop", setup=symlink_loop, says="too many levels of symbolic links"),
    Bad("directory-as-file", setup=directory, says="is a directory"),
    Bad("suite-dev-zero", {"m.yaml": matrix(head="model: m\nsuite: /dev/zero\ninstall: {kind: preinstalled}\n")},
        says="not a regular file", line=2),
    Bad("suite-fifo", {"m.yaml": matrix(head="model: m\nsuite: pipe.yaml\ninstall: {kind: preinstalled}\n")},
        setup=fifo_suite, says="not a regular file", line=2),
    Bad("schema-dev-zero", {"s.yaml": suite_with("    schema_file: /dev/zero\n")}, where="s.yaml",
        says="not a regular file", line=4, command="suite"),
    Bad("jsonl-dev-zero", {"s.yaml": "jsonl:\n  - file: /dev/zero\n"}, where="s.yaml",
        says="not a regular file", line=2, command="suite"),
    Bad("suite-too-large", {"m.yaml": matrix(head="model: m\nsuite: big.yaml\ninstall: {kind: preinstalled}\n")},
        setup=sparse("big.yaml", 17 * 2**20), where="big.yaml", says="file too large"),
    Bad("jsonl-too-large", {"s.yaml": "jsonl:\n  - file: big.jsonl\n"}, setup=sparse("big.jsonl", 17 * 2**20),
        where="s.yaml", says="file too large", line=2, command="suite"),
    Bad("nul-in-schema-path", {"s.yaml": suite_with('    schema_file: "x\\0.json"\n')}, where="s.yaml",
        says="NUL byte", line=4, command="suite"),
    Bad("nul-in-jsonl-path", {"s.yaml": 'jsonl:\n  - file: "p\\0.jsonl"\n'}, where="s.yaml", says="NUL byte",
        line=2, command="suite"),
    Bad("long-suite-path", {"m.yaml": matrix(head=f"model: m\nsuite: {'a' * 5000}\ninstall: {{kind: preinstalled}}\n")},
        says="path too long (5,000 characters", line=2),
    Bad("long-path-component", {"m.yaml": matrix(head=f"model: m\nsuite: {'a' * 300}.yaml\n"
                                                      "install: {kind: preinstalled}\n")},
        says="file name too long", line=2),
    Bad("empty-suite-path", {"m.yaml": matrix(head="model: m\nsuite: ''\ninstall: {kind: preinstalled}\n")},
        says="suite: empty path", line=2),
    Bad("suite-passwd", {"m.yaml": matrix(head="model: m\nsuite: passwd\ninstall: {kind: preinstalled}\n")},
        setup=fake_passwd, where="passwd", says="expected a suite mapping", absent=("/bin/bash", "secretuser")),
    Bad("suite-listed-twice", {"m.yaml": matrix(head="model: m\nsuite: [s.yaml, ./s.yaml]\n"
                                                     "install: {kind: preinstalled}\n")},
        says="listed twice", line=2),
    # --- axis and setting names
    Bad("request-dotted", {"m.yaml": matrix(axes="axes:\n  request.chat_template_kwargs.enable_thinking: [true]\n")},
        says="request field is top-level", line=5),
    Bad("serve-dashes-only", {"m.yaml": matrix(axes="axes:\n  serve.--: [a]\n")}, says="expected a flag name",
        line=5),
    Bad("env-axis-equals", {"m.yaml": matrix(axes="axes:\n  env.A=B: ['1']\n")},
        says="environment variable name", line=5),
    Bad("env-axis-newline", {"m.yaml": matrix(axes='axes:\n  "env.X\\nY": [\'1\']\n')},
        says="environment variable name", line=5),
    Bad("env-name-empty", {"m.yaml": matrix("env: {'': '1'}\n")}, says="environment variable name", line=4),
    Bad("env-name-equals", {"m.yaml": matrix("env: {A=B: '1'}\n")}, says="environment variable name", line=4),
    Bad("serve-flag-dashes", {"m.yaml": matrix("serve: {'--': true}\n")}, says="expected a flag name", line=4),
    Bad("request-field-dotted", {"m.yaml": matrix("request: {a.b: 1}\n")}, says="request field is top-level", line=4),
    Bad("sim-history", {"m.yaml": matrix(head='model: m\nsuite: s.yaml\ninstall: {kind: sim, repo: "sim:nope"}\n')},
        says="unknown simulated history 'sim:nope'", line=3),
    Bad("pydantic-names", {"m.yaml": matrix(head="model: m\nsuite: 5\ninstall: {kind: preinstalled}\n")},
        says="suite: ", line=2, absent=("suite.str", "list[str]")),
    Bad("suite-internal-model", {"s.yaml": "cases: [5]\n"}, where="s.yaml", says="expected a mapping, got an integer",
        command="suite", absent=("_CaseIn",)),
    # --- counts: integers, never booleans, within sane bounds
    Bad("repeats-1e30", {"m.yaml": matrix("repeats: 1e30\n")}, says="valid integer", line=4),
    Bad("repeats-float", {"m.yaml": matrix("repeats: 1.0e30\n")}, says="valid integer", line=4),
    Bad("repeats-true", {"m.yaml": matrix("repeats: true\n")}, says="valid integer", line=4),
    Bad("repeats-too-many", {"m.yaml": matrix("repeats: 1001\n")}, says="less than or equal to 1000", line=4),
    Bad("concurrency-true", {"m.yaml": matrix("concurrency: true\n")}, says="valid integer", line=4),
    Bad("concurrency-too-many", {"m.yaml": matrix("concurrency: 5000\n")}, says="4096", line=4),
    Bad("gpus-true", {"m.yaml": matrix("gpus_per_cell: true\n")}, says="valid number", line=4),
    Bad("gpus-inf", {"m.yaml": matrix("gpus_per_cell: .inf\n")}, says="finite number", line=4),
    Bad("gpus-too-many", {"m.yaml": matrix("gpus_per_cell: 65\n")}, says="64", line=4),
    Bad("timeout-true", {"m.yaml": matrix("timeouts: {startup_s: true}\n")}, says="valid number", line=4),
    Bad("timeout-nan", {"m.yaml": matrix("timeouts: {request_s: .nan}\n")}, says="finite number", line=4),
    Bad("timeout-zero", {"m.yaml": matrix("timeouts: {group_s: 0}\n")}, says="greater than 0", line=4),
    Bad("nst-2**63", {"m.yaml": matrix(axes="axes:\n  spec_method: [mtp]\n  num_speculative_tokens: [9223372036854775808]\n")},
        says="at most 128", line=6),
    Bad("nst-true", {"m.yaml": matrix(axes="axes:\n  spec_method: [mtp]\n  num_speculative_tokens: [true]\n")},
        says="positive integer", line=6),
    Bad("cache-negative", {"m.yaml": matrix(head="model: m\nsuite: s.yaml\ninstall: {kind: preinstalled, cache_max_gb: -5}\n")},
        says="greater than 0", line=3),
    Bad("suite-repeat-2**31", {"s.yaml": suite_with("    repeat: 2147483648\n")}, where="s.yaml",
        says="less than or equal to 1000000", line=4, command="suite"),
    Bad("suite-repeat-true", {"s.yaml": suite_with(top="defaults: {repeat: true}\n")}, where="s.yaml",
        says="valid integer", line=1, command="suite"),
    Bad("too-many-cells", {"m.yaml": matrix(axes="axes:\n" + "".join(
        f"  env.A{i}: [{', '.join(repr(str(v)) for v in range(10))}]\n" for i in range(5)))},
        says="100,000 combinations"),
    # --- values: bounded, and never flooding the error line
    Bad("commit-1mb", {"m.yaml": matrix(axes="axes:\n  commit: [" + "a" * 2**20 + "]\n")},
        says="value too long (1,048,576 characters", line=5),
    Bad("commit-300", {"m.yaml": matrix(head=SIM_HEAD, axes="axes:\n  commit: [" + "a" * 300 + "]\n")},
        says="at most 255 characters", line=5),
    Bad("commit-option", {"m.yaml": matrix(head=SIM_HEAD, axes="axes:\n  commit: ['--upload-pack=x']\n")},
        says="not starting with -", line=5),
    Bad("no-install", {"m.yaml": matrix(head="model: m\nsuite: s.yaml\n")},
        says="install: required (kind: sim, preinstalled, wheels, source, pip)", line=1),
    Bad("kind-long-value", {"m.yaml": matrix(head="model: m\nsuite: s.yaml\ninstall: {kind: " + "d" * 60000 + "}\n")},
        says="expected one of", line=3),
    Bad("key-with-newlines", {"m.yaml": matrix('"a\\nb\\nc\\nd": 1\n')}, says="unknown key", line=4),
    Bad("env-value-nul", {"m.yaml": matrix('env: {A: "x\\0y"}\n')}, says="NUL character", line=4),
    Bad("body-inf", {"s.yaml": suite_with(top="defaults: {body: {temperature: .inf}}\n")}, where="s.yaml",
        says="finite number", line=1, command="suite"),
    Bad("jsonl-nan", {"s.yaml": "jsonl:\n  - file: p.jsonl\n",
                      "p.jsonl": '{"messages": [{"role": "user", "content": "a"}], "temperature": NaN}\n'},
        where="p.jsonl", says="NaN is not valid JSON", line=1, command="suite"),
    Bad("empty-matrix", {"m.yaml": ""}, says="expected a mapping with model, suite and axes"),
    # --- the design and cost keys
    Bad("design-unknown", {"m.yaml": matrix("design: triples\n")},
        says="design: expected full, covering or covering:T (T from 1 to 6), got 'triples'", line=4),
    Bad("design-strength-0", {"m.yaml": matrix("design: covering:0\n")}, says="got 'covering:0'", line=4),
    Bad("design-strength-7", {"m.yaml": matrix("design: covering:7\n")}, says="got 'covering:7'", line=4),
    Bad("design-full-strength", {"m.yaml": matrix("design: full:2\n")}, says="got 'full:2'", line=4),
    Bad("design-mapping-strength", {"m.yaml": matrix("design: {kind: covering, strength: 9}\n")},
        says="design.strength: ", line=4),
    Bad("design-mapping-seed", {"m.yaml": matrix("design: {kind: covering, seed: -1}\n")},
        says="design.seed: ", line=4),
    Bad("design-mapping-key", {"m.yaml": matrix("design: {kind: covering, t: 3}\n")}, says="unknown key", line=4),
    Bad("cost-negative", {"m.yaml": matrix("cost: {start_s: -1}\n")}, says="cost.start_s: ", line=4),
    Bad("cost-unknown", {"m.yaml": matrix("cost: {boot_s: 1}\n")},
        says="unknown key; expected one of: install_s, start_s, request_s", line=4),
]


def write_case(tmp_path: Path, case: Bad) -> list[str]:
    files: dict[str, str | bytes] = {"s.yaml": SUITE, "m.yaml": matrix(), **case.files}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    if case.setup:
        case.setup(tmp_path)
    if case.command == "suite":
        return ["suite", "show", str(tmp_path / "s.yaml")]
    return ["matrix", str(tmp_path / "m.yaml"), "--dry-run", "--runs-dir", str(tmp_path / "runs")]


def check_line(case: Bad, code: int, err: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, f"expected one line, got {err!r}"
    line = err.rstrip("\n")
    assert line.startswith("error: ")
    assert len(line) < 700, f"{len(line)} characters"
    assert re.search(rf"{re.escape(case.where)}:(\d+: |(?!\d))", line), line
    if case.line is not None:
        assert f"{case.where}:{case.line}: " in line, line
    assert case.says in line
    for text in case.absent:
        assert text not in line


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_input_is_one_line_and_exit_1(case: Bad, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = write_case(tmp_path, case)
    code, out, err = run_cli(argv, capsys)
    check_line(case, code, err)
    assert out == ""


def test_the_table_has_no_duplicate_ids() -> None:
    assert len({c.id for c in BAD}) == len(BAD)


@pytest.mark.timeout(20)
@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = write_case(tmp_path, Bad("unreadable"))
    (tmp_path / "s.yaml").chmod(0)
    code, _, err = run_cli(argv, capsys)
    check_line(Bad("unreadable", where="s.yaml", says="permission denied"), code, err)


@pytest.mark.timeout(20)
def test_permission_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same as `test_unreadable_suite` where the tests run as root: the OS refuses the open."""
    argv = write_case(tmp_path, Bad("unreadable"))
    real_open = os.open

    def refuse(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith("s.yaml"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refuse)
    code, _, err = run_cli(argv, capsys)
    check_line(Bad("unreadable", where="s.yaml", says="cannot read: permission denied"), code, err)


@pytest.mark.timeout(20)
def test_planted_python_tag_creates_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pwned = tmp_path / "pwned"
    text = matrix(f"request: {{x: !!python/object/apply:os.system ['touch {pwned}']}}\n")
    argv = write_case(tmp_path, Bad("planted", {"m.yaml": text}))
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and "unsupported tag" in err
    assert not pwned.exists()


# --- valid edge cases stay valid

GOOD: list[tuple[str, dict[str, str], str]] = [
    ("unicode", {"m.yaml": matrix("name: démo-ü\ndescription: 'Ünïcödé ✓ 日本語'\nrequest: {user: 'Zoë'}\n",
                                  axes="axes:\n  env.GREETING: ['grüß dich']\n  request.stop: ['✓', '\u2028']\n"),
                 "s.yaml": "cases: [{id: a, body: {messages: [{role: user, content: 'héllo \u2028 wörld'}]}}]\n"},
     "matrix"),
    ("u2028-in-jsonl", {"s.yaml": "jsonl:\n  - file: p.jsonl\n",
                        "p.jsonl": '{"messages": [{"role": "user", "content": "a\u2028b\u0085c"}]}\r\n'
                                   '\n{"messages": [{"role": "user", "content": "d"}]}\n'}, "suite"),
    ("anchors-and-merge-keys", {"m.yaml": HEAD + "request: &req {temperature: 0, max_tokens: 8}\n"
                                "spec_config:\n  ngram:\n    <<: *req\n    max_tokens: 3\n"
                                "axes:\n  spec_method: &methods [none, ngram, mtp]\n"
                                "exclude:\n  - {spec_method: none}\n"}, "matrix"),
    ("suite-anchors", {"s.yaml": "x-checks: &c [http_ok]\nx-body: &b {max_tokens: 4}\ncases:\n"
                                 f"  - {{id: a, checks: *c, body: {{<<: *b, {MSG}}}}}\n"
                                 f"  - {{id: b, checks: *c, body: {{<<: *b, {MSG}}}}}\n"}, "suite"),
    ("dates-stay-strings", {"m.yaml": matrix("description: 2024-01-01\nrequest: {user: 2024-01-01}\n")}, "matrix"),
    ("large-but-sane", {"m.yaml": matrix(axes="axes:\n" + "".join(
        f"  env.A{i}: [{', '.join(repr(str(v)) for v in range(6))}]\n" for i in range(3)) +
        "  request.temperature: [0, 0.5, 1]\n")}, "matrix"),
    ("bounds-inclusive", {"m.yaml": matrix("repeats: 1000\nconcurrency: 4096\ngpus_per_cell: 64\n"
                                           "timeouts: {startup_s: 1, request_s: 0.5}\n",
                                           axes="axes:\n  spec_method: [mtp]\n  num_speculative_tokens: [128]\n")},
     "matrix"),
    ("design-and-cost", {"m.yaml": matrix("design: covering:2\ncost: {start_s: 30, install_s: 0}\n")}, "matrix"),
    ("design-mapping", {"m.yaml": matrix("design: {kind: covering, strength: 2, seed: 7}\n")}, "matrix"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "files", "command"), GOOD, ids=[g[0] for g in GOOD])
def test_valid_edge_cases_are_accepted(name: str, files: dict[str, str], command: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    argv = write_case(tmp_path, Bad(name, dict(files), command=command))
    code, out, err = run_cli(argv, capsys)
    assert (code, err) == (0, ""), err
    assert out


# --- the console script itself, as a separate process with a memory limit

def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case_id", ["ctrl-0x01", "alias-bomb-1e9-suite", "suite-dev-zero", "symlink-loop"])
def test_console_script(case_id: str, tmp_path: Path) -> None:
    case = next(c for c in BAD if c.id == case_id)
    argv = write_case(tmp_path, case)
    done = subprocess.run([sys.executable, "-m", "sweeper", *argv], capture_output=True, text=True, check=False,
                          preexec_fn=_limit_memory, timeout=50, env={**os.environ, "COLUMNS": "80"})
    check_line(case, done.returncode, done.stderr)


@pytest.mark.timeout(20)
def test_size_cap_is_configurable(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    argv = write_case(tmp_path, Bad("small-cap"))
    monkeypatch.setenv("SWEEP_MAX_FILE_BYTES", "20")
    code, _, err = run_cli(argv, capsys)
    check_line(Bad("small-cap", says="file too large"), code, err)
