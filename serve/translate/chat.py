"""What every translation shares: the chat request it builds, and the gateway's own chat stream
read back as objects for a translator to re-emit as its API's typed events.

The relay (``serve/relay.py``) yields one SSE event per piece: a chat chunk, an error object,
or ``[DONE]``, which it sends only once the trace is stored. A translator therefore ends its
stream (``message_stop``, ``response.completed``) on the same promise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from serve import json_codec


class Translator(Protocol):
    def chunk(self, obj: dict) -> list[bytes]: ...
    def done(self) -> list[bytes]: ...
    def failed(self, error: dict) -> list[bytes]: ...


def chat_request(model: str, messages: list[dict], stream: bool, **fields) -> dict:
    """A chat request: ``fields`` that are None left out; a stream asks for usage, which every
    translated API reports at its end."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    body.update((k, v) for k, v in fields.items() if v is not None)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


class ChatEvents:
    """The walk both stream translators share: the chat chunks in order, each piece of text and
    each tool call (whole, and checked, as ``serve/tools/response.py`` passes them) handed to
    the subclass's hooks; the usage and how the engine stopped kept for the end. ``begin``
    gives the stream's opening events once, before anything else."""

    def __init__(self) -> None:
        self.started = False
        self.finish: str | None = None
        self.matched: str | int | None = None  # the stop string or token the engine stopped on
        self.usage: dict | None = None

    def start(self) -> list[bytes]:
        raise NotImplementedError

    def text(self, piece: str) -> list[bytes]:
        raise NotImplementedError

    def call(self, call: dict) -> list[bytes]:
        raise NotImplementedError

    def close_text(self) -> list[bytes]:
        raise NotImplementedError

    def begin(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        return self.start()

    def chunk(self, obj: dict) -> list[bytes]:
        out = self.begin()
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self.text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self.close_text() + self.call(call)
            if choice.get("finish_reason"):
                self.finish, self.matched = choice["finish_reason"], choice.get("stop_reason")
        return out


def named_event(name: str, obj: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json_codec.encode(obj) + b"\n\n"


async def translated(body: AsyncIterator[bytes], translator: Translator) -> AsyncIterator[bytes]:
    """``body`` (the chat stream's SSE bytes) as ``translator``'s events. Closing this closes
    ``body``, so a client that leaves settles the request as it does for chat."""
    try:
        async for piece in body:
            for line in piece.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    for out in translator.done():
                        yield out
                    continue
                obj = json_codec.decode(data)
                for out in translator.failed(obj["error"]) if "error" in obj else translator.chunk(obj):
                    yield out
    finally:
        await body.aclose()
