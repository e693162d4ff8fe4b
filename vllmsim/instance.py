"""Deterministic instances of a JSON schema: what a grammar-constrained model would emit.

Covers what real structured-output schemas use: type (lists too), properties/required,
additionalProperties, enum/const, items/prefixItems/minItems/maxItems/uniqueItems, anyOf/oneOf/allOf,
local $ref into $defs/definitions, string formats, patterns, lengths, numeric bounds.
The same schema and the same random source give the same instance.
"""

from __future__ import annotations

import random
import re
from typing import Any

import jsonschema

try:  # Python >= 3.11 keeps the regex parser here; the old name still works with a warning.
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse

WORDS = (
    "alpha",
    "bravo",
    "delta",
    "sierra",
    "tango",
    "kilo",
    "lima",
    "nova",
    "orbit",
    "pixel",
    "quartz",
    "river",
    "stone",
    "ember",
    "falcon",
    "maple",
    "cedar",
    "harbor",
    "summit",
    "meadow",
)
_FORMATS = {
    "date-time": "2026-08-26T12:00:00Z",
    "date": "2026-08-26",
    "time": "12:00:00Z",
    "email": "dev@example.com",
    "uri": "https://example.com/a",
    "uri-reference": "/a/b",
    "url": "https://example.com/a",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "ipv4": "10.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
    "duration": "P1D",
    "regex": "^a+$",
    "json-pointer": "/a",
}
_MAX_DEPTH = 12


class Generator:
    def __init__(self, root: Any, rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def instance(self, schema: Any = None, depth: int = 0) -> Any:
        schema = self.root if schema is None else schema
        if schema is True or schema == {}:
            return self._word()
        if schema is False or not isinstance(schema, dict):
            return None
        schema = self._resolve(schema)
        if "allOf" in schema:
            schema = self._merge_all_of(schema)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return self.rng.choice(schema["enum"])
        if "oneOf" in schema:
            return self._one_of(schema, depth)
        if "anyOf" in schema:
            base = {k: v for k, v in schema.items() if k != "anyOf"}
            options = [self._resolve(o) if isinstance(o, dict) else o for o in schema["anyOf"]]
            if depth >= _MAX_DEPTH:  # prefer a leaf to stop recursive schemas
                options.sort(key=lambda o: isinstance(o, dict) and o.get("type") in ("object", "array"))
            choice = options[0] if depth >= _MAX_DEPTH else self.rng.choice(options)
            return self.instance(_combine(base, choice), depth + 1)
        kind = self._type(schema, depth)
        maker = getattr(self, f"_{kind}")
        return maker(schema, depth)

    # --- combinators -------------------------------------------------------------------------

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while "$ref" in schema and seen < 32:
            target = _pointer(self.root, schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = _combine(rest, target) if rest else target
            seen += 1
        return schema

    def _merge_all_of(self, schema: dict[str, Any]) -> dict[str, Any]:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                part = self._resolve(part)
                if "allOf" in part:
                    part = self._merge_all_of(part)
                merged = _combine(merged, part)
        return merged

    def _one_of(self, schema: dict[str, Any], depth: int) -> Any:
        base = {k: v for k, v in schema.items() if k != "oneOf"}
        options = list(schema["oneOf"])
        start = self.rng.randrange(len(options))
        value: Any = None
        for i in range(3 * len(options)):  # a few rounds: a draw can land in two branches at once
            option = options[(start + i) % len(options)]
            value = self.instance(
                _combine(base, self._resolve(option) if isinstance(option, dict) else option), depth + 1
            )
            # oneOf wants exactly one branch to hold; keep the first value that achieves it.
            hits = sum(1 for o in options if _valid(value, o, self.root))
            if hits == 1:
                return value
        return value

    def _type(self, schema: dict[str, Any], depth: int) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            concrete = [k for k in kind if k != "null"]
            if not concrete:
                return "null"
            if depth >= _MAX_DEPTH and "null" in kind:
                return "null"
            kind = concrete[0]
        if kind is None:
            if "properties" in schema or "required" in schema or "additionalProperties" in schema:
                return "object"
            if "items" in schema or "prefixItems" in schema:
                return "array"
            if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "multipleOf")):
                return "number"
            return "string"
        return str(kind)

    # --- types -------------------------------------------------------------------------------

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or (depth < 4 and self.rng.random() < 0.5):
                out[name] = self.instance(sub, depth + 1)
        extra = schema.get("additionalProperties", True)
        for name in required:
            if name not in out:
                out[name] = self.instance(extra if isinstance(extra, dict) else {}, depth + 1)
        self._dependencies(schema, out, depth)
        want = int(schema.get("minProperties", 0))
        i = 0
        while len(out) < want and extra is not False:
            out[f"{self._word()}_{i}"] = self.instance(extra if isinstance(extra, dict) else {}, depth + 1)
            i += 1
        return out

    def _dependencies(self, schema: dict[str, Any], out: dict[str, Any], depth: int) -> None:
        # draft-04 `dependencies` and its 2019-09 successors: a present key pulls in others.
        props: dict[str, Any] = schema.get("properties") or {}
        deps = {
            **(schema.get("dependencies") or {}),
            **(schema.get("dependentRequired") or {}),
            **(schema.get("dependentSchemas") or {}),
        }
        for trigger, dep in deps.items():
            if trigger not in out:
                continue
            if isinstance(dep, list):
                for name in dep:
                    out.setdefault(name, self.instance(props.get(name, {}), depth + 1))
                continue
            if not isinstance(dep, dict):
                continue
            dep_props: dict[str, Any] = dep.get("properties") or {}
            for name in {*dep.get("required", []), *(n for n in dep_props if n in out)}:
                sub = (
                    _combine(props[name], dep_props[name])
                    if isinstance(props.get(name), dict) and isinstance(dep_props.get(name), dict)
                    else dep_props.get(name, props.get(name, {}))
                )
                if isinstance(sub, dict) and "anyOf" in sub and name in dep_props:
                    sub = dep_props[name]  # the dependency's narrower branch satisfies both
                out[name] = self.instance(sub, depth + 1)

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        lo = int(schema.get("minItems", 0))
        hi = int(schema.get("maxItems", max(lo, 3)))
        prefix = schema.get("prefixItems") or (
            schema["items"] if isinstance(schema.get("items"), list) else []
        )
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        count = lo if depth >= _MAX_DEPTH else max(lo, min(hi, self.rng.randint(1, 3)))
        count = max(count, min(len(prefix), hi)) if prefix else count
        out: list[Any] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            value = self.instance(sub, depth + 1)
            if schema.get("uniqueItems"):
                options = self._resolve(sub).get("enum") if isinstance(sub, dict) else None
                if options and value in out:  # walk the enum instead of hoping for a fresh draw
                    value = next((o for o in options if o not in out), value)
                for _ in range(8):
                    if value not in out:
                        break
                    value = self.instance(sub, depth + 1)
                if value in out:
                    break
            out.append(value)
        return out

    def _string(self, schema: dict[str, Any], depth: int) -> str:
        if "pattern" in schema:
            text = pattern_instance(schema["pattern"], self.rng)
        elif schema.get("format") in _FORMATS:
            text = _FORMATS[schema["format"]]
        else:
            text = " ".join(self._word() for _ in range(self.rng.randint(1, 3)))
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        while len(text) < lo:
            text += "x"
        if hi is not None and len(text) > int(hi):
            text = text[: int(hi)]
        return text

    def _integer(self, schema: dict[str, Any], depth: int) -> int:
        lo, hi = _bounds(schema, integer=True)
        value = self.rng.randint(lo, hi)
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0:
            value = (value // step) * step
            if value < lo:
                value += step
        return value

    def _number(self, schema: dict[str, Any], depth: int) -> float | int:
        step = schema.get("multipleOf")
        if isinstance(step, int):
            return self._integer(schema, depth)
        lo, hi = _bounds(schema, integer=False)
        if isinstance(step, float) and step > 0:
            first, last = int(-(-lo // step)), int(hi // step)
            k = self.rng.randint(first, max(first, last))
            if (k * step).is_integer() and k + 1 <= last:
                k += 1  # a fractional multiple keeps "number" apart from "integer" (oneOf)
            return k * step
        return round(self.rng.uniform(lo, hi), 2) if lo < hi else lo

    def _boolean(self, schema: dict[str, Any], depth: int) -> bool:
        return self.rng.random() < 0.5

    def _null(self, schema: dict[str, Any], depth: int) -> None:
        return None

    def _word(self) -> str:
        return self.rng.choice(WORDS)


def instance(schema: Any, rng: random.Random) -> Any:
    """A value valid for `schema` (a JSON schema document), chosen by `rng`."""
    return Generator(schema, rng).instance()


def _combine(a: dict[str, Any], b: Any) -> Any:
    """The conjunction of two schemas, as far as generation needs it."""
    if not isinstance(b, dict):
        return b
    out = dict(a)
    for key, value in b.items():
        if key == "properties" and isinstance(out.get(key), dict):
            merged = dict(out[key])
            for name, sub in value.items():
                merged[name] = _combine(merged[name], sub) if isinstance(merged.get(name), dict) else sub
            out[key] = merged
        elif key == "required" and key in out:
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "type" and key in out:
            left = set(out[key]) if isinstance(out[key], list) else {out[key]}
            right = set(value) if isinstance(value, list) else {value}
            both = left & right or ({"integer"} if {"integer", "number"} <= left | right else right)
            out[key] = sorted(both) if len(both) > 1 else next(iter(both))
        else:
            out[key] = value
    return out


def _pointer(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return {}  # remote references cannot be fetched offline; anything goes
    node = root
    for part in ref[1:].lstrip("/").split("/"):
        if part == "":
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node.get(part, {})
    return node


def _bounds(schema: dict[str, Any], *, integer: bool) -> tuple[Any, Any]:
    lo = schema.get("minimum", schema.get("exclusiveMinimum", 0) if "exclusiveMinimum" in schema else None)
    hi = schema.get("maximum", schema.get("exclusiveMaximum") if "exclusiveMaximum" in schema else None)
    if isinstance(schema.get("exclusiveMinimum"), (int, float)) and "minimum" not in schema:
        lo = schema["exclusiveMinimum"] + (1 if integer else 0.01)
    if isinstance(schema.get("exclusiveMaximum"), (int, float)) and "maximum" not in schema:
        hi = schema["exclusiveMaximum"] - (1 if integer else 0.01)
    if lo is None:
        lo = 0 if hi is None or hi >= 0 else hi - 100
    if hi is None:
        hi = lo + 100
    if integer:
        return int(-(-lo // 1)), int(hi // 1)
    return lo, hi


def _valid(value: Any, schema: Any, root: Any) -> bool:
    if isinstance(schema, dict) and isinstance(root, dict):
        scope = {k: root[k] for k in ("$defs", "definitions") if k in root}
        schema = {**scope, **schema}
    try:
        return bool(jsonschema.Draft202012Validator(schema).is_valid(value))
    except (jsonschema.exceptions.RefResolutionError, jsonschema.exceptions.SchemaError, KeyError):
        return True


def pattern_instance(pattern: str, rng: random.Random) -> str:
    """A string that `re.search(pattern, ...)` accepts, built by walking the parsed regex."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return "x"
    return _walk(parsed, rng)


def _walk(items: Any, rng: random.Random) -> str:
    out: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "NOT_LITERAL":
            out.append("a" if chr(arg) != "a" else "b")
        elif name == "ANY":
            out.append("x")
        elif name == "IN":
            out.append(_in_class(arg))
        elif name == "BRANCH":
            out.append(_walk(arg[1][0], rng))
        elif name == "SUBPATTERN":
            out.append(_walk(arg[-1], rng))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, body = arg
            count = lo if lo > 0 else (1 if hi != 0 else 0)
            out.extend(_walk(body, rng) for _ in range(count))
        elif name == "CATEGORY":
            out.append(_category(str(arg)))
        # AT (anchors), ASSERT, GROUPREF and the like add no characters.
    return "".join(out)


def _in_class(arg: list[Any]) -> str:
    negate = any(str(op) == "NEGATE" for op, _ in arg)
    candidates: list[str] = []
    for op, value in arg:
        name = str(op)
        if name == "LITERAL":
            candidates.append(chr(value))
        elif name == "RANGE":
            candidates.append(chr(value[0]))
        elif name == "CATEGORY":
            candidates.append(_category(str(value)))
    if not negate:
        return candidates[0] if candidates else "x"
    for c in "xa0_ -.":
        if c not in candidates and re.fullmatch(f"[{_class_text(arg)}]", c) is None:
            return c
    return "x"


def _class_text(arg: list[Any]) -> str:
    parts: list[str] = []
    for op, value in arg:
        name = str(op)
        if name == "LITERAL":
            parts.append(re.escape(chr(value)))
        elif name == "RANGE":
            parts.append(f"{re.escape(chr(value[0]))}-{re.escape(chr(value[1]))}")
        elif name == "CATEGORY":
            parts.append(
                {"CATEGORY_DIGIT": r"\d", "CATEGORY_WORD": r"\w", "CATEGORY_SPACE": r"\s"}.get(str(value), "")
            )
    return "".join(parts) or "^"


def _category(name: str) -> str:
    if "NOT_DIGIT" in name or "NOT_SPACE" in name:
        return "a"
    if "NOT_WORD" in name:
        return "-"
    if "DIGIT" in name:
        return "0"
    if "SPACE" in name:
        return " "
    return "a"
