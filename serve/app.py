"""The gateway: OpenAI-compatible routes in front of Dynamo deployments, capturing every turn.

A request is validated, its model alias resolved to a deployment and upstream model, forwarded
(streamed or not), and handed to the trace writer as one record when it ends. The record is
queued, never written on the response path.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from serve import engine_admin, feedback_api, trace_query
from serve.auth import Caller, authenticate
from serve.capture import Capture, RequestContext, new_trace_id
from serve.config import GatewayConfig, ModelRoute
from serve.errors import APIError, install_error_handlers, model_not_found
from serve.keys import KeyStore
from serve.protocol import (ChatCompletionRequest, CompletionRequest, GenerateRequest,
                            generate_response)
from serve.tools.definitions import Bounds, parse_tools
from serve.tools.grammar import grammar_for
from serve.tools.response import StreamTransformer, transform_message
from serve.upstream import Rewrite, upstream_error
from traces.writer import TraceWriter

log = logging.getLogger(__name__)

# operation -> the deployment endpoint that serves it (token-in/token-out runs as a completion
# whose prompt is token ids)
ENDPOINTS = {"chat": "/v1/chat/completions", "text_completion": "/v1/completions",
             "generate": "/v1/completions"}
REQUEST_MODELS = {"chat": ChatCompletionRequest, "text_completion": CompletionRequest}


def create_app(config: GatewayConfig, writer: TraceWriter | None = None) -> FastAPI:
    writer = writer or TraceWriter(config.traces_dir, config.instance_name,
                                   config.trace_flush_batch, config.trace_flush_age_s)

    async def durable(record: dict) -> None:
        """Wait until the trace is fsync'd: a response is finished only after its record is.
        A failing disk is logged, not turned into a failed request."""
        try:
            await writer.write_async(record)
        except Exception:
            log.exception("trace %s could not be made durable", record.get("trace_id"))
    routes: dict[str, ModelRoute] = dict(config.models)
    keys = KeyStore(config.keys_file) if config.keys_file else None
    bounds = Bounds(config.tools.max_string_length, config.tools.max_array_items)

    def caller_of(request: Request) -> Caller:
        return authenticate(request, config, keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        app.state.http = httpx.AsyncClient(timeout=httpx.Timeout(config.upstream_timeout_s, connect=5),
                                           limits=limits)
        yield
        await app.state.http.aclose()
        writer.close()

    app = FastAPI(title="Flywheel gateway", lifespan=lifespan)
    app.state.writer, app.state.routes = writer, routes
    install_error_handlers(app)
    app.include_router(trace_query.router(config.traces_dir, caller_of, config.query_timeout_s))
    app.include_router(feedback_api.router(config.traces_dir, caller_of))
    app.include_router(engine_admin.router(config, routes, lambda r: _require_admin(r, config)))

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": sorted(routes)}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [
            {"id": alias, "object": "model", "owned_by": "flywheel",
             "checkpoint_version": r.checkpoint_version} for alias, r in sorted(routes.items())]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(request, "text_completion")

    @app.get("/admin/models")
    async def admin_models(request: Request):
        _require_admin(request, config)
        return {alias: r.model_dump() for alias, r in routes.items()}

    @app.put("/admin/models/{alias}")
    async def admin_set_model(alias: str, request: Request):
        """Point an alias at a deployment's model (a base model or a loaded LoRA)."""
        _require_admin(request, config)
        route = ModelRoute.model_validate(await _json_body(request))
        try:
            config.deployment(route.deployment)
        except KeyError:
            raise APIError(400, f"unknown deployment {route.deployment!r}", param="deployment")
        routes[alias] = route
        return {alias: route.model_dump()}

    @app.post("/inference/v1/generate")
    async def generate(request: Request):
        """Token-in/token-out, as prime-rl and verifiers' training client call it."""
        caller = caller_of(request)
        try:
            req = GenerateRequest.model_validate(await _json_body(request))
        except ValidationError as exc:
            raise _invalid(exc) from None
        data, headers = await _forward(request, "generate", req.completion_body(), caller)
        return JSONResponse(generate_response(data), headers=headers)

    async def _serve(request: Request, operation: str):
        caller = caller_of(request)
        body = await _json_body(request)
        try:
            REQUEST_MODELS[operation].model_validate(body)
        except ValidationError as exc:
            raise _invalid(exc) from None
        result, headers = await _forward(request, operation, body, caller)
        if isinstance(result, StreamingResponse):
            return result
        return JSONResponse(result, headers=headers)

    async def _forward(request: Request, operation: str, body: dict, caller: Caller):
        """Send one validated request to its deployment, capturing it; returns the client's
        view of the response (a dict, or a StreamingResponse) and the headers to send."""
        route = routes.get(body["model"])
        if route is None:
            raise model_not_found(body["model"])
        deployment = config.deployment(route.deployment)
        tool_req = parse_tools(body, bounds) if operation == "chat" else None
        if tool_req is not None and body.get("guided_grammar"):
            raise APIError(400, "guided_grammar cannot be combined with tools", param="guided_grammar")
        ctx = _context(request, operation, body, route, caller)
        capture = Capture(ctx)
        rewrite = Rewrite(body, operation, route.upstream_model,
                          grammar_for(tool_req, config.tools.layout) if tool_req else None)
        url = deployment.url + ENDPOINTS[operation]
        capture.mark_admitted()
        headers = {"X-Trace-ID": ctx.trace_id}
        http: httpx.AsyncClient = request.app.state.http
        try:
            upstream = await http.send(http.build_request("POST", url, json=rewrite.upstream_body),
                                       stream=bool(body.get("stream")))
        except httpx.HTTPError as exc:
            err = APIError(503, f"deployment {deployment.name!r} is unreachable: {type(exc).__name__}",
                           type="server_error")
            await durable(capture.record(err.status, err.message))
            raise err from None
        if upstream.status_code != 200:
            text = (await upstream.aread()).decode(errors="replace")
            await upstream.aclose()
            err = upstream_error(upstream.status_code, text)
            await durable(capture.record(err.status, err.message))
            raise err
        if not body.get("stream"):
            data = json.loads(await upstream.aread())
            await upstream.aclose()
            capture.on_response(data)
            if tool_req is not None and data.get("choices"):
                try:
                    choice = transform_message(tool_req, data["choices"][0])
                except APIError as err:
                    await durable(capture.record(err.status, err.message))
                    raise
                msg = choice["message"]
                capture.set_output(msg.get("content"), msg.get("tool_calls") or [])
            await durable(capture.record(200))
            return rewrite.client_view(data, ctx.alias), headers
        tools = StreamTransformer(tool_req) if tool_req is not None else None
        return StreamingResponse(_relay(upstream, capture, rewrite, ctx.alias, tools),
                                 media_type="text/event-stream", headers=headers), headers

    async def _relay(upstream: httpx.Response, capture: Capture, rewrite: Rewrite, alias: str,
                     tools: StreamTransformer | None):
        error: str | None = "client disconnected before the stream ended"
        event, recorded = None, False
        try:
            async for line in upstream.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    if tools is not None:
                        capture.set_output(*tools.output())
                    error, recorded = None, True
                    await durable(capture.record(200))  # the client's [DONE] means "stored"
                    yield "data: [DONE]\n\n"
                    break
                obj = json.loads(data)
                if event == "error" or "error" in obj:
                    error = json.dumps(obj.get("error", obj))
                    yield f"data: {json.dumps({'error': obj.get('error', obj)})}\n\n"
                    break
                capture.on_chunk(obj)
                if tools is not None:
                    try:
                        obj = tools.chunk(obj)
                    except APIError as err:
                        error = err.message
                        yield f"data: {json.dumps(err.body())}\n\n"
                        break
                view = rewrite.client_view(obj, alias)
                if view is not None:
                    yield f"data: {json.dumps(view)}\n\n"
            else:
                error = "the deployment ended the stream without [DONE]"
                yield _error_event(error)
        except httpx.HTTPError as exc:
            error = f"deployment stream failed: {type(exc).__name__}: {exc}"
            yield _error_event(error)
        finally:
            await upstream.aclose()
            if not recorded:
                writer.submit(capture.record(200, error))

    return app


def _error_event(message: str) -> str:
    return "data: " + json.dumps(APIError(502, message, type="server_error").body()) + "\n\n"


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.")
    return body


def _invalid(exc: ValidationError) -> APIError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    if first.get("type") == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param)
    return APIError(400, f"Invalid value for '{param}': {first.get('msg')}", param=param)


def _context(request: Request, operation: str, body: dict, route: ModelRoute,
             caller: Caller) -> RequestContext:
    h = request.headers
    return RequestContext(
        trace_id=new_trace_id(), operation=operation, body=body, alias=body["model"],
        upstream_model=route.upstream_model, checkpoint_version=route.checkpoint_version,
        deployment=route.deployment, team=caller.team, api_key_id=caller.key_id,
        session_id=h.get("x-session-id"), parent_trace_id=h.get("x-parent-trace-id"),
        env_id=h.get("x-env-id"), example_id=h.get("x-example-id"),
        # an environment's session is its rollout (verifiers sends one X-Session-ID per rollout)
        rollout_id=h.get("x-rollout-id") or (h.get("x-session-id") if h.get("x-env-id") else None))


def _require_admin(request: Request, config: GatewayConfig) -> None:
    if not config.admin_key:
        raise APIError(403, "admin routes are disabled: set gateway.admin_key", type="permission_error")
    if request.headers.get("authorization") != f"Bearer {config.admin_key}":
        raise APIError(401, "a valid admin key is required", code="invalid_api_key")
