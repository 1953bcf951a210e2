"""The completion routes as raw ASGI, ahead of FastAPI and its middleware.

``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and ``/v1/messages`` are the
gateway's traffic; everything else (admin, traces, batches, the UI, ``/openapi.json``, which
still documents these routes) goes on to FastAPI. Profiled at 50 streams/s on the sim profile, FastAPI's layers around a streaming
route (middleware wrapping every send and receive, routing, ``StreamingResponse`` and its anyio
task group) were about as much event-loop time as everything the gateway does for the request.
Here a request is read (refused with 413 past ``max_body_bytes``, as ``serve.body_limit`` does
for the other routes), handed to its route's ``serve`` and its answer written, in the route's
error shape (``serve.errors.in_route_shape``: Anthropic's on ``/v1/messages``).

A client that hangs up mid-stream is noticed as Starlette notices it, by waiting on ``receive``
beside the relay (from the first event sent on), so its deployment stream is closed at once and
its outcome is ``client_gone``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI

from serve import json_codec
from serve.body_limit import too_large
from serve.cross_site import CrossSite
from serve.errors import APIError, in_route_shape
from serve.refusal_pace import RefusalPace, caller_of, credential_of

log = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

# serve(headers as a dict of lower-case names, raw body) -> (answer, headers); the answer is a
# JSON-able dict, or an object with ``.headers`` and an async iterator ``.body``
Serve = Callable[[dict[str, str], bytes], Awaitable[tuple[object, dict[str, str]]]]


def _headers(extra: dict[str, str], base: list) -> list:
    return base + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]


class Gateway(FastAPI):
    """FastAPI, with the completion routes answered by its ``hot_path`` before anything else."""

    hot_path: HotPath | None = None
    cross_site: CrossSite | None = None
    refusal_pace: RefusalPace | None = None
    is_admin: Callable[[str | None], bool] = staticmethod(lambda credential: False)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.refusal_pace is not None:
            send = self._paced(scope, send)
        if scope["type"] == "http" and self.cross_site is not None:
            refused = self.cross_site.refusal(scope)
            if refused is not None:
                return await HotPath._json(send, refused.status, refused.body(), {})
        hot = self.hot_path
        if hot is not None and scope["type"] == "http" and scope["path"] in hot.routes and scope["method"] == "POST":
            return await self.hot_path(scope, receive, send)
        await super().__call__(scope, receive, send)

    def _paced(self, scope, send):
        """``send``, with a 4xx answer held back while its caller is past its pace
        (serve/refusal_pace.py)."""
        pace = self.refusal_pace

        async def paced(message):
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                credential = credential_of(scope)
                if not self.is_admin(credential):
                    wait = pace.wait_s(caller_of(scope, credential))
                    if wait > 0:
                        await asyncio.sleep(wait)
            await send(message)

        return paced


class HotPath:
    """Reads a request (413 past ``max_body_bytes``), hands it to its path's ``serve`` and writes
    the answer: JSON, or the stream as it comes; every error in the route's shape."""

    def __init__(self, routes: dict[str, Serve], max_body_bytes: int):
        self.routes, self.max_body_bytes = routes, max_body_bytes

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length", "")
        chunks, more, size = [], True, 0
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            more = False  # refused before a byte of it is read
            size = int(declared)
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False) and size <= self.max_body_bytes
        if size > self.max_body_bytes:
            start, body = too_large(self.max_body_bytes, path)
            await send(start)
            return await send({"type": "http.response.body", "body": body})
        try:
            answer, extra = await self.routes[path](headers, b"".join(chunks))
        except APIError as err:
            return await self._json(send, err.status, in_route_shape(path, err).body(), err.headers)
        except Exception as exc:  # the route's shape even for our own bugs, as FastAPI's handler
            log.exception("unexpected error serving %s", path)
            err = APIError(500, f"Internal error in the gateway: {type(exc).__name__}: {exc}", type="server_error")
            return await self._json(send, 500, in_route_shape(path, err).body(), {})
        if isinstance(answer, dict):
            return await self._json(send, 200, answer, extra)
        await self._stream(receive, send, answer, extra)

    @staticmethod
    async def _json(send, status: int, body: dict, extra: dict[str, str]) -> None:
        data = json_codec.encode(body)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": _headers({**extra, "content-length": str(len(data))}, _JSON),
            }
        )
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

        watcher = None
        body = answer.body
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _headers({**extra, **answer.headers}, _SSE)})
            async for piece in body:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                if watcher is None:  # from the first token on: its cost is not the first token's
                    watcher = asyncio.ensure_future(receive())
                    watcher.add_done_callback(hung_up)
            finished = True
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()  # the client left: the relay's own cleanup has run, nothing to answer
        finally:
            finished = True
            if watcher is not None:
                watcher.cancel()
            await body.aclose()  # a relay left early still settles its outcome, lease and trace
