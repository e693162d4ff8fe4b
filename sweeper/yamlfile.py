"""YAML input files with positions: every error about a value can name its file and line.

`load(path)` returns plain Python data plus a `Positions` map from key paths to lines.
`validate(model, data, positions)` runs a pydantic model and turns its first error into a
one-line `ConfigError` (file:line: key: what was expected).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from sweeper.errors import ConfigError

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


class _Loader(yaml.SafeLoader):
    pass


def _construct(node: yaml.Node, path: PathKey, lines: dict[PathKey, int], loader: _Loader) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ConfigError("mapping keys must be plain scalars", file=None,
                                  line=key_node.start_mark.line + 1)
            if key in out:
                raise ConfigError(f"duplicate key {key!r}", line=key_node.start_mark.line + 1)
            skey = key if isinstance(key, str) else str(key) if key is not None else "null"
            out[skey] = _construct(value_node, (*path, skey), lines, loader)
            lines[(*path, skey)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*path, i), lines, loader) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def loads(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text; syntax errors become a ConfigError naming file:line."""
    loader = _Loader(text)
    lines: dict[PathKey, int] = {}
    try:
        node = loader.get_single_node()
        data = _construct(node, (), lines, loader) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"invalid YAML: {exc.problem or exc.context}", file=file, line=line) from None
    except ConfigError as exc:
        raise ConfigError(exc.message, file=file, line=exc.line, key=exc.key) from None
    finally:
        loader.dispose()
    return data, Positions(file, lines)


def load(path: str | Path) -> tuple[Any, Positions]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", file=str(path)) from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from None
    return loads(text, str(path))


def _expected(err: Any) -> str:
    kind, msg, ctx = err["type"], err["msg"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '')}, got {err.get('input')!r}"
    if "input" in err and kind not in ("value_error", "assertion_error"):
        return f"{msg}, got {err['input']!r}"
    return msg.removeprefix("Value error, ")


def validate(model: type[M], data: Any, positions: Positions, prefix: PathKey = (),
             context: dict[str, Any] | None = None) -> M:
    """Build `model` from `data`; the first validation error becomes a ConfigError with a position."""
    try:
        return model.model_validate(data, context=context)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        # Prefer the most specific error: unions report one per branch, and the deepest names the key.
        err = max(errors, key=lambda e: len(e["loc"]))
        loc: PathKey = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in {
            "function-after", "function-before", "function-wrap", "function-plain"})))
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
