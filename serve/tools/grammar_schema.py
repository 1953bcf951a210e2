"""The schema a tool's grammar is built from: its parameters, bounded, each argument written the
way the GLM parser reads it back.

What JSON leaves unbounded but a weak model would never finish is bounded: integers to int64,
strings and arrays to configurable maxima, untyped values (``{}``, ``additionalProperties:
true``, arrays without ``items``) to a few levels of scalars, arrays and objects. Every string
becomes a pattern of UTF-8-safe characters without ``<`` (``serve.tools.charsets``): xgrammar's
own JSON strings take ill-formed UTF-8, and with ``minLength``/``maxLength`` raw control
characters (invalid JSON). Local ``$ref``s are kept (xgrammar resolves ``#/$defs/...``).

xgrammar's ``glm_xml`` style writes any string at the top level raw, a union's string branch
included. Each top-level argument is therefore rewritten as ``arg_values.written_raw`` decides:
raw strings get a pattern without markup or edge whitespace, and in a JSON-written argument
every string, enum and const string is a pattern that includes its quotes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from serve.tools.arg_values import JSON_TYPES, allowed_types, resolve, written_raw
from serve.tools.charsets import UNBOUNDED, json_string_pattern, literal_pattern, raw_string_pattern

INT64 = (-(2**63), 2**63 - 1)
ANY_DEPTH = 2  # nesting an untyped value may use: enough for free-form metadata, finite for the grammar
# keywords whose subschemas describe (part of) the value itself; not, if, ... are left as declared
_SUBSCHEMA = ("items", "additionalProperties", "propertyNames", "additionalItems")
_SUBSCHEMA_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions")
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
_STRING_KEYWORDS = {"minLength", "maxLength", "pattern", "format"}


@dataclass(frozen=True)
class Bounds:
    max_string_length: int | None = 4096
    max_array_items: int = 256

    @property
    def string_length(self) -> int:
        return self.max_string_length or UNBOUNDED


def grammar_parameters(params: dict, bounds: Bounds) -> dict:
    """The grammar's schema for a tool's (checked) parameters object."""
    out = _bounded({k: v for k, v in params.items() if k not in ("properties", "additionalProperties")}, bounds)
    if isinstance(params.get("properties"), dict):
        out["properties"] = {name: _argument(prop, params, bounds) for name, prop in params["properties"].items()}
    extra = params.get("additionalProperties")
    if extra is not None:  # absent: xgrammar allows no undeclared argument
        out["additionalProperties"] = extra if extra is False else _argument(extra, params, bounds)
    return out


def _untyped(node: Any) -> bool:
    return node is True or (isinstance(node, dict) and set(node) <= _ANNOTATIONS)


def _any(bounds: Bounds, depth: int, quoted: bool = False) -> dict:
    """Any JSON value, with bounded safe strings and at most ``depth`` levels of containers."""
    options: list[dict] = [
        {"type": "string", "pattern": json_string_pattern(0, bounds.string_length, quoted)},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
    ]
    if depth:
        inner = _any(bounds, depth - 1)
        key = {"type": "string", "pattern": json_string_pattern(0, bounds.string_length)}
        options += [
            {"type": "array", "items": inner, "maxItems": bounds.max_array_items},
            {"type": "object", "propertyNames": key, "additionalProperties": inner, "maxProperties": bounds.max_array_items},
        ]
    return {"anyOf": options}


def _bounded(node: Any, bounds: Bounds) -> Any:
    """A nested (JSON-written) schema, bounded; subschemas are found by keyword."""
    if _untyped(node):
        return _any(bounds, ANY_DEPTH)
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in _SUBSCHEMA_MAP and isinstance(v, dict):
            out[k] = {name: _bounded(s, bounds) for name, s in v.items()}
        elif k in _SUBSCHEMA_LIST and isinstance(v, list):
            out[k] = [_bounded(s, bounds) for s in v]
        elif k in _SUBSCHEMA and v is not False:
            out[k] = _bounded(v, bounds)
        else:
            out[k] = v
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "integer" in types:
        out.setdefault("minimum", INT64[0])
        out.setdefault("maximum", INT64[1])
    if "string" in types and not {"enum", "const", "format", "pattern"} & set(out):
        out["pattern"] = json_string_pattern(int(out.pop("minLength", 0)), int(out.pop("maxLength", bounds.string_length)))
    if "array" in types:
        out.setdefault("maxItems", bounds.max_array_items)
        if "items" not in out and "prefixItems" not in out:
            out["items"] = _any(bounds, ANY_DEPTH - 1)
    if out.get("additionalProperties", False) is not False:  # keys are strings too, and as many as items
        out.setdefault("propertyNames", {"type": "string", "pattern": json_string_pattern(0, bounds.string_length)})
        out.setdefault("maxProperties", bounds.max_array_items)
    return out


def _argument(prop: Any, root: dict, bounds: Bounds) -> Any:
    """A top-level argument. A ``$ref`` is inlined: its target may also be used nested, where
    its strings are JSON-quoted by xgrammar itself."""
    prop = resolve(prop, root)
    if prop is True:
        prop = {}
    if not isinstance(prop, dict):
        return prop
    return _raw(prop, root, bounds) if written_raw(prop, root) else _json(prop, root, bounds)


def _raw(node: dict, root: dict, bounds: Bounds) -> dict:
    """A string-only argument, written raw. Bounded strings get a pattern that excludes markup
    (xgrammar lets a length-bounded raw string contain ``</arg_value>``: it compiles to any
    characters), and so do unbounded ones (xgrammar's own raw string takes any bytes)."""
    if {"const", "enum"} & set(node):
        return node  # xgrammar writes string literals raw
    if "type" not in node and ("anyOf" in node or "oneOf" in node):
        key = "anyOf" if "anyOf" in node else "oneOf"
        return {**node, key: [_raw(resolve(b, root), root, bounds) for b in node[key]]}
    out = dict(node)
    if not {"pattern", "format"} & set(out):
        out["pattern"] = raw_string_pattern(int(out.pop("minLength", 0)), int(out.pop("maxLength", bounds.string_length)))
    return out


def _json(node: dict, root: dict, bounds: Bounds) -> Any:
    """A JSON-written argument at the top level, where xgrammar's GLM style writes strings raw
    but numbers, literals other than strings, arrays and objects as JSON. Keywords are read in
    ``allowed_types``' order, so the grammar and the parser see the same types."""
    if "const" in node:
        return _literal(node["const"])
    if "enum" in node:
        types = allowed_types({"type": node["type"]}, root) if "type" in node else None
        values = [v for v in node["enum"] if types is None or JSON_TYPES[type(v)] in types] or node["enum"]
        return _one_of_these([_literal(v) for v in values])
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        other = {k: v for k, v in node.items() if k not in _STRING_KEYWORDS}
        return _one_of_these([_quoted(node, bounds) if t == "string" else _bounded({**other, "type": t}, bounds) for t in types])
    if "anyOf" in node or "oneOf" in node:
        # oneOf as anyOf: xgrammar cannot tell overlapping branches apart either
        return _one_of_these([_json_branch(b, root, bounds) for b in node.get("anyOf") or node["oneOf"]])
    if _untyped(node):
        return _any(bounds, ANY_DEPTH, quoted=True)
    return _bounded(node, bounds)  # allOf, not, ...: as xgrammar writes them


def _json_branch(branch: Any, root: dict, bounds: Bounds) -> Any:
    branch = resolve(branch, root)
    return _json({} if branch is True else branch, root, bounds) if branch is not False else False


def _one_of_these(options: list) -> Any:
    return options[0] if len(options) == 1 else {"anyOf": options}


def _literal(value: Any) -> dict:
    """Exactly ``value`` as JSON; a ``<`` in a string is written ``\\u003c``, which keeps markup out."""
    if not isinstance(value, str):
        return {"const": value}
    return {"type": "string", "pattern": literal_pattern(json.dumps(value, ensure_ascii=False).replace("<", "\\u003c"))}


def _quoted(node: dict, bounds: Bounds) -> dict:
    """A string branch as a JSON string, quotes included. A declared ``pattern`` is kept, between
    the quotes (it must not admit ``"``, ``\\`` or ``<`` itself); a ``format`` is dropped (the
    validator does not assert formats)."""
    pattern = node.get("pattern")
    if pattern is not None:
        inner = pattern[1:] if pattern.startswith("^") else pattern
        inner = inner[:-1] if inner.endswith("$") and not inner.endswith("\\$") else inner
        return {"type": "string", "pattern": f'^"(?:{inner})"$'}
    return {
        "type": "string",
        "pattern": json_string_pattern(
            int(node.get("minLength", 0)), int(node.get("maxLength", bounds.string_length)), quoted=True
        ),
    }
