"""Anthropic's Messages API (``POST /v1/messages``) as a chat request, and the chat answer back.

What a Messages request may hold is typed here, and nothing else: a field or content block this
gateway cannot honour is a 400 naming it (see README, "Messages API"), never dropped.
``cache_control`` is accepted on every block: the engine's prefix cache is automatic, so a
marked prefix is cached as any other.

The mapping: ``system`` -> a system message; ``tool_use`` blocks -> the assistant's
``tool_calls``; ``tool_result`` blocks -> ``tool`` messages (before the user's other blocks, as
Anthropic orders them); ``tools[].input_schema`` -> ``parameters``; ``tool_choice`` ``auto``,
``any``, ``tool``, ``none`` -> ``auto``, ``required``, a named function, ``none``;
``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``; ``stop_sequences`` -> ``stop``.
Tool calls come back through the same grammar and checks as chat's, so every ``tool_use``
returned is valid against its ``input_schema``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve.errors import APIError, anthropic_error
from serve.translate.chat import chat_request, named_event


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheControl(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["ephemeral"]


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: list[TextBlock] | str | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class InputMessage(_Strict):
    role: Literal["user", "assistant"]
    content: list[Block] | str  # the list first: its errors (a block type) are the ones to name


class ToolDef(_Strict):
    type: Literal["custom"] | None = None  # Anthropic's server tools (web search, bash...) are not ours to run
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(_Strict):
    user_id: str | None = None


class Thinking(_Strict):
    type: Literal["disabled"]  # extended thinking needs a reasoning model's template: not served here


class MessagesRequest(_Strict):
    model: str = Field(min_length=1, examples=["tiny"])
    max_tokens: int = Field(ge=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: list[TextBlock] | str | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = Field(None, max_length=4)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    thinking: Thinking | None = None


class CountTokensRequest(_Strict):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: list[TextBlock] | str | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


def _text(content: str | list[TextBlock] | None) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(b.text for b in content)


def chat_messages(req: MessagesRequest | CountTokensRequest) -> list[dict]:
    out: list[dict] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system)})
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts = [b.text for b in m.content if isinstance(b, TextBlock)]
        if m.role == "assistant":
            if any(isinstance(b, ToolResultBlock) for b in m.content):
                raise APIError(400, "a tool_result block belongs in a user message", param=f"messages.{i}.content")
            calls = [
                {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                for b in m.content
                if isinstance(b, ToolUseBlock)
            ]
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        for b in m.content:
            if isinstance(b, ToolUseBlock):
                raise APIError(400, "a tool_use block belongs in an assistant message", param=f"messages.{i}.content")
            if isinstance(b, ToolResultBlock):
                text = _text(b.content)
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": f"Error: {text}" if b.is_error else text})
        if texts:
            out.append({"role": "user", "content": "".join(texts)})
    return out


def chat_tools(req: MessagesRequest | CountTokensRequest) -> tuple[list[dict] | None, Any, bool | None]:
    """(tools, tool_choice, parallel_tool_calls) for the chat request."""
    tools = (
        [
            {"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema}}
            for t in req.tools
        ]
        if req.tools
        else None
    )
    choice, parallel = req.tool_choice, None
    if choice is None:
        return tools, None, None
    if choice.disable_parallel_tool_use:
        parallel = False
    if choice.type == "tool":
        if not choice.name:
            raise APIError(400, "tool_choice of type 'tool' needs the tool's name", param="tool_choice.name")
        return tools, {"type": "function", "function": {"name": choice.name}}, parallel
    return tools, {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def chat_body(req: MessagesRequest) -> dict:
    tools, choice, parallel = chat_tools(req)
    return chat_request(
        req.model,
        chat_messages(req),
        req.stream,
        max_tokens=req.max_tokens,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        stop=req.stop_sequences or None,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
    )


def message_id(trace_id: str) -> str:
    return "msg_" + trace_id.removeprefix("tr-")


def _stop(finish: str | None, matched, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    if finish == "length":
        return "max_tokens", None
    if finish == "tool_calls":
        return "tool_use", None
    if isinstance(matched, str) and stop_sequences and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


def usage(chat_usage: dict | None) -> dict:
    """Anthropic's usage: ``input_tokens`` are those not read from the cache."""
    u = chat_usage or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": (u.get("prompt_tokens") or 0) - cached,
        "output_tokens": u.get("completion_tokens") or 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _tool_use(call: dict) -> dict:
    fn = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"] or "{}")}


def message(chat: dict, trace_id: str, alias: str, req: MessagesRequest) -> dict:
    """A unary chat completion as a Messages response."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    content = [{"type": "text", "text": msg["content"]}] if msg.get("content") else []
    content += [_tool_use(c) for c in msg.get("tool_calls") or []]
    stop_reason, stop_sequence = _stop(choice.get("finish_reason"), choice.get("stop_reason"), req.stop_sequences)
    return {
        "id": message_id(trace_id),
        "type": "message",
        "role": "assistant",
        "model": alias,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage(chat.get("usage")),
    }


class MessagesStream:
    """Chat chunks in, Messages stream events out: ``message_start``, a text block while text
    comes, one ``tool_use`` block per call (its input in one ``input_json_delta``: calls come
    whole, checked), ``message_delta`` with the stop reason and usage, ``message_stop``."""

    def __init__(self, trace_id: str, alias: str, req: MessagesRequest):
        self.id, self.alias, self.req = message_id(trace_id), alias, req
        self.started, self.text_open, self.blocks = False, False, 0
        self.finish: str | None = None
        self.matched = None
        self.usage: dict | None = None

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        start = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.alias,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(None),
        }
        return [named_event("message_start", {"type": "message_start", "message": start})]

    def _close_text(self) -> list[bytes]:
        if not self.text_open:
            return []
        self.text_open = False
        self.blocks += 1
        return [named_event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def chunk(self, obj: dict) -> list[bytes]:
        out = self._start()
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if not self.text_open:
                    self.text_open = True
                    block = {"type": "content_block_start", "index": self.blocks, "content_block": {"type": "text", "text": ""}}
                    out.append(named_event("content_block_start", block))
                text = {
                    "type": "content_block_delta",
                    "index": self.blocks,
                    "delta": {"type": "text_delta", "text": delta["content"]},
                }
                out.append(named_event("content_block_delta", text))
            for call in delta.get("tool_calls") or []:
                out += self._close_text()
                i = self.blocks
                self.blocks += 1
                use = {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}
                out.append(named_event("content_block_start", {"type": "content_block_start", "index": i, "content_block": use}))
                args = {"type": "input_json_delta", "partial_json": call["function"]["arguments"] or "{}"}
                out.append(named_event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": args}))
                out.append(named_event("content_block_stop", {"type": "content_block_stop", "index": i}))
            if choice.get("finish_reason"):
                self.finish, self.matched = choice["finish_reason"], choice.get("stop_reason")
        return out

    def done(self) -> list[bytes]:
        out = self._start() + self._close_text()
        stop_reason, stop_sequence = _stop(self.finish, self.matched, self.req.stop_sequences)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage(self.usage),
        }
        return out + [named_event("message_delta", delta), named_event("message_stop", {"type": "message_stop"})]

    def failed(self, error: dict) -> list[bytes]:
        kind = "overloaded_error" if error.get("code") == "capacity_exceeded" else "api_error"
        return [named_event("error", anthropic_error(kind, str(error.get("message") or error)))]
