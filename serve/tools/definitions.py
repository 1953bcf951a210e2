"""Tool definitions: checked on the way in, bounded for the grammar, used to validate the way out.

A request's ``tools`` and ``tool_choice`` are checked before anything reaches a deployment
(bad JSON Schema, duplicate or illegal names, references we cannot resolve, a ``tool_choice``
naming no declared tool: all 400s). Each tool's parameters schema is then prepared for the
grammar: local ``$ref``s are kept (xgrammar resolves ``#/$defs/...``), and what JSON leaves
unbounded but a weak model would never finish is bounded: integers to int64, and strings and
arrays to configurable maxima. xgrammar 0.2.x lets JSON strings with ``minLength``/``maxLength``
contain raw control characters (invalid JSON); such strings get an equivalent ``pattern``
without them, which xgrammar compiles correctly.

Those patterns are written as positive ranges of Unicode scalar values (``scalar_class``), never
as negated classes: xgrammar 0.2.x does not check a multi-byte character's code point against
``[^...]`` (it takes any lead byte C0-F7 followed by the continuation bytes it announces), so
with a byte-level vocabulary (every byte is a token) a value could hold overlong forms,
surrogates or code points past U+10FFFF, each counted as one character towards ``maxLength``
and decoded as several U+FFFD.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from serve.errors import APIError

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
INT64 = (-(2 ** 63), 2 ** 63 - 1)
MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # code points UTF-8 cannot encode
# What str.strip() (the GLM parser) removes from a raw value: str.isspace() characters.
STRIPPED_WHITESPACE = "".join(map(chr, [*range(0x09, 0x0E), *range(0x1C, 0x21), 0x85, 0xA0, 0x1680,
                                        *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]))


def _escape(cp: int) -> str:
    # past U+FFFF the character itself: xgrammar's Regex() rules read no \U escape, Python's re
    # no \u{...}
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}" if cp <= 0xFFFF else chr(cp)


def _utf8_safe_ranges(lo: int, hi: int):
    """[lo, hi] as ranges xgrammar 0.2.x turns into exactly their UTF-8 encodings: each within
    one encoded length (a range across lengths admits overlong forms such as E0 80 80), and one
    of three or four bytes either ending on a 4096-code-point boundary or within one (xgrammar
    drops part of the last lead byte's tail otherwise: U+0800-U+D7FF refuses U+D000-U+D7FF)."""
    for first, last in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE_POINT)):
        a, b = max(lo, first), min(hi, last)
        if a > b:
            continue
        if a >= 0x800 and b & 0xFFF != 0xFFF and a < b & ~0xFFF:
            yield a, (b & ~0xFFF) - 1
            a = b & ~0xFFF
        yield a, b


def scalar_class(excluded: str = "") -> str:
    """A regex character class of every Unicode scalar value not in ``excluded``: one character
    of valid UTF-8 text, whatever bytes the tokenizer offers. Python's ``re`` reads it the same.

    xgrammar inlines such a pattern as an EBNF character class, which keeps the ranges apart
    and is as fast as a negated class. (Its ``Regex()`` rules, used for patterns it cannot
    inline, would merge the touching ranges back into unsafe ones; an alternation of classes
    avoids that, but masking a token inside a long string gets hundreds of times slower.)"""
    holes = sorted({(ord(c), ord(c)) for c in excluded} | {SURROGATES})
    ranges, start = [], 0
    for lo, hi in holes:
        if lo > start:
            ranges.append((start, lo - 1))
        start = max(start, hi + 1)
    if start <= MAX_CODE_POINT:
        ranges.append((start, MAX_CODE_POINT))
    pieces = [piece for lo, hi in ranges for piece in _utf8_safe_ranges(lo, hi)]
    return "[" + "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in pieces) + "]"


# printable, no quote or backslash: always valid inside a JSON string
JSON_STRING_CHAR = scalar_class('"\\' + "".join(map(chr, range(0x20))))
RAW_CHAR = scalar_class("<")                              # no markup in a raw GLM value
RAW_EDGE_CHAR = scalar_class("<" + STRIPPED_WHITESPACE)   # nor whitespace the parser would strip


@dataclass(frozen=True)
class Bounds:
    max_string_length: int | None = 4096
    max_array_items: int = 256


@dataclass
class Tool:
    name: str
    parameters: dict[str, Any]          # as declared (used to validate final calls)
    grammar_schema: dict[str, Any]      # bounded and worked-around (used to build the grammar)
    validator: Any = field(repr=False, default=None)


@dataclass
class ToolRequest:
    tools: list[Tool]
    choice: str                  # "auto" | "required" | "none" | "named"
    named: str | None = None
    parallel: bool = True

    def by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_tools")


def _check_refs(node: Any, root: dict, where: str) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None:
            if not isinstance(ref, str) or not ref.startswith("#/"):
                raise _bad(f"{where}: only local references ('#/$defs/...') are supported, not {ref!r}", where)
            target: Any = root
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise _bad(f"{where}: reference {ref!r} points at nothing", where)
                target = target[part]
        for value in node.values():
            _check_refs(value, root, where)
    elif isinstance(node, list):
        for value in node:
            _check_refs(value, root, where)


def _bounded(node: Any, bounds: Bounds, raw_strings: bool = False) -> Any:
    """A copy of the schema with practical bounds and the control-character workaround.

    ``raw_strings`` marks the argument object itself: in GLM's format its string values are
    written raw between ``<arg_value>`` tags (no JSON quoting, so no control-character bug),
    and a ``pattern`` there would let markup such as ``</arg_value>`` into a value. Strings
    anywhere deeper are JSON-encoded and get the pattern."""
    if isinstance(node, list):
        return [_bounded(v, bounds) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if raw_strings and k == "properties" and isinstance(v, dict):
            out[k] = {name: _bounded_top(prop, bounds) for name, prop in v.items()}
        else:
            out[k] = _bounded(v, bounds)
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "integer" in types:
        out.setdefault("minimum", INT64[0])
        out.setdefault("maximum", INT64[1])
    if not raw_strings and "string" in types and not {"enum", "const", "format", "pattern"} & set(out):
        lo = int(out.pop("minLength", 0))
        hi = int(out.pop("maxLength", bounds.max_string_length or 1 << 20))
        out["pattern"] = f"^{JSON_STRING_CHAR}{{{lo},{hi}}}$"
    if "array" in types:
        out.setdefault("maxItems", bounds.max_array_items)
    return out


def raw_string_pattern(lo: int, hi: int) -> str:
    """A top-level GLM string argument of lo..hi characters that cannot contain markup (no
    ``<``) and has no whitespace at either end (the grammar's own separators are whitespace,
    and the parser strips them: everything ``str.strip()`` removes, Unicode spaces included)."""
    edge = RAW_EDGE_CHAR
    inner = f"{edge}{RAW_CHAR}{{{max(lo - 2, 0)},{max(hi - 2, 0)}}}{edge}" if hi >= 2 else None
    options = ([""] if lo == 0 else []) + ([edge] if lo <= 1 <= hi else []) + ([inner] if inner else [])
    return "^(?:" + "|".join(options) + ")$"


def _bounded_top(prop: Any, bounds: Bounds) -> Any:
    """A top-level argument: raw text when it is a plain string, JSON (bounded as usual)
    otherwise. xgrammar lets a length-bounded raw string contain ``</arg_value>`` (it compiles
    to any characters), so bounded raw strings get a pattern that excludes markup instead; so do
    unbounded ones (xgrammar's own raw string takes any bytes, ill-formed UTF-8 included)."""
    if isinstance(prop, dict) and prop.get("type") in ("string", ["string"], ["string", "null"], ["null", "string"]):
        out = {k: _bounded(v, bounds) for k, v in prop.items()}
        if not {"enum", "const", "pattern", "format"} & set(out):
            lo, hi = out.pop("minLength", 0), out.pop("maxLength", bounds.max_string_length)
            out["pattern"] = raw_string_pattern(int(lo), int(hi if hi is not None else 1 << 20))
        return out
    return _bounded(prop, bounds)


def parse_tools(body: dict, bounds: Bounds = Bounds()) -> ToolRequest | None:
    """The request's tools and tool_choice, checked; None when the request has no tools."""
    tools_raw = body.get("tools")
    choice_raw = body.get("tool_choice")
    if not tools_raw:
        if choice_raw not in (None, "none", "auto"):
            raise _bad("tool_choice needs tools: this request declares none", "tool_choice")
        return None
    if not isinstance(tools_raw, list):
        raise _bad("tools must be a list of function tools", "tools")
    tools, seen = [], set()
    for i, t in enumerate(tools_raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise _bad(f'{where}: expected {{"type": "function", "function": {{...}}}}', where)
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise _bad(f"{where}.function.name must match ^[A-Za-z0-9_-]{{1,64}}$, got {name!r}",
                       f"{where}.function.name")
        if name in seen:
            raise _bad(f"duplicate tool name {name!r}", f"{where}.function.name")
        seen.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        pwhere = f"{where}.function.parameters"
        if not isinstance(params, dict):
            raise _bad(f"{pwhere} must be a JSON Schema object", pwhere)
        if params.get("type", "object") != "object":
            raise _bad(f"{pwhere} must describe an object (type: object)", pwhere)
        try:
            validator_cls = jsonschema.validators.validator_for(params, default=jsonschema.Draft202012Validator)
            validator_cls.check_schema(params)
        except jsonschema.SchemaError as exc:
            raise _bad(f"{pwhere} is not a valid JSON Schema: {exc.message}", pwhere) from None
        _check_refs(params, params, pwhere)
        tools.append(Tool(name=name, parameters=params,
                          grammar_schema=_bounded(copy.deepcopy(params), bounds, raw_strings=True),
                          validator=validator_cls(params)))
    choice, named = "auto", None
    if choice_raw is None or choice_raw == "auto":
        choice = "auto"
    elif choice_raw in ("none", "required"):
        choice = choice_raw
    elif isinstance(choice_raw, dict) and choice_raw.get("type") == "function":
        named = (choice_raw.get("function") or {}).get("name")
        if named not in seen:
            raise _bad(f"tool_choice names {named!r}, which is not among the declared tools", "tool_choice")
        choice = "named"
    else:
        raise _bad('tool_choice must be "auto", "none", "required" or '
                   '{"type": "function", "function": {"name": ...}}', "tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls must be true or false", "parallel_tool_calls")
    return ToolRequest(tools=tools, choice=choice, named=named, parallel=parallel)


def validate_call(req: ToolRequest, name: str, arguments: str) -> str | None:
    """Why a returned call is invalid, or None if it names a declared tool and its arguments
    (a JSON text) satisfy that tool's schema."""
    tool = req.by_name().get(name)
    if tool is None:
        return f"call to undeclared tool {name!r}"
    if req.choice == "named" and name != req.named:
        return f"call to {name!r} although tool_choice named {req.named!r}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return f"arguments of {name!r} are not JSON: {exc}"
    error = next(iter(tool.validator.iter_errors(args)), None)
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"arguments of {name!r} fail its schema at {path}: {error.message}"
    return None
