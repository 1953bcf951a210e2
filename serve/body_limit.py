"""Refuse request bodies over ``gateway.max_body_bytes`` before they are read into memory.

A declared ``Content-Length`` over the limit is answered 413 at once; a chunked body is counted
as it arrives and cut off at the limit. Either way the answer is in the OpenAI error shape.
"""

from __future__ import annotations

import json

from serve.errors import APIError, in_route_shape


class BodyTooLarge(Exception):
    pass


def too_large(limit: int, path: str = "") -> tuple[dict, bytes]:
    err = APIError(413, f"the request body is larger than {limit} bytes (gateway.max_body_bytes)", code="request_too_large")
    body = json.dumps(in_route_shape(path, err).body()).encode()
    start = {
        "type": "http.response.start",
        "status": 413,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, body


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send, scope["path"])
        seen, started = 0, False

        async def counting_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send, scope["path"])

    async def _refuse(self, send, path: str) -> None:
        start, body = too_large(self.max_bytes, path)
        await send(start)
        await send({"type": "http.response.body", "body": body})
