"""GLM tool-call text -> OpenAI ``tool_calls``, streamed or not, with identical results.

``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`` (inline, or with
newlines between the parts). Values are typed by the tool's schema, fixing what public GLM
parsers get wrong:

- values are taken as written: ``&lt;`` stays ``&lt;`` (no HTML unescaping);
- a value whose schema allows only strings is raw text, even if it looks like JSON; any other
  value is JSON (``serve.tools.arg_values``, the rule the grammar is built with), so under a
  nullable or union type ``null`` is JSON null and ``"null"`` the string;
- a key without ``<arg_value>``, markup inside a name, or a call left open is an error,
  never an empty ``{}``.

The streaming parser releases text as soon as it cannot be the start of a tool call, and a
call only when it is complete, so no partial name is ever sent.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from serve.tools.arg_values import JSON_TYPES, allowed_types, argument_schema, written_raw
from serve.tools.definitions import NAME_RE, ToolRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE, VAL_OPEN, VAL_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


class ToolCallParseError(ValueError):
    """The model's tool-call markup is malformed."""


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


def _typed_value(raw: str, schema: Any, root: dict) -> Any:
    """A value as the grammar wrote it (``written_raw``); JSON that is not JSON, or not of an
    allowed type, can only come from an unconstrained model and is kept as the string written."""
    text = raw.strip()
    if written_raw(schema, root):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text  # GLM's template writes strings raw: a string (validation judges it)
    types = allowed_types(schema, root)
    kind = JSON_TYPES[type(value)]
    if types is None or kind in types or (kind == "integer" and "number" in types):
        return value
    return text


def _element(text: str, open_tag: str, close_tag: str, missing: str, unclosed: str) -> tuple[str, str]:
    """``open_tag INNER close_tag`` at the start of ``text`` (after whitespace): (INNER, rest)."""
    text = text.lstrip()
    if not text.startswith(open_tag):
        raise ToolCallParseError(missing)
    inner, found, rest = text[len(open_tag) :].partition(close_tag)
    if not found:
        raise ToolCallParseError(unclosed)
    return inner, rest


def parse_call(block: str, req: ToolRequest | None) -> ToolCall:
    """One ``<tool_call>...</tool_call>`` body (without the outer tags)."""
    head, sep, rest = block.partition(KEY_OPEN)
    name = head.strip()
    if not name or not NAME_RE.match(name):
        raise ToolCallParseError(f"malformed tool name {name[:80]!r} (markup or text leaked into it)")
    tool = req.by_name().get(name) if req else None
    root = tool.parameters if tool else {}
    args: dict[str, Any] = {}
    rest = sep + rest
    while rest.strip():
        key, rest = _element(
            rest,
            KEY_OPEN,
            KEY_CLOSE,
            f"unexpected text in the arguments of {name!r}: {rest.lstrip()[:60]!r}",
            f"<arg_key> without </arg_key> in {name!r}",
        )
        key = key.strip()
        value, rest = _element(
            rest,
            VAL_OPEN,
            VAL_CLOSE,
            f"argument {key!r} of {name!r} has no <arg_value>",
            f"<arg_value> of {key!r} in {name!r} is not closed",
        )
        if key in args:
            raise ToolCallParseError(f"argument {key!r} of {name!r} given twice")
        args[key] = _typed_value(value, argument_schema(root, key), root)
    return ToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False))


class StreamingParser:
    """Feed text as it arrives; get back content pieces and completed calls, in order."""

    def __init__(self, req: ToolRequest | None):
        self.req = req
        self._buf = ""
        self._in_call = False
        self.calls: list[ToolCall] = []
        self.content: list[str] = []

    def feed(self, text: str) -> list[tuple[str, Any]]:
        """Events: ("content", str) and ("call", ToolCall)."""
        self._buf += text
        events: list[tuple[str, Any]] = []
        while True:
            if self._in_call:
                body, found, rest = self._buf.partition(CLOSE)
                if not found:
                    return events
                call = parse_call(body, self.req)
                self.calls.append(call)
                events.append(("call", call))
                self._buf, self._in_call = rest, False
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                if start:
                    events.append(self._text(self._buf[:start]))
                self._buf, self._in_call = self._buf[start + len(OPEN) :], True
                continue
            keep = _partial_suffix(self._buf, OPEN)  # might be the start of "<tool_call>"
            ready = self._buf[: len(self._buf) - keep]
            if ready:
                events.append(self._text(ready))
            self._buf = self._buf[len(self._buf) - keep :]
            return events

    def finish(self, cut: bool = False) -> list[tuple[str, Any]]:
        """The output ended. ``cut``: by the client's ``max_tokens`` (``finish_reason: length``);
        a call it cut short is then no call (the client hears ``length``), else an error."""
        if self._in_call and cut:
            self._buf, self._in_call = "", False
        if self._in_call:
            raise ToolCallParseError("the output ended inside a tool call (</tool_call> missing)")
        events = [self._text(self._buf)] if self._buf else []
        self._buf = ""
        return events

    def _text(self, text: str) -> tuple[str, str]:
        self.content.append(text)
        return ("content", text)


def _partial_suffix(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def parse(text: str, req: ToolRequest | None, cut: bool = False) -> tuple[str, list[ToolCall]]:
    """Whole-output parse (same code path as streaming): content text and calls."""
    p = StreamingParser(req)
    p.feed(text)
    p.finish(cut)
    return "".join(p.content), p.calls


_WS = re.compile(r"^\s+$")


def content_or_none(text: str, calls: list[ToolCall]) -> str | None:
    """OpenAI sends ``content: null`` next to tool calls when there is no real text."""
    return None if calls and (not text or _WS.match(text)) else text
