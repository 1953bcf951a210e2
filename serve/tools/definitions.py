"""Tool definitions: checked on the way in, bounded for the grammar, used to validate the way out.

A request's ``tools`` and ``tool_choice`` are checked before anything reaches a deployment
(bad JSON Schema, duplicate or illegal names, references we cannot resolve, a ``tool_choice``
naming no declared tool: all 400s). Each tool keeps its parameters as declared, to validate the
calls returned, and a bounded copy to build the grammar from (``serve.tools.grammar_schema``).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from serve.errors import APIError
from serve.tools.grammar_schema import Bounds, grammar_parameters

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
                          grammar_schema=grammar_parameters(copy.deepcopy(params), bounds),
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
