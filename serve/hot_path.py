"""The completion routes as raw ASGI, ahead of FastAPI's routing.

``POST /v1/chat/completions``, ``/v1/completions`` are the gateway's traffic; everything else
(admin, traces, batches, the UI, ``/openapi.json``, which still documents these two routes) goes
on to FastAPI. Profiled at 50 streams/s on the sim profile, FastAPI's layers around a streaming
route (exception and exit-stack middleware, routing, ``StreamingResponse`` and its anyio task
group) were about as much event-loop time as everything the gateway does for the request. Here
a request is read, handed to ``serve`` and its answer written, with the same error shape.

A client that hangs up mid-stream is noticed as Starlette notices it, by waiting on ``receive``
beside the relay, so its deployment stream is closed at once and its outcome is ``client_gone``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

from serve.errors import APIError

log = logging.getLogger(__name__)

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

# serve(operation, headers as a dict of lower-case names, raw body) -> (answer, headers); the
# answer is a JSON-able dict, or an object with ``.headers`` and an async iterator ``.body``
Serve = Callable[[str, dict[str, str], bytes], Awaitable[tuple[object, dict[str, str]]]]


def _headers(extra: dict[str, str], base: list) -> list:
    return base + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]


class HotPath:
    """ASGI middleware: the completion routes served directly, the rest passed to ``app``."""

    def __init__(self, app, serve: Serve):
        self.app, self.serve = app, serve

    async def __call__(self, scope, receive, send):
        operation = ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if operation is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            answer, extra = await self.serve(operation, headers, b"".join(chunks))
        except APIError as err:
            return await self._json(send, err.status, err.body(), err.headers)
        except Exception as exc:  # the OpenAI shape even for our own bugs, as FastAPI's handler
            log.exception("unexpected error serving %s", operation)
            err = APIError(500, f"Internal error in the gateway: {type(exc).__name__}: {exc}", type="server_error")
            return await self._json(send, 500, err.body(), {})
        if isinstance(answer, dict):
            return await self._json(send, 200, answer, extra)
        await self._stream(receive, send, answer, extra)

    @staticmethod
    async def _json(send, status: int, body: dict, extra: dict[str, str]) -> None:
        data = msgspec.json.encode(body)
        await send({"type": "http.response.start", "status": status,
                    "headers": _headers({**extra, "content-length": str(len(data))}, _JSON)})
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def _stream(receive, send, answer, extra: dict[str, str]) -> None:
        task = asyncio.current_task()
        finished = gone = False

        def hung_up(waiter: asyncio.Future) -> None:
            nonlocal gone
            if not finished and not waiter.cancelled() and waiter.result()["type"] == "http.disconnect":
                gone = True
                task.cancel()

        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(hung_up)
        body = answer.body
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": _headers({**extra, **answer.headers}, _SSE)})
            async for piece in body:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            finished = True
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()  # the client left: the relay's own cleanup has run, nothing to answer
        finally:
            finished = True
            watcher.cancel()
            await body.aclose()  # a relay left early still settles its outcome, lease and trace
