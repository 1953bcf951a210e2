"""A chat answer as the Responses API's: the Response object (unary, ``GET``), its output items,
a conversation as input items, and the typed stream events (:class:`ResponsesStream`). A
response's id is its trace's (``resp_<hex>`` for ``tr-<hex>``); its items' ids derive from it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from serve.translate.chat import ChatEvents, named_event


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


class ResponsesStream(ChatEvents):
    """Chat chunks in, Responses stream events out: ``response.created``, ``.in_progress``, a
    message item with its ``output_text`` deltas while text comes, one ``function_call`` item
    per call (its arguments in one delta: calls come whole, checked), ``response.completed``
    (or ``.incomplete``) once the trace is stored; ``error`` and ``response.failed`` when the
    deployment fails mid-stream."""

    def __init__(self, trace_id: str, alias: str, req: dict):
        super().__init__()
        self.rid, self.alias, self.req = response_id(trace_id), alias, req
        self.created_at = time.time()
        self.seq = 0
        self.output: list[dict] = []
        self.open_text: list[str] | None = None  # the open message item's text
        self.finished: Callable[[ResponsesStream], None] | None = None  # called once the answer is whole

    def _event(self, kind: str, **fields) -> bytes:
        out = named_event(kind, {"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return out

    def _snapshot(self, status: str) -> dict:
        return response_object(self.rid, self.req, self.alias, self.created_at, self.output, self.usage, self.finish, status)

    def start(self) -> list[bytes]:
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    def close_text(self) -> list[bytes]:
        if self.open_text is None:
            return []
        text, self.open_text = "".join(self.open_text), None
        i = len(self.output) - 1
        item = self.output[i] = _message_item(self.rid, text)
        part = item["content"][0] if item["content"] else {"type": "output_text", "text": "", "annotations": []}
        at = {"item_id": item["id"], "output_index": i, "content_index": 0}
        return [
            self._event("response.output_text.done", **at, text=text, logprobs=[]),
            self._event("response.content_part.done", **at, part=part),
            self._event("response.output_item.done", output_index=i, item=item),
        ]

    def text(self, piece: str) -> list[bytes]:
        out = []
        if self.open_text is None:
            self.open_text = []
            self.output.append(_message_item(self.rid, "", status="in_progress"))
            i, item = len(self.output) - 1, self.output[-1]
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._event("response.output_item.added", output_index=i, item=item))
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part))
        self.open_text.append(piece)
        at = {"item_id": self.output[-1]["id"], "output_index": len(self.output) - 1, "content_index": 0}
        return out + [self._event("response.output_text.delta", **at, delta=piece, logprobs=[])]

    def call(self, call: dict) -> list[bytes]:
        i = len(self.output)
        n_calls = sum(1 for item in self.output if item["type"] == "function_call")
        done = _call_item(self.rid, n_calls, call)
        self.output.append(done)
        added = {**done, "arguments": "", "status": "in_progress"}
        at = {"item_id": done["id"], "output_index": i}
        return [
            self._event("response.output_item.added", output_index=i, item=added),
            self._event("response.function_call_arguments.delta", **at, delta=done["arguments"]),
            self._event("response.function_call_arguments.done", **at, arguments=done["arguments"], name=done["name"]),
            self._event("response.output_item.done", output_index=i, item=done),
        ]

    def done(self) -> list[bytes]:
        out = self.begin() + self.close_text()
        status = "incomplete" if self.finish == "length" else "completed"
        if self.finished is not None:
            self.finished(self)
        return out + [self._event(f"response.{status}", response=self._snapshot(status))]

    def failed(self, error: dict) -> list[bytes]:
        out = self.begin() + self.close_text()
        code, message = error.get("code") or "server_error", str(error.get("message") or error)
        failed = self._snapshot("failed")
        failed["error"] = {"code": code, "message": message}
        return out + [
            self._event("error", code=code, message=message, param=None),
            self._event("response.failed", response=failed),
        ]
