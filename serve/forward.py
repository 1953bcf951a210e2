"""One request's way through the gateway: admission, deployment choice, forwarding, capture.

1. Admission: the team's budget reserves the worst-case cost, the deployment's lease its slot.
2. Deployment choice: the alias's deployments (primary, then fallbacks), the session's own
   deployment first (affinity), skipping those whose circuit breaker is open.
3. Forwarding with failover: a connect error, 5xx or timeout before the first token counts
   against that deployment's breaker and the request moves to the next one; after the first
   token a failure ends the stream with an OpenAI-style error event (never a silent cut).
4. Capture: the trace is durable before the response finishes; leases are renewed while a
   stream runs and released (budget settled at real usage) when it ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass

import msgspec

from serve.admission import Admission, Admitted
from serve.affinity import Affinity
from serve.breaker import Breakers
from serve.capture import Capture, RequestContext
from serve.config import GatewayConfig, ModelRoute
from serve.context_limit import check_counts, check_text, might_overflow
from serve.errors import APIError, model_not_found
from serve.metrics import Metrics
from serve.outcome import Outcome
from serve.tools.definitions import Bounds, parse_tools
from serve.tools.grammar import grammar_for
from serve.tools.response import StreamTransformer, transform_message
from serve.upstream import Rewrite, upstream_error
from serve.upstream_pool import UpstreamError, UpstreamPool, UpstreamResponse, UpstreamTimeout
from traces.writer import TraceWriter

log = logging.getLogger(__name__)

# operation -> the deployment endpoint that serves it (token-in/token-out runs as a completion
# whose prompt is token ids)
ENDPOINTS = {"chat": "/v1/chat/completions", "text_completion": "/v1/completions",
             "generate": "/v1/completions"}


def upstream_headers(ctx: RequestContext) -> dict[str, str]:
    """The session travels on as Dynamo's session id: with session affinity on, the deployment's
    router keeps the session on the worker that holds its KV cache."""
    return {"x-dynamo-session-id": ctx.session_id} if ctx.session_id else {}


@dataclass
class Stream:
    """A streamed answer: its headers, and the SSE bytes to send as they come."""

    headers: dict[str, str]
    body: AsyncIterator[bytes]


def _decode(data: bytes):
    """One JSON value; msgspec's decoder is several times faster than json's on stream chunks,
    json's is the fallback for what strict JSON lacks (NaN, Infinity) and says what is wrong."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


def _event(obj) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class _Retryable(Exception):
    def __init__(self, error: APIError, outcome: Outcome):
        self.error, self.outcome = error, outcome


class Forwarder:
    def __init__(self, config: GatewayConfig, routes: MutableMapping[str, ModelRoute], writer: TraceWriter,
                 admission: Admission, breakers: Breakers, affinity: Affinity, metrics: Metrics):
        self.config, self.routes, self.writer = config, routes, writer
        self.admission, self.breakers, self.affinity, self.metrics = admission, breakers, affinity, metrics
        self.bounds = Bounds(config.tools.max_string_length, config.tools.max_array_items)
        self.pool = UpstreamPool(read_timeout=config.upstream_timeout_s)

    async def durable(self, record: dict) -> None:
        """Store the trace of a request that fails anyway: a failing disk is logged, and the
        client hears the request's own error."""
        try:
            await self.writer.write_async(record)
        except Exception:
            log.exception("trace %s could not be made durable", record.get("trace_id"))

    async def acknowledge(self, record: dict) -> None:
        """Wait until the trace of a successful response is fsync'd; a response is delivered
        only after its record is, so a trace that cannot be stored fails the request (503)."""
        try:
            await self.writer.write_async(record)
        except Exception as exc:
            log.error("trace %s could not be made durable: %s", record.get("trace_id"), exc)
            self.metrics.trace_store_errors.inc()
            raise trace_store_unavailable(exc) from None

    def candidates(self, route: ModelRoute, session: str | None) -> list[str]:
        deps = [route.deployment] + [d for d in route.fallbacks if d != route.deployment]
        healthy = {d for d in deps if self.breakers.state_of(d) != "open"}
        return self.affinity.order(session, deps, healthy)

    async def forward(self, operation: str, body: dict, ctx: RequestContext):
        """Returns the client's view (a dict, or a :class:`Stream`) and the headers to send."""
        route = self.routes.get(body["model"])
        if route is None:
            raise model_not_found(body["model"])
        dep = self.config.deployment(route.deployment)
        check_counts(body, dep.max_model_len)
        if might_overflow(body, dep.max_model_len):
            await asyncio.to_thread(check_text, body, dep.max_model_len, dep.model_path)
        tool_req = parse_tools(body, self.bounds) if operation == "chat" else None
        if tool_req is not None and body.get("guided_grammar"):
            raise APIError(400, "guided_grammar cannot be combined with tools", param="guided_grammar")
        capture = Capture(ctx)
        # compiling a grammar can take a while for a large schema: not on the event loop
        grammar = await asyncio.to_thread(grammar_for, tool_req, self.config.tools.layout) if tool_req else None
        rewrite = Rewrite(body, operation, route.upstream_model, grammar)
        headers = {"X-Trace-ID": ctx.trace_id}
        last_error = APIError(503, f"no healthy deployment serves {ctx.alias!r} (all circuit breakers open)",
                              type="server_error")
        last_outcome = Outcome.REJECTED
        for dep_name in self.candidates(route, ctx.session_id):
            if not self.breakers.allow(dep_name):
                continue
            t_wait = time.monotonic()
            try:
                admitted = await self.admission.admit(dep_name, ctx.team, ctx.alias, body,
                                                      batch=ctx.batch_id is not None)
            except APIError as err:
                if err.code == "capacity_exceeded":  # full: the next deployment may have room
                    last_error, last_outcome = err, Outcome.REJECTED
                    continue
                self.metrics.rejected(ctx.alias, ctx.team, err.status)
                self.metrics.outcomes.labels("", Outcome.REJECTED.value).inc()
                await self.durable(capture.record(err.status, err.message, Outcome.REJECTED))
                raise
            self.metrics.admission_wait.observe(time.monotonic() - t_wait)
            if admitted.reserved and not (body.get("max_tokens") or body.get("max_completion_tokens")):
                # the reservation assumed this many: the engine must not produce more
                rewrite.upstream_body["max_tokens"] = admitted.completion_tokens
            capture.mark_admitted()
            ctx.deployment = dep_name
            headers["X-Deployment"] = dep_name
            try:
                result = await self._try(dep_name, operation, body, rewrite, capture, admitted, tool_req)
            except _Retryable as retry:
                self.admission.release(admitted, ctx.alias, None)
                last_error, last_outcome = retry.error, retry.outcome
                log.warning("deployment %s failed before the first token (%s); trying the next",
                            dep_name, retry.error.message)
                continue
            except BaseException:
                self.admission.release(admitted, ctx.alias, None)
                raise
            return result, headers
        if ctx.batch_id is not None and last_error.code == "capacity_exceeded":
            raise last_error  # not an answer: the batch scheduler runs the line again later
        if last_outcome is Outcome.REJECTED:
            self.metrics.outcomes.labels("", last_outcome.value).inc()
        await self.durable(capture.record(last_error.status, last_error.message, last_outcome))
        self.metrics.rejected(ctx.alias, ctx.team, last_error.status)
        raise last_error

    async def _try(self, dep_name: str, operation: str, body: dict, rewrite: Rewrite,
                   capture: Capture, admitted: Admitted, tool_req):
        # the lease and budget reservation stay renewed until the response is in hand (a unary
        # one arrives whole, possibly after the TTL); a stream's relay renews its own
        renewer = asyncio.create_task(self._renew(admitted))
        try:
            return await self._send(dep_name, operation, body, rewrite, capture, admitted, tool_req)
        finally:
            renewer.cancel()

    async def _send(self, dep_name: str, operation: str, body: dict, rewrite: Rewrite,
                    capture: Capture, admitted: Admitted, tool_req):
        dep = self.config.deployment(dep_name)
        stream = bool(body.get("stream"))
        payload = msgspec.json.encode(rewrite.upstream_body)
        t0 = capture.sent_mono = time.monotonic()
        try:
            upstream = await asyncio.wait_for(
                self.pool.post(dep.url, ENDPOINTS[operation], payload, upstream_headers(capture.ctx)),
                # A stream's headers come with its first token; a unary response's come only with
                # the whole body, so a first-token timeout there would fail over a long request
                # that is running fine and run it twice. Unary requests fail over on connect
                # errors and 5xx, and are bounded by upstream_timeout_s.
                timeout=self.config.first_token_timeout_s if stream else None)
        except (UpstreamError, asyncio.TimeoutError) as exc:
            timed_out = isinstance(exc, (asyncio.TimeoutError, UpstreamTimeout))
            outcome = Outcome.TIMEOUT if timed_out else Outcome.UNREACHABLE
            self.settle(dep_name, outcome)
            what = "sent no first token in time" if timed_out else "is unreachable"
            raise _Retryable(APIError(503, f"deployment {dep_name!r} {what}: {type(exc).__name__}: {exc}",
                                      type="server_error"), outcome) from None
        if upstream.status != 200:
            try:
                text = (await upstream.read()).decode(errors="replace")
            except UpstreamError as exc:
                text = f"(the error body broke off: {exc})"
            upstream.close()
            err = upstream_error(upstream.status, text)
            if upstream.status >= 500:
                self.settle(dep_name, Outcome.UPSTREAM_ERROR)
                raise _Retryable(err, Outcome.UPSTREAM_ERROR)
            self.settle(dep_name, Outcome.REFUSED)  # the deployment is fine; the request was not
            await self.durable(capture.record(err.status, err.message, Outcome.REFUSED))
            raise err
        self.metrics.upstream_latency.labels(dep_name).observe(time.monotonic() - t0)
        if not stream:
            return await self._unary(dep_name, upstream, rewrite, capture, admitted, tool_req)
        tools = StreamTransformer(tool_req) if tool_req is not None else None
        return Stream({"X-Trace-ID": capture.ctx.trace_id, "X-Deployment": dep_name},
                      self._relay(dep_name, upstream, capture, rewrite, admitted, tools))

    async def _unary(self, dep_name, upstream, rewrite, capture, admitted, tool_req) -> dict:
        ctx = capture.ctx
        try:
            data = _decode(await upstream.read())
        except (UpstreamError, json.JSONDecodeError) as exc:
            outcome = Outcome.MALFORMED if isinstance(exc, json.JSONDecodeError) else Outcome.UPSTREAM_ERROR
            self.settle(dep_name, outcome)
            raise _Retryable(APIError(502, f"deployment {dep_name!r} sent a broken response: {exc}",
                                      type="server_error"), outcome) from None
        finally:
            upstream.close()
        capture.on_response(data)
        self._first_token_metrics(dep_name, capture)
        try:
            if tool_req is not None and data.get("choices"):
                msg = transform_message(tool_req, data["choices"][0])["message"]
                capture.set_output(msg.get("content"), msg.get("tool_calls") or [])
        except APIError as err:
            self.settle(dep_name, Outcome.INVALID_TOOL_CALL)
            await self.durable(capture.record(err.status, err.message, Outcome.INVALID_TOOL_CALL))
            raise
        self.admission.release(admitted, ctx.alias, data.get("usage"))  # the engine did the work
        try:
            await self.acknowledge(capture.record(200, outcome=Outcome.OK))
        except APIError:
            self.settle(dep_name, Outcome.NOT_DURABLE)
            raise
        self.settle(dep_name, Outcome.OK)
        self.metrics.served(ctx.alias, ctx.team, data.get("usage"))
        return rewrite.client_view(data, ctx.alias)

    async def _relay(self, dep_name: str, upstream: UpstreamResponse, capture: Capture, rewrite: Rewrite,
                     admitted: Admitted, tools: StreamTransformer | None):
        ctx = capture.ctx
        error: str | None = "client disconnected before the stream ended"
        outcome, event, recorded = Outcome.CLIENT_GONE, None, False
        renewer = asyncio.create_task(self._renew(admitted))
        try:
            async for line in upstream.lines():
                if line.startswith(b"event:"):
                    event = line[6:].strip().decode(errors="replace")
                    continue
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    if tools is not None:
                        capture.set_output(*tools.output())
                    recorded = True
                    try:  # the client's [DONE] means "stored"
                        await self.acknowledge(capture.record(200, outcome=Outcome.OK))
                    except APIError as err:
                        error, outcome = err.message, Outcome.NOT_DURABLE
                        yield _event(err.body())
                        break
                    error, outcome = None, Outcome.OK
                    yield b"data: [DONE]\n\n"
                    break
                try:
                    obj = _decode(data)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # the deployment's fault
                    error = f"deployment {dep_name!r} sent a malformed stream event ({exc}): {data[:200]!r}"
                    outcome = Outcome.MALFORMED
                    yield error_event(error)
                    break
                if not isinstance(obj, dict):
                    error = f"deployment {dep_name!r} sent a stream event that is not an object: {data[:200]!r}"
                    outcome = Outcome.MALFORMED
                    yield error_event(error)
                    break
                if event == "error" or "error" in obj:
                    error, outcome = json.dumps(obj.get("error", obj)), Outcome.UPSTREAM_ERROR
                    yield _event({"error": obj.get("error", obj)})
                    break
                capture.on_chunk(obj)
                if tools is not None:
                    try:
                        obj = tools.chunk(obj)
                    except APIError as err:
                        error, outcome = err.message, Outcome.INVALID_TOOL_CALL
                        yield _event(err.body())
                        break
                view = rewrite.client_view(obj, ctx.alias)
                if view is not None:
                    yield _event(view)
            else:
                error, outcome = "the deployment ended the stream without [DONE]", Outcome.UPSTREAM_ERROR
                yield error_event(error)
        except UpstreamError as exc:
            error = f"deployment {dep_name!r} failed mid-stream: {type(exc).__name__}: {exc}"
            outcome = Outcome.TIMEOUT if isinstance(exc, UpstreamTimeout) else Outcome.UPSTREAM_ERROR
            yield error_event(error)
        finally:
            renewer.cancel()
            upstream.close()
            self.settle(dep_name, outcome)
            if not recorded:
                self.writer.submit(capture.record(200, error, outcome))
            self.admission.release(admitted, ctx.alias, capture.usage or None,
                                   produced=len(capture.completion_ids))
            self._first_token_metrics(dep_name, capture)
            if error is None:
                self.metrics.served(ctx.alias, ctx.team, capture.usage)
            else:
                self.metrics.stream_errors.labels(ctx.alias).inc()

    def settle(self, dep_name: str, outcome: Outcome) -> None:
        """An attempt at ``dep_name`` ended: its breaker and the metrics hear the same outcome."""
        self.breakers.record(dep_name, outcome.deployment_ok)
        self.metrics.outcomes.labels(dep_name, outcome.value).inc()

    def _first_token_metrics(self, dep_name: str, capture: Capture) -> None:
        if (times := capture.first_token_times()) is not None:
            self.metrics.first_token(dep_name, *times)

    async def _renew(self, admitted: Admitted) -> None:
        interval = self.config.admission.lease_ttl_s / 3
        while True:
            await asyncio.sleep(interval)
            self.admission.renew(admitted)


def trace_store_unavailable(exc: BaseException) -> APIError:
    return APIError(503, f"the trace store could not make this response durable ({exc}); it was not "
                         "delivered: retry once the gateway's trace disk is writable again",
                    type="server_error", code="trace_store_unavailable")


def error_event(message: str) -> bytes:
    return _event(APIError(502, message, type="server_error").body())
