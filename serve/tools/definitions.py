"""Tool definitions: checked on the way in, bounded for the grammar, used to validate the way out.

A request's ``tools`` and ``tool_choice`` are checked before anything reaches a deployment
(bad JSON Schema, duplicate or illegal names, references we cannot resolve, a ``tool_choice``
naming no declared tool: all 400s). Each tool keeps its parameters as declared, to validate the
calls returned, and a bounded copy to build the grammar from (``serve.tools.grammar_schema``).

Checking a schema against JSON Schema's metaschema costs ~3.7 ms a tool here (jsonschema, draft
2020-12; ~6 s per MB of tools), so the cheap bounds come first (:class:`ToolLimits`: count,
bytes, nesting), a checked list of tools is remembered (an agent sends the same tools every
turn), and the caller runs a check that is not remembered off the event loop.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from serve import json_codec
from serve.errors import APIError
from serve.tools.grammar_schema import Bounds, grammar_parameters

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class Tool:
    name: str
    parameters: dict[str, Any]  # as declared (used to validate final calls)
    grammar_schema: dict[str, Any]  # bounded and worked-around (used to build the grammar)
    validator: Any = field(repr=False, default=None)


@dataclass
class ToolRequest:
    tools: list[Tool]
    choice: str  # "auto" | "required" | "none" | "named"
    named: str | None = None
    parallel: bool = True

    def by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}


@dataclass(frozen=True)
class ToolLimits:
    """What one request's ``tools`` may be, checked before any schema is read."""

    max_tools: int = 128  # OpenAI's own limit on a request's functions
    max_bytes: int = 512 << 10  # the tools' JSON: ~3 s of schema checks at most
    max_depth: int = 32  # nesting of the tools' JSON (a deeper schema overflowed the stack)


class _CheckedTools:
    """The last few checked tool lists, by the SHA-256 of their JSON (bounded: LRU)."""

    def __init__(self, size: int = 256):
        self.size, self._lock, self._tools = size, threading.Lock(), OrderedDict()

    def get(self, key: bytes) -> tuple[Tool, ...] | None:
        with self._lock:
            tools = self._tools.get(key)
            if tools is not None:
                self._tools.move_to_end(key)
            return tools

    def put(self, key: bytes, tools: tuple[Tool, ...]) -> None:
        with self._lock:
            self._tools[key] = tools
            while len(self._tools) > self.size:
                self._tools.popitem(last=False)


CHECKED = _CheckedTools()


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


def tools_key(body: dict, limits: ToolLimits = ToolLimits()) -> bytes | None:
    """The cheap checks (count, bytes, nesting: 400s) and the key of the request's tools, or
    None without tools. Cheap enough for the event loop: no schema is read."""
    tools_raw = body.get("tools")
    if not tools_raw:
        return None
    if not isinstance(tools_raw, list):
        raise _bad("tools must be a list of function tools", "tools")
    if len(tools_raw) > limits.max_tools:
        raise _bad(f"tools has {len(tools_raw)} entries; at most {limits.max_tools} are allowed", "tools")
    if _depth(tools_raw, limits.max_depth) > limits.max_depth:
        raise _bad(f"tools nests deeper than {limits.max_depth} levels of lists and objects", "tools")
    encoded = json_codec.encode(tools_raw)
    if len(encoded) > limits.max_bytes:
        raise _bad(f"tools is {len(encoded):,} bytes of JSON; at most {limits.max_bytes:,} are allowed", "tools")
    return hashlib.sha256(encoded).digest()


def _depth(value: Any, stop: int) -> int:
    """How deep ``value`` nests (lists and objects), counted up to ``stop + 1``; no recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > stop:
                return deepest
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def checked_key(body: dict, bounds: Bounds = Bounds(), limits: ToolLimits = ToolLimits()) -> bytes | None:
    """:func:`tools_key` for these bounds too (the grammar's copy of each schema depends on them)."""
    key = tools_key(body, limits)
    return None if key is None else key + repr(bounds).encode()


def is_checked(key: bytes | None) -> bool:
    """Whether parsing the tools of this :func:`checked_key` is cheap: none, or a list already checked."""
    return key is None or CHECKED.get(key) is not None


def parse_tools(
    body: dict, bounds: Bounds = Bounds(), limits: ToolLimits = ToolLimits(), key: bytes | None = None
) -> ToolRequest | None:
    """The request's tools and tool_choice, checked; None when the request has no tools.
    ``key``: its :func:`checked_key`, when the caller has it already."""
    key = key or checked_key(body, bounds, limits)
    choice_raw = body.get("tool_choice")
    if key is None:
        if choice_raw not in (None, "none", "auto"):
            raise _bad("tool_choice needs tools: this request declares none", "tool_choice")
        return None
    tools = CHECKED.get(key)
    if tools is None:
        tools = _checked_tools(body["tools"], bounds)
        CHECKED.put(key, tools)
    return _with_choice(list(tools), choice_raw, body.get("parallel_tool_calls", True))


def _checked_tools(tools_raw: list, bounds: Bounds) -> tuple[Tool, ...]:
    tools, seen = [], set()
    for i, t in enumerate(tools_raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise _bad(f'{where}: expected {{"type": "function", "function": {{...}}}}', where)
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise _bad(f"{where}.function.name must match ^[A-Za-z0-9_-]{{1,64}}$, got {name!r}", f"{where}.function.name")
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
        tools.append(
            Tool(
                name=name,
                parameters=params,
                grammar_schema=grammar_parameters(copy.deepcopy(params), bounds),
                validator=validator_cls(params),
            )
        )
    return tuple(tools)


def _with_choice(tools: list[Tool], choice_raw: Any, parallel: Any) -> ToolRequest:
    seen = {t.name for t in tools}
    choice, named = "auto", None
    if choice_raw is None or choice_raw == "auto":
        choice = "auto"
    elif choice_raw in ("none", "required"):
        choice = choice_raw
    elif isinstance(choice_raw, dict) and choice_raw.get("type") == "function":
        function = choice_raw.get("function")
        named = function.get("name") if isinstance(function, dict) else None
        if not isinstance(named, str) or named not in seen:
            raise _bad(f"tool_choice names {named!r}, which is not among the declared tools", "tool_choice")
        choice = "named"
    else:
        raise _bad(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice"
        )
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
