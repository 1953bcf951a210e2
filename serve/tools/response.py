"""Turning the engine's raw GLM text into checked OpenAI tool calls, unary and streamed.

Every call is validated against its tool's schema before a client sees it. A call that names
an undeclared tool, has invalid arguments, or is left unfinished is never passed on as valid:
the response fails with ``invalid_tool_call`` (HTTP 502 for a unary response, an error event
for a stream), and the trace records why. No retry is attempted: with the grammar in place
this should not happen, so when it does it is a bug to see.

One ending is the client's, not the model's: output cut by ``max_tokens`` (``finish_reason:
length``), as OpenAI answers it. The calls completed before the cut are returned, a call the
cut left open is not, and ``finish_reason`` stays ``length`` so the client knows to raise
``max_tokens`` (``tool_choice: required`` with no call finished is then no error either). The
trace keeps the engine's token ids, so the cut call is still there to read.
"""

from __future__ import annotations

from serve.errors import APIError
from serve.tools.definitions import ToolRequest, validate_call
from serve.tools.glm_parser import StreamingParser, ToolCall, ToolCallParseError, content_or_none, parse


def invalid_tool_call(reason: str) -> APIError:
    return APIError(502, f"the model produced an invalid tool call: {reason}", type="server_error", code="invalid_tool_call")


def _checked(req: ToolRequest, calls: list[ToolCall]) -> None:
    if req.choice in ("required", "named") and not calls:
        return  # judged at the end (a stream may not have reached its call yet)
    if not req.parallel and len(calls) > 1:
        raise invalid_tool_call("several calls although parallel_tool_calls is false")
    for c in calls:
        reason = validate_call(req, c.name, c.arguments)
        if reason:
            raise invalid_tool_call(reason)


def _final_check(req: ToolRequest, calls: list[ToolCall], cut: bool) -> None:
    if req.choice in ("required", "named") and not calls and not cut:
        raise invalid_tool_call(f"tool_choice is {req.choice!r} but the model made no call")
    if req.choice == "none" and calls:
        raise invalid_tool_call("a call although tool_choice is 'none'")


def transform_message(req: ToolRequest, choice: dict) -> dict:
    """A unary chat choice with raw GLM text -> content + tool_calls (in place)."""
    msg = choice.get("message") or {}
    cut = choice.get("finish_reason") == "length"
    try:
        content, calls = parse(msg.get("content") or "", req, cut)
    except ToolCallParseError as exc:
        raise invalid_tool_call(str(exc)) from None
    _checked(req, calls)
    _final_check(req, calls, cut)
    msg["content"] = content_or_none(content, calls)
    if calls:
        msg["tool_calls"] = [c.openai() for c in calls]
        if choice.get("finish_reason") == "stop":
            choice["finish_reason"] = "tool_calls"
    return choice


class StreamTransformer:
    """Rewrites chat chunks: content deltas pass (minus markup), calls appear whole."""

    def __init__(self, req: ToolRequest):
        self.req = req
        self.parser = StreamingParser(req)

    def chunk(self, chunk: dict) -> dict:
        for choice in chunk.get("choices") or []:
            delta = choice.setdefault("delta", {})
            events = []
            try:
                if delta.get("content"):
                    events += self.parser.feed(delta["content"])
                if choice.get("finish_reason"):
                    events += self.parser.finish(cut=choice["finish_reason"] == "length")
            except ToolCallParseError as exc:
                raise invalid_tool_call(str(exc)) from None
            text = "".join(e[1] for e in events if e[0] == "content")
            new_calls = [e[1] for e in events if e[0] == "call"]
            _checked(self.req, self.parser.calls)
            if "content" in delta:
                delta["content"] = text  # markup held back or turned into tool_calls below
            if new_calls:
                first = len(self.parser.calls) - len(new_calls)
                delta["tool_calls"] = [c.openai(index=first + i) for i, c in enumerate(new_calls)]
            if choice.get("finish_reason"):
                _final_check(self.req, self.parser.calls, cut=choice["finish_reason"] == "length")
                if self.parser.calls and choice["finish_reason"] == "stop":
                    choice["finish_reason"] = "tool_calls"
        return chunk

    def output(self) -> tuple[str | None, list[dict]]:
        calls = self.parser.calls
        return content_or_none("".join(self.parser.content), calls), [c.openai() for c in calls]
