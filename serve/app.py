"""The gateway's routes: OpenAI-compatible API, usage, metrics and admin, wired to their parts.

Requests are validated here and handed to :class:`serve.forward.Forwarder` (admission,
deployment choice, failover, capture); see that module for a request's whole way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from pydantic import TypeAdapter, ValidationError

from serve import engine_admin, feedback_api, json_codec, trace_query, ui, weights
from serve.admission import Admission
from serve.affinity import Affinity
from serve.auth import Caller, authenticate, authenticate_headers, bearer, is_admin_key, require_admin
from serve.batch import api as batch_api
from serve.batch.runner import BatchRunner
from serve.body_limit import BodyLimit
from serve.breaker import STATE_CODES, Breakers
from serve.capture import RequestContext, new_trace_id
from serve.config import GatewayConfig, ModelRoute, Price
from serve.cross_site import CrossSite
from serve.errors import APIError, install_error_handlers, invalid_request, model_not_found
from serve.forward import Forwarder, Stream
from serve.hot_path import Gateway, HotPath
from serve.keys import KeyStore
from serve.metrics import Metrics
from serve.routes import RouteTable
from serve.openapi import install as install_openapi
from serve.openapi import json_body
from serve.query_pool import QueryPool
from serve.protocol import (ChatCompletionRequest, CompletionRequest, GenerateRequest, Message,
                            generate_response)
from serve.shared_state import SharedState
from serve.upstream import PROMPT_KEYS
from serve.upstream_http import upstream_client
from traces.batch_store import BatchStore, FileStore
from traces.writer import TraceWriter

log = logging.getLogger(__name__)
REQUEST_MODELS = {"chat": ChatCompletionRequest, "text_completion": CompletionRequest}
# Reading and validating a body costs ~35 ms per MB here (msgspec, then pydantic): a larger one is
# read in a thread, so one client's 32 MB body cannot hold every other stream's tokens back.
OFF_LOOP_BYTES = 256 << 10
MESSAGES_PER_SLICE = 256
MESSAGE_LIST = TypeAdapter(list[Message])


def _per_token(usd_per_mtok: float) -> str:
    """OpenRouter's price format: USD per token, as a decimal string."""
    return f"{usd_per_mtok / 1e6:.12f}".rstrip("0").rstrip(".") or "0"


def create_app(config: GatewayConfig, writer: TraceWriter | None = None) -> FastAPI:
    writer = writer or TraceWriter(config.traces_dir, config.instance_name,
                                   config.trace_flush_batch, config.trace_flush_age_s)
    keys = KeyStore(config.keys_file) if config.keys_file else None
    state = SharedState(config.redis_url, replica=config.instance_name)
    routes = RouteTable(config.models, state, config.routes_file)
    admission = Admission(config, state)
    breakers = Breakers(state, config.breaker)
    metrics = Metrics()
    forwarder = Forwarder(config, routes, writer, admission, breakers, Affinity(state), metrics)
    files, batches = FileStore(config.traces_dir, config.batch.file_ttl_s), BatchStore(config.traces_dir)
    batch_runner = BatchRunner(config, batches, files, forwarder, keys)
    queries = QueryPool(config.query, config.query_timeout_s, trace_query.spill_root(config))

    def caller_of(request: Request) -> Caller:
        return authenticate(request, config, keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        app.state.http = upstream_client(httpx.Timeout(config.upstream_timeout_s, connect=5), limits)
        follower = (asyncio.create_task(_follow_routes(routes, state, admission, config.routes_poll_s))
                    if config.redis_url else None)
        scheduler = asyncio.create_task(batch_runner.run())
        yield
        scheduler.cancel()
        await batch_runner.stop()  # before the writer closes: their traces are what recovers them
        if follower is not None:
            follower.cancel()
        await app.state.http.aclose()
        await forwarder.pool.aclose()
        writer.close()
        queries.close()

    async def serve(operation: str, headers: dict[str, str], raw: bytes):
        """A completion request, from its raw body to the client's answer (the hot path)."""
        caller = authenticate_headers(headers, config, keys)
        if len(raw) > OFF_LOOP_BYTES:
            body, prompt_json = await forwarder.turns.run(caller.team, _validated, raw, operation, True)
        else:
            body, prompt_json = _validated(raw, operation)
        ctx = _context(routes, headers, operation, body, caller)
        ctx.prompt_json = prompt_json
        return await forwarder.forward(operation, body, ctx)

    app = Gateway(title="Flywheel gateway", lifespan=lifespan)
    app.hot_path = HotPath(serve, config.max_body_bytes)
    app.cross_site = CrossSite(config)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.state.writer, app.state.routes, app.state.admission = writer, routes, admission
    app.state.batch_runner = batch_runner
    install_error_handlers(app)
    install_openapi(app)
    app.include_router(trace_query.router(config, queries, caller_of))
    app.include_router(feedback_api.router(config.traces_dir, caller_of))
    app.include_router(batch_api.router(config, files, batches, batch_runner, caller_of))
    app.include_router(engine_admin.router(config, routes, lambda r: require_admin(r, config)))
    app.include_router(weights.router(config, routes, lambda r: require_admin(r, config)))
    if config.ui.enabled:
        ui.install(app, config, keys, queries)

    def sees_internals(request: Request) -> bool:
        """Whether the caller may see the gateway's insides (every team's names and figures,
        deployments, breakers): anyone without keys (the local profile), else the admin key."""
        return not config.require_api_key or is_admin_key(bearer(request), config)

    @app.get("/health")
    async def health(request: Request):
        """Liveness for anyone (a load balancer's probe); the details for the admin key."""
        if not sees_internals(request):
            return {"status": "ok"}
        return {"status": "ok", "models": sorted(routes), "shared_state": state.shared,
                "breakers": {d.name: breakers.state_of(d.name) for d in config.deployments}}

    @app.get("/metrics")
    async def prometheus(request: Request):
        if not sees_internals(request):  # every team's name and token totals
            raise APIError(401, "/metrics needs the admin key when gateway.require_api_key is on",
                           code="invalid_api_key")
        for d in config.deployments:
            metrics.leases.labels(d.name).set(admission.leases_held(d.name)[0])
            metrics.breaker.labels(d.name).set(STATE_CODES[breakers.state_of(d.name)])
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/usage")
    async def usage(request: Request, team: str | None = None):
        """A team's spend; the admin key sees every team with a budget (or ``?team=``)."""
        caller = caller_of(request)
        if caller.admin:
            teams = [team] if team else sorted(config.budgets)
            return {"object": "list", "data": [admission.usage(t) for t in teams]}
        return admission.usage(caller.team)

    @app.get("/v1/models")
    async def list_models(request: Request):
        caller = caller_of(request)
        return {"object": "list", "data": [_model_card(alias, r, caller) for alias, r in sorted(routes.items())
                                           if r.serves(caller.team, caller.admin)]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str, request: Request):
        caller = caller_of(request)
        route = routes.get(model_id)
        if route is None or not route.serves(caller.team, caller.admin):
            raise model_not_found(model_id)
        return _model_card(model_id, route, caller)

    def _model_card(alias: str, r: ModelRoute, caller: Caller) -> dict:
        """vLLM's card (``root``, ``parent`` for an adapter, ``max_model_len``: prime-rl sizes its
        concurrency from it), the checkpoint the alias serves, and what catalogs read: OpenRouter's
        ``context_length`` and per-token ``pricing``, Prime's ``*_usd_per_mtok`` and ``specs``."""
        dep = next((d for d in config.deployments if d.name == r.deployment), None)
        base = next((b.upstream_model for b in routes.values()
                     if b.deployment == r.deployment and b.lora_path is None), None)
        context = dep.max_model_len if dep else None
        price = config.prices.get(alias) or Price()
        # where the weights live on the serving hosts is the operator's business, not a team's
        operator = caller.admin or not config.require_api_key
        path = (r.lora_path or r.weight_dir or (dep.model_path if dep else None)) if operator else None
        return {"id": alias, "object": "model", "created": r.created, "owned_by": "flywheel",
                "root": path or r.upstream_model,
                "parent": None if r.lora_path is None else base,
                "max_model_len": context, "context_length": context,
                "checkpoint_version": r.checkpoint_version,
                "pricing": {"input_usd_per_mtok": price.input_per_mtok, "output_usd_per_mtok": price.output_per_mtok,
                            "cache_read_usd_per_mtok": price.cached,
                            "prompt": _per_token(price.input_per_mtok), "completion": _per_token(price.output_per_mtok),
                            "input_cache_read": _per_token(price.cached)},
                "specs": {"context_window": context, "max_output_tokens": context}}

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(request: Request):
        return await _serve(request, "chat")

    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(request: Request):
        return await _serve(request, "text_completion")

    @app.post("/inference/v1/generate", openapi_extra=json_body(GenerateRequest))
    async def generate(request: Request):
        """Token-in/token-out, as prime-rl and verifiers' training client call it."""
        caller = caller_of(request)
        try:
            req = GenerateRequest.model_validate(await _json_body(request))
        except ValidationError as exc:
            raise invalid_request(exc.errors()) from None
        body = req.completion_body()
        data, headers = await forwarder.forward("generate", body, _context(routes, request.headers, "generate", body, caller))
        return JSONResponse(generate_response(data), headers=headers)

    @app.get("/admin/models")
    async def admin_models(request: Request):
        require_admin(request, config)
        return {alias: r.model_dump() for alias, r in routes.items()}

    @app.get("/admin/deployments")
    async def admin_deployments(request: Request):
        """Each deployment, its requests in flight (a drain waits for 0) and the aliases it serves."""
        require_admin(request, config)
        return {"object": "list", "data": [
            {"name": d.name, "url": d.url, "model_path": d.model_path,
             "in_flight": admission.leases_held(d.name)[0], "breaker": breakers.state_of(d.name),
             "aliases": sorted(a for a, r in routes.items() if r.deployment == d.name)}
            for d in config.deployments]}

    @app.put("/admin/models/{alias}", openapi_extra=json_body(ModelRoute))
    async def admin_set_model(alias: str, request: Request):
        """Point an alias at a deployment's model (a base model or a loaded LoRA)."""
        require_admin(request, config)
        try:
            route = ModelRoute.model_validate(await _json_body(request))
        except ValidationError as exc:
            raise invalid_request(exc.errors()) from None
        for name in [route.deployment, *route.fallbacks]:
            try:
                config.deployment(name)
            except KeyError:
                raise APIError(400, f"unknown deployment {name!r}", param="deployment") from None
        routes[alias] = route
        return {alias: route.model_dump()}

    @app.delete("/admin/models/{alias}")
    async def admin_delete_model(alias: str, request: Request):
        """Forget an alias (its deployment keeps running; nothing is unloaded)."""
        require_admin(request, config)
        if alias not in routes:
            raise model_not_found(alias)
        del routes[alias]
        return {"deleted": alias}

    async def _serve(request: Request, operation: str):
        """The same as the hot path, for an ASGI caller that reaches the route itself."""
        result, headers = await serve(operation, dict(request.headers.items()), await request.body())
        if isinstance(result, Stream):
            return StreamingResponse(result.body, media_type="text/event-stream", headers=headers)
        return JSONResponse(result, headers=headers)

    return app


async def _follow_routes(routes: RouteTable, state: SharedState, admission: Admission, poll_s: float,
                         beat_s: float = 1.0) -> None:
    """Take up alias changes made through other replicas; every ``beat_s`` say this replica is
    alive and look at the shared ledgers (a Redis outage's share is taken from that sight)."""
    last_beat = 0.0
    while True:
        await asyncio.sleep(poll_s)
        try:
            await asyncio.to_thread(routes.refresh)
            if time.monotonic() - last_beat >= beat_s:
                await asyncio.to_thread(state.beat)
                await asyncio.to_thread(admission.look)
                last_beat = time.monotonic()
        except Exception:  # a bad poll must not end the following
            log.exception("could not refresh the alias table")


async def _json_body(request: Request) -> Any:
    return json_codec.request_object(await request.body())[0]


def _validated(raw: bytes, operation: str, in_slices: bool = False) -> tuple[dict, bytes | None]:
    """A completion request's body, checked against its model (400s), and its prompt's JSON.
    ``in_slices`` (a large body, in a thread): decoded and checked a slice of messages at a time,
    so that no single call holds the GIL for long (pydantic held it 130 ms for 20,000 messages)."""
    key = PROMPT_KEYS[operation]
    body, prompt_json = (json_codec.request_object(raw, key, json_codec.decode_request_in_slices) if in_slices
                         else json_codec.request_object(raw, key))
    messages = body.get("messages") if operation == "chat" else None
    try:
        if not in_slices or not isinstance(messages, list) or len(messages) <= MESSAGES_PER_SLICE:
            REQUEST_MODELS[operation].model_validate(body)
            return body, prompt_json
        REQUEST_MODELS[operation].model_validate({**body, "messages": messages[:1]})
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None
    for start in range(1, len(messages), MESSAGES_PER_SLICE):
        try:
            MESSAGE_LIST.validate_python(messages[start:start + MESSAGES_PER_SLICE])
        except ValidationError as exc:  # where the problem is in the whole list
            raise invalid_request([{**e, "loc": ("messages", start + e["loc"][0], *e["loc"][1:])}
                                   for e in exc.errors()]) from None
    return body, prompt_json


def _context(routes: RouteTable, h: Headers | dict[str, str], operation: str, body: dict,
             caller: Caller) -> RequestContext:
    return RequestContext.for_route(
        routes.get(body["model"]), new_trace_id(), operation, body,
        team=caller.team, api_key_id=caller.key_id, admin=caller.admin,
        session_id=h.get("x-session-id"), parent_trace_id=h.get("x-parent-trace-id"),
        env_id=h.get("x-env-id"), example_id=h.get("x-example-id"),
        # an environment's session is its rollout (verifiers sends one X-Session-ID per rollout)
        rollout_id=h.get("x-rollout-id") or (h.get("x-session-id") if h.get("x-env-id") else None))

