"""The gateway's composition root: makes its parts once and includes every router.

Routes are declared at module level, one router per resource (``serve/api/``: completions,
Responses, Messages, models, deployments, status, trace SQL, admin; the feedback and Batch APIs
and the trace browser beside their parts), and reach the parts through ``serve.gateway_parts``.
A completion request's whole way is ``serve.api.completions.complete`` ->
:class:`serve.forward.Forwarder`; a Responses or Messages request's is the same, from
``serve.api.completions.forward_chat``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from functools import partial

import httpx
from fastapi import FastAPI

from serve import feedback_api, trace_query, ui
from serve.admission import Admission
from serve.affinity import Affinity
from serve.auth import is_admin_key
from serve.api import admin, completions, deployments, messages, models, responses, status, traces
from serve.batch import api as batch_api
from serve.batch.runner import BatchRunner
from serve.body_limit import BodyLimit
from serve.breaker import Breakers
from serve.config import GatewayConfig
from serve.conversations import Conversations
from serve.cross_site import CrossSite
from serve.deployments import Deployments
from serve.errors import install_error_handlers
from serve.forward import Forwarder
from serve.gateway_parts import GatewayParts
from serve.hot_path import Gateway, HotPath
from serve.keys import KeyStore
from serve.metrics import Metrics
from serve.openapi import install as install_openapi
from serve.query_pool import QueryPool
from serve.refusal_pace import RefusalPace
from serve.routes import RouteTable
from serve.shared_state import SharedState
from serve.upstream_http import upstream_client
from serve.weights import FullWeights
from traces.batch_store import BatchStore, FileStore
from traces.otlp import OtlpExporter
from traces.writer import TraceWriter

log = logging.getLogger(__name__)
ROUTERS = (
    completions.router,
    responses.router,
    messages.router,
    models.router,
    deployments.router,
    status.router,
    traces.router,
    feedback_api.router,
    batch_api.router,
    admin.router,
)


def build_parts(config: GatewayConfig, writer: TraceWriter | None = None) -> GatewayParts:
    # the exporter's outbox first: the writer hands it what it replays at start
    otlp = OtlpExporter(config.traces_dir, config.instance_name, config.otlp) if config.otlp.endpoint else None
    writer = writer or TraceWriter(
        config.traces_dir,
        config.instance_name,
        config.trace_flush_batch,
        config.trace_flush_age_s,
        on_converted=otlp.enqueue if otlp else None,
        mover=config.trace_mover,
        compact_fanout=config.trace_compact_fanout,
    )
    keys = KeyStore(config.keys_file) if config.keys_file else None
    state = SharedState(config.redis_url, replica=config.instance_name, alone_after_s=config.admission.budget_alone_after_s)
    routes = RouteTable(config.models, state, config.routes_file)
    admission = Admission(config, state)
    dedicated = Deployments(config, state, routes, admission)
    breakers = Breakers(state, config.breaker)
    metrics = Metrics()
    metrics.watch_deployments(dedicated)
    metrics.watch_spool(writer)
    forwarder = Forwarder(config, routes, writer, admission, breakers, Affinity(state), metrics, dedicated)
    files, batches = FileStore(config.traces_dir, config.batch.file_ttl_s), BatchStore(config.traces_dir)
    queries = QueryPool(config.query, config.query_timeout_s, trace_query.spill_root(config))
    # a turn another replica answered reaches the store's files within a flush or two, and a few
    # seconds when the host is busy: not less than the 5 s the 1 s flush age gave (only a turn
    # found nowhere waits that long, before its 404)
    limits, wait_s = trace_query.QueryLimits.of(config), max(5.0, 2 + 3 * config.trace_flush_age_s)
    conversations = Conversations(config.traces_dir, queries, limits, wait_s)
    return GatewayParts(
        config=config,
        keys=keys,
        state=state,
        routes=routes,
        deployments=dedicated,
        admission=admission,
        breakers=breakers,
        metrics=metrics,
        forwarder=forwarder,
        writer=writer,
        files=files,
        batches=batches,
        batch_runner=BatchRunner(config, batches, files, forwarder, keys),
        queries=queries,
        conversations=conversations,
        otlp=otlp,
    )


def create_app(config: GatewayConfig, writer: TraceWriter | None = None) -> FastAPI:
    gw = build_parts(config, writer)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        app.state.http = upstream_client(httpx.Timeout(config.upstream_timeout_s, connect=5), limits)
        follower = asyncio.create_task(_follow_routes(gw, config.routes_poll_s)) if config.redis_url else None
        scheduler = asyncio.create_task(gw.batch_runner.run())
        yield
        scheduler.cancel()
        await gw.batch_runner.stop()  # before the writer closes: their traces are what recovers them
        if follower is not None:
            follower.cancel()
        await app.state.http.aclose()
        await gw.forwarder.pool.aclose()
        gw.writer.close()
        if gw.otlp is not None:  # what it has not sent waits in its outbox for the next start
            gw.otlp.close()
        gw.queries.close()

    app = Gateway(title="Flywheel gateway", lifespan=lifespan)
    hot = {path: partial(completions.complete, gw, operation) for path, (operation, *_) in completions.COMPLETIONS.items()}
    hot |= {"/v1/responses": partial(responses.create, gw), "/v1/messages": partial(messages.create, gw)}
    app.hot_path = HotPath(hot, config.max_body_bytes)
    app.cross_site = CrossSite(config)
    app.refusal_pace = RefusalPace(config.refusals_per_s, config.refusal_burst) if config.refusals_per_s else None
    app.is_admin = partial(is_admin_key, config=config)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.state.parts, app.state.full_weights = gw, FullWeights(config, gw.routes, gw.forwarder.reload_gate)
    install_error_handlers(app)
    install_openapi(app)
    for router in ROUTERS:
        app.include_router(router)
    if config.ui.enabled:
        ui.install(app, config, gw.keys, gw.queries)
    return app


async def _follow_routes(gw: GatewayParts, poll_s: float, beat_s: float = 1.0) -> None:
    """Take up alias and deployment changes made through other replicas; every ``beat_s`` say
    this replica is alive and look at the shared ledgers (a Redis outage's share is taken from
    that sight)."""
    last_beat = 0.0
    while True:
        await asyncio.sleep(poll_s)
        try:
            # the replica that changes a deployment writes its routes before its row: read in the
            # other order, a row seen RUNNING has its route here by the end of this look
            await asyncio.to_thread(gw.deployments.refresh)
            await asyncio.to_thread(gw.routes.refresh)
            if time.monotonic() - last_beat >= beat_s:
                await asyncio.to_thread(gw.state.beat)
                await asyncio.to_thread(gw.admission.look)
                last_beat = time.monotonic()
        except Exception:  # a bad poll must not end the following
            log.exception("could not refresh the alias table")
