"""Sending: the rewritten request to the chosen deployment, up to its response's headers.

A stream's headers come with its first token, so for a stream this waits at most
``first_token_timeout_s`` after sending (a connection takes at most the pool's connect
timeout); a unary response's come only with the whole body, and a first-token timeout there
would fail over a long request that is running fine and run it twice: unary requests fail over
on connect errors and 5xx, and are bounded by ``upstream_timeout_s``.
"""

from __future__ import annotations

import time

from serve import json_codec
from serve.attempt import Attempt, AttemptFailed
from serve.capture import RequestContext
from serve.errors import APIError
from serve.outcome import Outcome
from serve.upstream import upstream_error
from serve.upstream_pool import UpstreamError, UpstreamPool, UpstreamResponse, UpstreamTimeout

RETRY_AFTER_S = 5  # a worker that left discovery is back within seconds (sim) to a minute (vLLM on CPU)
# operation -> the deployment endpoint that serves it (token-in/token-out runs as a completion
# whose prompt is token ids)
ENDPOINTS = {"chat": "/v1/chat/completions", "text_completion": "/v1/completions", "generate": "/v1/completions"}


def upstream_headers(ctx: RequestContext) -> dict[str, str]:
    """The session travels on as Dynamo's session id: with session affinity on, the deployment's
    router keeps the session on the worker that holds its KV cache."""
    return {"x-dynamo-session-id": ctx.scoped_session} if ctx.session_id else {}


async def send(pool: UpstreamPool, attempt: Attempt, first_token_timeout_s: float) -> UpstreamResponse:
    """The deployment's 200 response, its body still to come. Anything else is an
    :class:`AttemptFailed`: unreachable, timeout and 5xx retryable, a 4xx the request's own.

    A session's turn that gets a 5xx is sent once more without its session id. Dynamo keeps a
    session on its worker even after that worker died, for as long as the worker is still
    registered (until its etcd lease of 30 s lapses: 22-27 s measured across hosts), and
    answers every such turn 500 at once ("Pinned worker ... is not eligible", "no endpoints
    available"); unpinned, its router places the turn on a live worker. Nothing ran: a 5xx comes
    before any token."""
    headers = upstream_headers(attempt.capture.ctx)
    try:
        return await _send(pool, attempt, first_token_timeout_s, headers)
    except AttemptFailed as failed:
        if not headers or failed.outcome is not Outcome.UPSTREAM_ERROR:
            raise
    return await _send(pool, attempt, first_token_timeout_s, {})


async def _send(pool: UpstreamPool, attempt: Attempt, first_token_timeout_s: float, headers: dict[str, str]) -> UpstreamResponse:
    dep, capture = attempt.deployment, attempt.capture
    payload = json_codec.encode(attempt.rewrite.upstream_body)
    capture.sent_mono = time.monotonic()
    try:
        upstream = await pool.post(
            dep.url,
            ENDPOINTS[attempt.operation],
            payload,
            headers,
            headers_timeout=first_token_timeout_s if attempt.stream else None,
        )
    except UpstreamError as exc:
        timed_out = isinstance(exc, UpstreamTimeout)
        what = "sent no first token in time" if timed_out else "is unreachable"
        raise AttemptFailed(
            APIError(503, f"deployment {dep.name!r} {what}: {type(exc).__name__}: {exc}", type="server_error"),
            Outcome.TIMEOUT if timed_out else Outcome.UNREACHABLE,
        ) from None
    if upstream.status == 200:
        return upstream
    try:
        text = (await upstream.read()).decode(errors="replace")
    except UpstreamError as exc:
        text = f"(the error body broke off: {exc})"
    finally:
        upstream.close()
    err = upstream_error(upstream.status, text)
    if upstream.status in (404, 503):
        # the gateway asked for the model by the name the deployment serves it under, so "not
        # found" is the deployment's state, not the request's: no worker of it lists the model
        # right now (its only worker left discovery and is being restarted; an adapter not yet
        # loaded again). A 503 the client may retry, or the next deployment, not a 404 that says
        # the model does not exist. Dynamo says 503 "not ready to serve requests yet" itself while
        # a P/D graph's prefill worker restarts: the same, not a 502 "bad gateway".
        model = attempt.rewrite.upstream_body.get("model")
        message = f"deployment {dep.name!r} has no worker serving `{model}` right now ({err.message}); retry shortly"
        unavailable = APIError(503, message, type="server_error", code="model_unavailable")
        unavailable.headers = {"Retry-After": str(RETRY_AFTER_S)}
        raise AttemptFailed(unavailable, Outcome.UPSTREAM_ERROR)
    if upstream.status >= 500:
        raise AttemptFailed(err, Outcome.UPSTREAM_ERROR)
    raise AttemptFailed(err, Outcome.REFUSED, retryable=False)  # the deployment is fine; the request was not
