"""The gateway's parts, made once by ``create_app`` and handed to every route as a dependency.

Routes are declared at module level (``serve/api/`` and the routers beside the parts they serve)
and take ``gw: GatewayParts = Depends(parts)``: what a route needs is named in its signature, not
captured from an enclosing ``create_app``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from serve.admission import Admission
from serve.auth import Caller, authenticate, bearer, is_admin_key
from serve.auth import require_admin as _require_admin
from serve.batch.runner import BatchRunner
from serve.breaker import Breakers
from serve.config import GatewayConfig
from serve.conversations import Conversations
from serve.deployments import Deployments
from serve.forward import Forwarder
from serve.keys import KeyStore
from serve.metrics import Metrics
from serve.query_pool import QueryPool
from serve.routes import RouteTable
from serve.shared_state import SharedState
from traces.batch_store import BatchStore, FileStore
from traces.otlp import OtlpExporter
from traces.writer import TraceWriter


@dataclass
class GatewayParts:
    config: GatewayConfig
    keys: KeyStore | None
    state: SharedState
    routes: RouteTable
    deployments: Deployments
    admission: Admission
    breakers: Breakers
    metrics: Metrics
    forwarder: Forwarder
    writer: TraceWriter
    files: FileStore
    batches: BatchStore
    batch_runner: BatchRunner
    queries: QueryPool
    conversations: Conversations  # Responses API turns (previous_response_id)
    otlp: OtlpExporter | None = None  # trace rows as OpenTelemetry spans (gateway.otlp)

    def caller(self, request: Request) -> Caller:
        return authenticate(request, self.config, self.keys)

    def require_admin(self, request: Request) -> None:
        _require_admin(request, self.config)

    def sees_internals(self, request: Request) -> bool:
        """Whether the caller may see the gateway's insides (every team's names and figures,
        deployments, breakers): anyone without keys (the local profile), else the admin key."""
        return not self.config.require_api_key or is_admin_key(bearer(request), self.config)


def parts(request: Request) -> GatewayParts:
    """The FastAPI dependency: ``gw: GatewayParts = Depends(parts)``."""
    return request.app.state.parts
