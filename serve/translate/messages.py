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
returned is valid against its ``input_schema``. The answer's way back is ``messages_answer.py``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from serve.errors import APIError
from serve.translate.chat import chat_request


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
    cache_control: CacheControl | None = None  # the whole prompt's: cached anyway


class CountTokensRequest(_Strict):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: list[TextBlock] | str | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: CacheControl | None = None


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
