"""Input files with positions: every error about a value can name its file and line.

This is the one boundary every input file (matrix, suite, JSON schema, JSONL) passes:
`read_text(path)` reads a regular file of bounded size, `load(path)` parses YAML into plain
Python data plus a `Positions` map from key paths to lines, `parse_json`/`jsonl_lines` read JSON.
`validate(model, data, positions)` runs a pydantic model and turns its first error into a
one-line `ConfigError` (file:line: key: what was expected). Whatever the file holds, what comes
out is data or a `ConfigError`: never a traceback, a hang or an unbounded read.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from sweeper.errors import ConfigError, clip, one_line

PathKey = tuple[str | int, ...]
M = TypeVar("M", bound=pydantic.BaseModel)


class Positions:
    """Line numbers (1-based) of the values in one YAML file, by key path."""

    def __init__(self, file: str, lines: dict[PathKey, int]) -> None:
        self.file = file
        self._lines = lines

    def line(self, path: PathKey) -> int | None:
        # An error deep inside a value points at the nearest enclosing key we know.
        path = tuple(path)
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return self._lines.get((), None)

    def error(self, path: PathKey, message: str) -> ConfigError:
        return ConfigError(message, file=self.file, line=self.line(path), key=dotted(path) or None)

    def sub(self, prefix: PathKey) -> Positions:
        """Positions of a nested value, re-rooted so paths start inside it."""
        n = len(prefix)
        return Positions(self.file, {k[n:]: v for k, v in self._lines.items() if k[:n] == tuple(prefix)})


def dotted(path: PathKey) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- reading: the one boundary every input file passes -------------------------------------------

MAX_FILE_BYTES = 16 * 2**20   # default size cap of any input file; SWEEP_MAX_FILE_BYTES overrides it
MAX_PATH_CHARS = 4096         # PATH_MAX on Linux
MAX_DEPTH = 100               # nesting of YAML and JSON values (deeper recurses in every consumer)
MAX_ALIAS_NODES = 100_000     # values that YAML aliases may add by repetition (billion laughs)
MAX_NODES = 1_000_000         # values in one YAML document, aliases counted as what they repeat


def max_file_bytes() -> int:
    raw = os.environ.get("SWEEP_MAX_FILE_BYTES")
    if raw is None:
        return MAX_FILE_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"SWEEP_MAX_FILE_BYTES: expected a positive number of bytes, got {clip(raw)}")
    return value


def path_problem(path: str) -> str | None:
    """Why `path` can never name a file (before the OS is asked), or None."""
    if not path:
        return "empty path"
    if "\0" in path:
        return "the path contains a NUL byte"
    if len(path) > MAX_PATH_CHARS:
        return f"path too long ({len(path):,} characters; at most {MAX_PATH_CHARS:,})"
    return None


def os_reason(exc: OSError) -> str:
    """What the OS said, without the file name (the caller names the file once)."""
    return (exc.strerror or type(exc).__name__).lower() if not isinstance(exc, FileNotFoundError) \
        else "no such file"


def read_text(path: str | Path, *, limit: int | None = None) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes. Every failure is a ConfigError
    naming the file: a device (`/dev/zero`), pipe or directory is refused before it is read, and
    nothing beyond the cap is ever read."""
    name = str(path)
    if problem := path_problem(name):
        raise ConfigError(problem, file=name)
    cap = max_file_bytes() if limit is None else limit
    try:
        # stat first: opening a device or a pipe can block or have effects of its own.
        _check_regular(os.stat(name), cap)
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
        try:
            _check_regular(os.fstat(fd), cap)
            chunks, total = [], 0
            while total <= cap:
                chunk = os.read(fd, min(cap + 1 - total, 2**20))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        finally:
            os.close(fd)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=name) from None
    except OSError as exc:
        raise ConfigError(os_reason(exc) if isinstance(exc, FileNotFoundError) else f"cannot read: {os_reason(exc)}",
                          file=name) from None
    except ValueError as exc:  # what os.* says of paths it cannot take
        raise ConfigError(f"cannot read: {one_line(str(exc))}", file=name) from None
    if total > cap:
        raise ConfigError(f"file too large (more than {cap:,} bytes)", file=name)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                          file=name, line=line) from None


def _check_regular(st: os.stat_result, cap: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError("is a directory; expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("not a regular file (a device, pipe or socket); expected a file")
    if st.st_size > cap:
        raise ConfigError(f"file too large ({st.st_size:,} bytes; at most {cap:,})")


# --- YAML: a safe subset, built from the event stream --------------------------------------------
#
# The document is built in one loop over parser events, never by recursion, so nesting and
# self-referencing aliases are limits with a line number, not RecursionErrors. Only plain data is
# allowed: strings, numbers, booleans, null, lists and mappings. Any other tag (`!!python/…`,
# `!!binary`, `!custom`) is an error: dropping it silently would run a file that means something else.

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_CORE}{t}" for t in ("str", "int", "float", "bool", "null")}
_MERGE = f"{_CORE}merge"
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class _PyParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):  # type: ignore[misc]  # PyYAML is untyped
    """The pure-Python parser, where PyYAML was built without libyaml (slower, same events)."""

    def __init__(self, text: str) -> None:
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


# libyaml parses about 30 times faster: a 16 MB file in seconds, not minutes.
_Parser: Any = yaml.cyaml.CParser if yaml.__with_libyaml__ else _PyParser


class _Resolver(yaml.resolver.Resolver):  # type: ignore[misc]  # PyYAML is untyped
    """YAML 1.1 as PyYAML's safe loader reads it, less the implicit tags outside plain data:
    `2024-01-01` stays a string (not a date), `=` stays a string."""


_Resolver.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (f"{_CORE}timestamp", f"{_CORE}value")]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}
_resolver = _Resolver()
_constructor = yaml.constructor.SafeConstructor()


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


class _Open:
    """A list or mapping being built."""

    __slots__ = ("anchor", "items", "key", "key_line", "line", "merged", "path", "size")

    def __init__(self, items: list[Any] | dict[str, Any], path: PathKey, anchor: str | None, line: int) -> None:
        self.items, self.path, self.anchor, self.line = items, path, anchor, line
        self.key: str | _MergeKey | None = None
        self.key_line = 0
        self.merged: dict[str, Any] = {}  # `<<:` entries: explicit keys override them
        self.size = 1


def _scalar(event: Any, line: int) -> Any:
    tag = event.tag
    if tag in (None, "!"):
        tag = _resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
    elif tag not in _SCALAR_TAGS:
        raise ConfigError(f"unsupported tag {clip(_tag_name(tag))}; expected plain data (strings, numbers, "
                          "booleans, null, lists, mappings)", line=line)
    elif tag != f"{_CORE}str" and _resolver.resolve(yaml.ScalarNode, event.value, (True, False)) not in (
            (tag, f"{_CORE}int") if tag == f"{_CORE}float" else (tag,)):
        raise ConfigError(f"{clip(event.value)} is not a valid {_tag_name(tag)}", line=line)
    if tag == _MERGE:
        return _MERGE_KEY
    if tag not in _SCALAR_TAGS:
        raise ConfigError(f"unsupported tag {clip(_tag_name(tag))}", line=line)
    node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
    try:
        return _constructor.construct_object(node)
    except ValueError:  # an integer of more than 4,300 digits
        raise ConfigError(f"number too large: {clip(event.value, 40)}", line=line) from None


class _MergeKey:
    def __repr__(self) -> str:
        return "'<<'"


_MERGE_KEY = _MergeKey()


def _build(text: str) -> tuple[Any, dict[PathKey, int]]:  # noqa: PLR0912, PLR0915  (one parser loop, one branch per event)
    parser = _Parser(text)
    lines: dict[PathKey, int] = {}
    anchors: dict[str, tuple[Any, int]] = {}
    stack: list[_Open] = []
    open_anchors: set[str] = set()
    alias_nodes = nodes = 0
    documents = 0
    root: Any = None

    def add(value: Any, size: int, line: int, key_ok: bool) -> None:
        nonlocal root
        if not stack:
            root = value
            return
        top = stack[-1]
        top.size += size
        if isinstance(top.items, list):
            top.items.append(value)
            return
        if top.key is None:  # this value is a key
            if not key_ok:
                raise ConfigError("mapping keys must be plain scalars", line=line)
            top.key, top.key_line = _key(value, line), line
            return
        key, top.key = top.key, None
        if isinstance(key, _MergeKey):
            _merge_into(top, value, line)
            return
        if key in top.items:
            raise ConfigError(f"duplicate key {clip(key)}", line=top.key_line)
        top.items[key] = value
        lines[(*top.path, key)] = top.key_line

    def path_of_next() -> PathKey:
        if not stack:
            return ()
        top = stack[-1]
        if isinstance(top.items, list):
            return (*top.path, len(top.items))
        if top.key is None:
            return top.path
        return (*top.path, "<<" if isinstance(top.key, _MergeKey) else top.key)

    while True:
        event = parser.get_event()
        line = event.start_mark.line + 1 if event.start_mark else 0
        nodes += 1
        if nodes > MAX_NODES:
            raise ConfigError(f"more than {MAX_NODES:,} values in one file", line=line)
        if isinstance(event, yaml.StreamEndEvent):
            break
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise ConfigError("expected one YAML document, found a second one (---)", line=line)
            continue
        if isinstance(event, (yaml.StreamStartEvent, yaml.DocumentEndEvent)):
            continue
        if isinstance(event, yaml.ScalarEvent):
            value = _scalar(event, line)
            if not (stack and isinstance(stack[-1].items, dict) and stack[-1].key is None):  # not a key
                lines.setdefault(path_of_next(), line)
            if event.anchor:
                anchors[event.anchor] = (value, 1)
            add(value, 1, line, key_ok=True)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            is_map = isinstance(event, yaml.MappingStartEvent)
            expected = f"{_CORE}{'map' if is_map else 'seq'}"
            if event.tag not in (None, "!", expected):
                raise ConfigError(f"unsupported tag {clip(_tag_name(event.tag))}; expected plain data (strings, "
                                  "numbers, booleans, null, lists, mappings)", line=line)
            if stack and isinstance(stack[-1].items, dict) and stack[-1].key is None:
                raise ConfigError("mapping keys must be plain scalars", line=line)
            if len(stack) >= MAX_DEPTH:
                raise ConfigError(f"nested deeper than {MAX_DEPTH} levels", line=line)
            path = path_of_next()
            lines.setdefault(path, line)
            stack.append(_Open({} if is_map else [], path, event.anchor, line))
            if event.anchor:
                open_anchors.add(event.anchor)
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            done = stack.pop()
            items: Any = done.items
            if isinstance(items, dict) and done.merged:
                items = {**done.merged, **items}
            if done.anchor:
                open_anchors.discard(done.anchor)
                anchors[done.anchor] = (items, done.size)
            add(items, done.size, done.line, key_ok=False)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                raise ConfigError(f"alias *{clip(event.anchor)[1:-1]} refers to a node that contains it "
                                  "(a recursive structure)", line=line)
            if event.anchor not in anchors:
                raise ConfigError(f"alias *{clip(event.anchor)[1:-1]} names no anchor defined before it", line=line)
            value, size = anchors[event.anchor]
            alias_nodes += size
            nodes += size
            if alias_nodes > MAX_ALIAS_NODES:
                raise ConfigError(f"aliases expand to more than {MAX_ALIAS_NODES:,} values; "
                                  "write the data out or reuse less", line=line)
            lines.setdefault(path_of_next(), line)
            add(value, size, line, key_ok=not isinstance(value, (list, dict)))
    return root, lines


def _key(value: Any, line: int) -> Any:
    if value is _MERGE_KEY:
        return value
    if value is None:
        return "null"
    if isinstance(value, (str, int, float)):
        return value if isinstance(value, str) else str(value)
    raise ConfigError("mapping keys must be plain scalars", line=line)


def _merge_into(top: _Open, value: Any, line: int) -> None:
    """`<<: *base` or `<<: [*a, *b]`: keys of earlier mappings win, explicit keys win over all."""
    sources = value if isinstance(value, list) else [value]
    if not sources or not all(isinstance(v, dict) for v in sources):
        raise ConfigError("`<<` merges a mapping or a list of mappings", line=line)
    for source in reversed(sources):
        top.merged.update(source)


def loads(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text; every problem becomes a ConfigError naming file:line."""
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise ConfigError(f"control character {clip(bad.group())} is not allowed in YAML", file=file, line=line)
    try:
        data, lines = _build(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError(f"invalid YAML: {exc.problem or exc.context}", file=file,
                          line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:  # ReaderError and friends: no mark, but still one line
        raise ConfigError(f"invalid YAML: {one_line(str(exc))}", file=file) from None
    except ConfigError as exc:
        raise ConfigError(exc.message, file=file, line=exc.line, key=exc.key) from None
    except RecursionError:  # guarded against above; kept so a gap is still one line
        raise ConfigError(f"nested deeper than {MAX_DEPTH} levels", file=file) from None
    if data is None and () not in lines:
        lines[()] = 1
    return data, Positions(file, lines)


def load(path: str | Path) -> tuple[Any, Positions]:
    return loads(read_text(path), str(path))


# --- JSON and JSON Lines ------------------------------------------------------------------------

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str, file: str, line: int | None = None) -> Any:
    """One JSON value (a whole file, or one JSON Lines line when `line` is given)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON: {exc.msg} (column {exc.colno})", file=file,
                          line=line if line is not None else exc.lineno) from None
    except RecursionError:
        raise ConfigError(f"invalid JSON: nested deeper than {MAX_DEPTH} levels", file=file, line=line) from None
    except ValueError as exc:  # NaN/Infinity, or an integer of more than 4,300 digits
        raise ConfigError(f"invalid JSON: {one_line(str(exc))[:120]}", file=file, line=line) from None
    if depth(value) > MAX_DEPTH:
        raise ConfigError(f"invalid JSON: nested deeper than {MAX_DEPTH} levels", file=file, line=line)
    return value


def jsonl_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines. JSON Lines separates on `\n` only: U+2028 or
    U+0085 inside a string are legal JSON, and `str.splitlines()` would break the line there."""
    return [(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip(" \t\r")]


def depth(value: Any) -> int:
    """How deeply lists and mappings nest in `value` (a scalar is 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:
            todo.extend((child, level + 1) for child in children)
    return deepest


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _expected(err: Any) -> str:
    kind, msg, ctx = err["type"], err["msg"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '')}, got {clip(err.get('input'))}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        # pydantic names its internal classes here ("instance of _CaseIn"): say what the file needs.
        return f"expected a mapping, got {_kind(err.get('input'))}"
    if "input" in err and kind not in ("value_error", "assertion_error"):
        shown = _kind(err["input"]) if isinstance(err["input"], (dict, list)) else clip(err["input"])
        return f"{msg}, got {shown}"
    return str(msg).removeprefix("Value error, ")


def _data_loc(data: Any, loc: tuple[Any, ...], missing: bool = False) -> PathKey:
    """`loc` without pydantic's own parts (union members such as `str` or `list[str]`, validator
    names): what is left are keys and indexes of `data`, the last possibly a missing key."""
    out: list[str | int] = []
    current = data
    for i, part in enumerate(loc):
        if (isinstance(current, dict) and part in current) or (
                isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)):
            out.append(part)
            current = current[part]
        elif missing and isinstance(current, dict) and i == len(loc) - 1 and isinstance(part, str):
            out.append(part)
    return tuple(out)


def validate(model: type[M], data: Any, positions: Positions, prefix: PathKey = (),
             context: dict[str, Any] | None = None) -> M:
    """Build `model` from `data`; the first validation error becomes a ConfigError with a position."""
    try:
        return model.model_validate(data, context=context)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        # Prefer the most specific error: unions report one per branch, and the deepest names the key.
        err = max(errors, key=lambda e: len(_data_loc(data, e["loc"], e["type"] == "missing")))
        loc = _data_loc(data, err["loc"], err["type"] == "missing")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, loc[:-1])
            msg = "unknown key" + (f"; expected one of: {', '.join(allowed)}" if allowed else "")
        else:
            msg = _expected(err)
        raise positions.error((*prefix, *loc), msg) from None


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation like `Model | None` or `list[Model]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(model: type[pydantic.BaseModel], parent: PathKey) -> list[str]:
    current: Any = model
    for part in parent:
        if isinstance(part, int):
            continue  # list items: the model found for the list is the item's model
        if current is None:
            break
        field = current.model_fields.get(part)
        current = _model_in(field.annotation) if field else None
    if current is not None:
        return [f.alias or n for n, f in current.model_fields.items()]
    return []
