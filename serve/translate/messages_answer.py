"""A chat answer as the Messages API's: the message (unary) and the stream events
(:class:`MessagesStream`), with Anthropic's stop reasons and usage (cached prompt tokens apart).
"""

from __future__ import annotations

import json

from serve.errors import anthropic_error
from serve.translate.chat import ChatEvents, named_event
from serve.translate.messages import MessagesRequest


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


class MessagesStream(ChatEvents):
    """Chat chunks in, Messages stream events out: ``message_start``, a text block while text
    comes, one ``tool_use`` block per call (its input in one ``input_json_delta``: calls come
    whole, checked), ``message_delta`` with the stop reason and usage, ``message_stop``."""

    def __init__(self, trace_id: str, alias: str, req: MessagesRequest):
        super().__init__()
        self.id, self.alias, self.req = message_id(trace_id), alias, req
        self.text_open, self.blocks = False, 0

    def start(self) -> list[bytes]:
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

    def close_text(self) -> list[bytes]:
        if not self.text_open:
            return []
        self.text_open = False
        self.blocks += 1
        return [named_event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def text(self, piece: str) -> list[bytes]:
        out = []
        if not self.text_open:
            self.text_open = True
            block = {"type": "content_block_start", "index": self.blocks, "content_block": {"type": "text", "text": ""}}
            out.append(named_event("content_block_start", block))
        delta = {"type": "content_block_delta", "index": self.blocks, "delta": {"type": "text_delta", "text": piece}}
        return out + [named_event("content_block_delta", delta)]

    def call(self, call: dict) -> list[bytes]:
        i = self.blocks
        self.blocks += 1
        use = {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}
        args = {"type": "input_json_delta", "partial_json": call["function"]["arguments"] or "{}"}
        return [
            named_event("content_block_start", {"type": "content_block_start", "index": i, "content_block": use}),
            named_event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": args}),
            named_event("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]

    def done(self) -> list[bytes]:
        out = self.begin() + self.close_text()
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
