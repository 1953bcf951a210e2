"""OpenAI's Responses API (``POST /v1/responses``) as a chat request, and the chat answer back.

What a Responses request may hold is typed here, and nothing else: a field, input item or tool
type this gateway cannot honour is a 400 naming it (README, "Responses API"), never dropped.

The mapping: ``instructions`` -> a system message first (not carried to the next turn, as
OpenAI does); ``input`` text -> a user message; message items -> messages (``input_text`` and
``output_text`` parts joined); ``function_call`` items -> the assistant's ``tool_calls``;
``function_call_output`` -> ``tool`` messages; function ``tools`` -> chat tools;
``max_output_tokens`` -> ``max_tokens``. A ``previous_response_id`` conversation is the earlier
turn's chat messages (less its instructions) and its output, read back from the trace store
(``serve/conversations.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serve.errors import APIError
from serve.translate.chat import chat_request, named_event


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


def response_id(trace_id: str) -> str:
    return "resp_" + trace_id.removeprefix("tr-")


def trace_id_of(resp_id: str) -> str | None:
    """The trace behind a response id (None: not one of ours)."""
    hex_part = resp_id.removeprefix("resp_")
    if hex_part == resp_id or len(hex_part) != 32 or any(c not in "0123456789abcdef" for c in hex_part):
        return None
    return "tr-" + hex_part


def usage(chat_usage: dict | None) -> dict:
    u = chat_usage or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": u.get("prompt_tokens") or 0,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": u.get("completion_tokens") or 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.get("total_tokens") or (u.get("prompt_tokens") or 0) + (u.get("completion_tokens") or 0),
    }


def _message_item(rid: str, text: str, status: str = "completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": "msg_" + rid[5:], "status": status, "role": "assistant", "content": [part] if text else []}


def _call_item(rid: str, i: int, call: dict, status: str = "completed") -> dict:
    fn = call["function"]
    return {
        "type": "function_call",
        "id": f"fc_{rid[5:]}_{i}",
        "call_id": call["id"],
        "name": fn["name"],
        "arguments": fn["arguments"],
        "status": status,
    }


def output_items(rid: str, content: str | None, tool_calls: list[dict]) -> list[dict]:
    items = [_message_item(rid, content)] if content else []
    return items + [_call_item(rid, i, c) for i, c in enumerate(tool_calls)]


def response_object(
    rid: str,
    req: dict,
    alias: str,
    created_at: float,
    output: list[dict],
    chat_usage: dict | None,
    finish: str | None,
    status: str | None = None,
) -> dict:
    """The Response object; ``req`` is the client's request as a dict."""
    status = status or ("incomplete" if finish == "length" else "completed")
    return {
        "id": rid,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "model": alias,
        "output": output,
        "parallel_tool_calls": req.get("parallel_tool_calls") is not False,
        "previous_response_id": req.get("previous_response_id"),
        "temperature": req.get("temperature"),
        "top_p": req.get("top_p"),
        "tool_choice": req.get("tool_choice") or "auto",
        "tools": req.get("tools") or [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": req.get("store", True),
        "metadata": req.get("metadata") or {},
        "user": req.get("user"),
        "usage": usage(chat_usage) if chat_usage is not None else None,
    }


def response(chat: dict, trace_id: str, alias: str, req: dict, created_at: float) -> dict:
    """A unary chat completion as a Response."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    rid = response_id(trace_id)
    items = output_items(rid, msg.get("content"), msg.get("tool_calls") or [])
    return response_object(rid, req, alias, created_at, items, chat.get("usage") or {}, choice.get("finish_reason"))


def conversation_items(messages: list[dict]) -> list[dict]:
    """Chat messages back as Responses items (``GET /v1/responses/{id}/input_items``)."""
    items: list[dict] = []
    for n, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            output = m.get("content") or ""
            items.append({"type": "function_call_output", "id": f"fco_{n}", "call_id": m.get("tool_call_id"), "output": output})
            continue
        content = m.get("content")
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
        if text or role != "assistant":
            kind = "output_text" if role == "assistant" else "input_text"
            part = {"type": kind, "text": text}
            items.append({"type": "message", "id": f"msg_{n}", "role": role, "status": "completed", "content": [part]})
        for i, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") or {}
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}_{i}",
                    "call_id": call.get("id"),
                    "name": fn.get("name"),
                    "arguments": fn.get("arguments") if isinstance(fn.get("arguments"), str) else json.dumps(fn.get("arguments")),
                    "status": "completed",
                }
            )
    return items


class ResponsesStream:
    """Chat chunks in, Responses stream events out: ``response.created``, ``.in_progress``, a
    message item with its ``output_text`` deltas while text comes, one ``function_call`` item
    per call (its arguments in one delta: calls come whole, checked), ``response.completed``
    (or ``.incomplete``) once the trace is stored; ``error`` and ``response.failed`` when the
    deployment fails mid-stream."""

    def __init__(self, trace_id: str, alias: str, req: dict):
        self.rid, self.alias, self.req = response_id(trace_id), alias, req
        self.created_at = time.time()
        self.seq = 0
        self.started = False
        self.output: list[dict] = []
        self.text: list[str] | None = None  # the open message item's text
        self.finish: str | None = None
        self.usage: dict | None = None
        self.finished: Callable[[ResponsesStream], None] | None = None  # called once the answer is whole

    def _event(self, kind: str, **fields) -> bytes:
        out = named_event(kind, {"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return out

    def _snapshot(self, status: str) -> dict:
        return response_object(self.rid, self.req, self.alias, self.created_at, self.output, self.usage, self.finish, status)

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    def _close_text(self) -> list[bytes]:
        if self.text is None:
            return []
        text, self.text = "".join(self.text), None
        i = len(self.output) - 1
        item = self.output[i] = _message_item(self.rid, text)
        part = item["content"][0] if item["content"] else {"type": "output_text", "text": "", "annotations": []}
        at = {"item_id": item["id"], "output_index": i, "content_index": 0}
        return [
            self._event("response.output_text.done", **at, text=text, logprobs=[]),
            self._event("response.content_part.done", **at, part=part),
            self._event("response.output_item.done", output_index=i, item=item),
        ]

    def chunk(self, obj: dict) -> list[bytes]:
        out = self._start()
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.text is None:
                    self.text = []
                    self.output.append(_message_item(self.rid, "", status="in_progress"))
                    i, item = len(self.output) - 1, self.output[-1]
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    out.append(self._event("response.output_item.added", output_index=i, item=item))
                    out.append(
                        self._event("response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part)
                    )
                self.text.append(delta["content"])
                at = {"item_id": self.output[-1]["id"], "output_index": len(self.output) - 1, "content_index": 0}
                out.append(self._event("response.output_text.delta", **at, delta=delta["content"], logprobs=[]))
            for call in delta.get("tool_calls") or []:
                out += self._close_text()
                i = len(self.output)
                n_calls = sum(1 for item in self.output if item["type"] == "function_call")
                done = _call_item(self.rid, n_calls, call)
                self.output.append(done)
                added = {**done, "arguments": "", "status": "in_progress"}
                out.append(self._event("response.output_item.added", output_index=i, item=added))
                at = {"item_id": done["id"], "output_index": i}
                out.append(self._event("response.function_call_arguments.delta", **at, delta=done["arguments"]))
                out.append(
                    self._event("response.function_call_arguments.done", **at, arguments=done["arguments"], name=done["name"])
                )
                out.append(self._event("response.output_item.done", output_index=i, item=done))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def done(self) -> list[bytes]:
        out = self._start() + self._close_text()
        status = "incomplete" if self.finish == "length" else "completed"
        if self.finished is not None:
            self.finished(self)
        return out + [self._event(f"response.{status}", response=self._snapshot(status))]

    def failed(self, error: dict) -> list[bytes]:
        out = self._start() + self._close_text()
        code, message = error.get("code") or "server_error", str(error.get("message") or error)
        failed = self._snapshot("failed")
        failed["error"] = {"code": code, "message": message}
        return out + [
            self._event("error", code=code, message=message, param=None),
            self._event("response.failed", response=failed),
        ]
