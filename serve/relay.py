"""Relaying: the deployment's answer back to the client, through a chain of transforms.

Each stream chunk (and a unary answer once) passes, in order: capture (the trace reads the
engine-exact fields), tools (GLM markup parsed into OpenAI tool calls, checked against their
schemas), the client's view (its model name, only the fields it asked for). Whatever ends the
relay, it ends in exactly one :class:`Outcome`, which :class:`serve.settle.Settler` settles.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from serve import json_codec
from serve.attempt import Attempt, AttemptFailed
from serve.errors import APIError
from serve.outcome import Outcome
from serve.settle import Settler
from serve.tools.response import StreamTransformer, transform_message
from serve.upstream_pool import UpstreamError, UpstreamResponse, UpstreamTimeout

Step = Callable[[dict], "dict | None"]  # a chunk in, the chunk out (None: send nothing)


def event(obj) -> bytes:
    return b"data: " + json_codec.encode(obj) + b"\n\n"


def error_event(message: str) -> bytes:
    return event(APIError(502, message, type="server_error").body())


def stream_steps(attempt: Attempt, tools: StreamTransformer | None) -> list[Step]:
    capture, rewrite, alias = attempt.capture, attempt.rewrite, attempt.ctx.alias

    def captured(obj: dict) -> dict:
        capture.on_chunk(obj)
        return obj

    steps: list[Step] = [captured]
    if tools is not None:
        steps.append(tools.chunk)
    steps.append(lambda obj: rewrite.client_view(obj, alias))
    return steps


async def read_unary(attempt: Attempt, upstream: UpstreamResponse) -> dict:
    """The whole answer, captured and with its tool calls parsed (an invalid call raises
    :class:`AttemptFailed`); the client's view is taken after the trace is stored."""
    dep = attempt.deployment.name
    try:
        data = json_codec.decode(await upstream.read())
    except (UpstreamError, json.JSONDecodeError, UnicodeDecodeError) as exc:  # as a stream event is judged
        outcome = Outcome.UPSTREAM_ERROR if isinstance(exc, UpstreamError) else Outcome.MALFORMED
        raise AttemptFailed(
            APIError(502, f"deployment {dep!r} sent a broken response: {exc}", type="server_error"), outcome
        ) from None
    finally:
        upstream.close()
    if not isinstance(data, dict):
        raise AttemptFailed(
            APIError(502, f"deployment {dep!r} sent a response that is not an object", type="server_error"), Outcome.MALFORMED
        )
    attempt.capture.on_response(data)
    if attempt.tools is not None and data.get("choices"):
        try:
            msg = transform_message(attempt.tools, data["choices"][0])["message"]
        except APIError as err:
            raise AttemptFailed(err, Outcome.INVALID_TOOL_CALL, retryable=False) from None
        attempt.capture.set_output(msg.get("content"), msg.get("tool_calls") or [])
    return data


async def relay(attempt: Attempt, upstream: UpstreamResponse, settler: Settler) -> AsyncIterator[bytes]:
    """The SSE bytes for the client. ``[DONE]`` is sent only once the trace is stored; a
    deployment's failure after the first byte is an error event, never a silent cut. However it
    ends, the settler hears how, once."""
    dep, capture = attempt.deployment.name, attempt.capture
    settler.keep_alive(attempt)  # here, not before: a relay never started must not renew forever
    tools = StreamTransformer(attempt.tools) if attempt.tools is not None else None
    steps = stream_steps(attempt, tools)
    error: str | None = "client disconnected before the stream ended"
    outcome, sse_event, recorded = Outcome.CLIENT_GONE, None, False
    try:
        async for lines in upstream.line_groups():
            # the events of what one read brought go out in one write: a deployment that is
            # ahead of its client sends several chunks at once, and a write each was most of
            # the gateway's CPU per token (py-spy, deploy/bench/gateway.py --canned)
            out: list[bytes] = []
            ended = False
            for line in lines:
                if line.startswith(b"event:"):
                    sse_event = line[6:].strip().decode(errors="replace")
                    continue
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    if out:  # what came before is not held back while the trace is stored
                        yield b"".join(out)
                        out = []
                    if tools is not None:
                        capture.set_output(*tools.output())
                    recorded = ended = True
                    try:  # the client's [DONE] means "stored"
                        await settler.acknowledge(capture.record(200, outcome=Outcome.OK))
                    except APIError as err:
                        error, outcome = err.message, Outcome.NOT_DURABLE
                        yield event(err.body())
                        break
                    error, outcome = None, Outcome.OK
                    yield b"data: [DONE]\n\n"
                    break
                try:
                    obj = json_codec.decode(data)
                    problem = None if isinstance(obj, dict) else "not a JSON object"
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # the deployment's fault
                    problem = str(exc)
                if problem is not None:
                    error = f"deployment {dep!r} sent a malformed stream event ({problem}): {data[:200]!r}"
                    outcome, ended = Outcome.MALFORMED, True
                    out.append(error_event(error))
                    break
                if sse_event == "error" or "error" in obj:
                    error, outcome, ended = json.dumps(obj.get("error", obj)), Outcome.UPSTREAM_ERROR, True
                    out.append(event({"error": obj.get("error", obj)}))
                    break
                try:
                    for step in steps:
                        if (obj := step(obj)) is None:
                            break
                except APIError as err:  # a tool call that breaks its schema
                    error, outcome, ended = err.message, Outcome.INVALID_TOOL_CALL, True
                    out.append(event(err.body()))
                    break
                if obj is not None:
                    out.append(event(obj))
            if out:
                yield b"".join(out)
            if ended:
                break
        else:
            error, outcome = "the deployment ended the stream without [DONE]", Outcome.UPSTREAM_ERROR
            yield error_event(error)
    except UpstreamError as exc:
        error = f"deployment {dep!r} failed mid-stream: {type(exc).__name__}: {exc}"
        outcome = Outcome.TIMEOUT if isinstance(exc, UpstreamTimeout) else Outcome.UPSTREAM_ERROR
        yield error_event(error)
    finally:
        upstream.close()
        settler.stream_ended(attempt, outcome, error, recorded)
