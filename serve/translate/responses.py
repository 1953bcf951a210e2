"""OpenAI's Responses API (``POST /v1/responses``) as a chat request, and the chat answer back.

What a Responses request may hold is typed here, and nothing else: a field, input item or tool
type this gateway cannot honour is a 400 naming it (README, "Responses API"), never dropped.

The mapping: ``instructions`` -> a system message first (not carried to the next turn, as
OpenAI does); ``input`` text -> a user message; message items -> messages (``input_text`` and
``output_text`` parts joined); ``function_call`` items -> the assistant's ``tool_calls``;
``function_call_output`` -> ``tool`` messages; function ``tools`` -> chat tools;
``max_output_tokens`` -> ``max_tokens``. A ``previous_response_id`` conversation is the earlier
turn's chat messages (less its instructions) and its output, read back from the trace store
(``serve/conversations.py``). The answer's way back is ``responses_answer.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serve.errors import APIError
from serve.translate.chat import chat_request


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: dict[str, Any] | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, examples=["tiny"])
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # keeps the conversation's session (one deployment's cache)
    include: list[str] | None = None
    text: TextFormat | None = None
    truncation: Literal["disabled"] | None = None
    service_tier: Literal["auto", "default"] | None = None
    background: Literal[False] | None = None

    @field_validator("include")
    @classmethod
    def _nothing_extra(cls, include):
        if include:  # none of OpenAI's extra output parts (logprobs, reasoning...) is produced here
            raise ValueError(f"{', '.join(include)} cannot be included (none of the extra output parts is supported)")
        return include


def _check_text(req: ResponsesRequest) -> None:
    fmt = (req.text.format or {}) if req.text else {}
    if fmt and fmt.get("type") != "text":
        raise APIError(400, f"text.format type {fmt.get('type')!r} is not supported (only 'text')", param="text.format")


def _parts_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or its ``input_text`` / ``output_text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, "content must be a string or a list of parts", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            message = f"content part type {kind!r} is not supported (only input_text and output_text)"
            raise APIError(400, message, param=f"{where}.content[{j}].type")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(items: str | list[dict]) -> list[dict]:
    """``input`` as chat messages; function calls join the assistant message before them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, "an input item must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"role {role!r} is not one of user, system, developer, assistant", param=f"{where}.role")
            out.append({"role": role, "content": _parts_text(item.get("content"), where)})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise APIError(400, "a function_call item needs call_id, name and arguments (strings)", param=where)
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, "a function_call_output item needs its call_id", param=f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _parts_text(output, where)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise APIError(
                400,
                f"input item type {kind!r} is not supported (message, function_call, function_call_output)",
                param=f"{where}.type",
            )
    return out


def chat_tools(req: ResponsesRequest) -> tuple[list[dict] | None, Any]:
    tools = None
    if req.tools:
        tools = []
        for i, t in enumerate(req.tools):
            if t.get("type") != "function" or not isinstance(t.get("name"), str):
                raise APIError(
                    400, f"tool type {t.get('type')!r} is not supported (only function tools)", param=f"tools[{i}].type"
                )
            unknown = set(t) - {"type", "name", "description", "parameters", "strict"}
            if unknown:
                raise APIError(400, f"unsupported tool field(s): {', '.join(sorted(unknown))}", param=f"tools[{i}]")
            parameters = t.get("parameters") or {"type": "object"}
            tools.append(
                {
                    "type": "function",
                    "function": {"name": t["name"], "description": t.get("description") or "", "parameters": parameters},
                }
            )
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise APIError(400, "tool_choice must be auto, none, required or {type: function, name}", param="tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools, choice


def chat_body(req: ResponsesRequest, earlier: list[dict]) -> dict:
    """The chat request for ``req``; ``earlier`` is the conversation before it (from
    ``previous_response_id``)."""
    _check_text(req)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + earlier
    messages += input_messages(req.input)
    if not messages:
        raise APIError(400, "input is empty", param="input")
    tools, choice = chat_tools(req)
    return chat_request(
        req.model,
        messages,
        req.stream,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
    )
