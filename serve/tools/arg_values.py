"""How a top-level GLM argument is written between ``<arg_value>`` tags: raw text or JSON.

One decision, ``written_raw``, made from the argument's schema and shared by the grammar
(``serve.tools.grammar_schema``) and the parser (``serve.tools.glm_parser``): a value is raw
text exactly when its schema admits only strings; anything else (numbers, objects, mixed enums,
untyped ``{}``, and every union, nullable strings included) is one JSON text. GLM's own template
decides by the value instead (strings raw), which a grammar cannot follow: under a union, raw
``null``, ``42`` or ``"ab"`` could be the string or the JSON value, and whichever the grammar
counted, the parser could read the other (a nullable ``"a"`` with ``minLength: 3`` read as
``a``), failing validation after the grammar let the call finish.
"""

from __future__ import annotations

from typing import Any

JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null", int: "integer", float: "number"}


def resolve(schema: Any, root: dict) -> Any:
    """``schema`` with its local ``$ref`` chain followed (at most 64 steps)."""
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema and seen < 64:
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        schema, seen = target, seen + 1
    return schema


def allowed_types(schema: Any, root: dict) -> set[str] | None:
    """JSON types a value may take under ``schema``; None when anything goes. Keywords are read
    in this order, the first present deciding: const, enum, type, anyOf / oneOf."""
    schema = resolve(schema, root)
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {JSON_TYPES[type(schema["const"])]}
    if "enum" in schema:
        return {JSON_TYPES[type(v)] for v in schema["enum"]}
    t = schema.get("type")
    if t is not None:
        types = set(t) if isinstance(t, list) else {t}
        return types | ({"integer"} if "number" in types else set())
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        out: set[str] = set()
        for b in branches:
            bt = allowed_types(b, root)
            if bt is None:
                return None
            out |= bt
        return out
    return None


def written_raw(schema: Any, root: dict) -> bool:
    """Whether a top-level argument under ``schema`` is raw text (else one JSON text)."""
    return allowed_types(schema, root) == {"string"}


def argument_schema(root: dict, key: str) -> Any:
    """The schema of top-level argument ``key``: its property, else ``additionalProperties``
    (``{}`` when that is true or absent: anything goes)."""
    props = root.get("properties") or {}
    if key in props:
        return props[key]
    extra = root.get("additionalProperties", True)
    return extra if isinstance(extra, dict) else {}
