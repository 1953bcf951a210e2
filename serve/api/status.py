"""The gateway's health, its Prometheus metrics and a team's spend."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from serve.breaker import STATE_CODES
from serve.errors import APIError
from serve.gateway_parts import GatewayParts, parts

router = APIRouter()


@router.get("/health")
async def health(request: Request, gw: GatewayParts = Depends(parts)):
    """Liveness for anyone (a load balancer's probe); the details for the admin key."""
    if not gw.sees_internals(request):
        return {"status": "ok"}
    return {
        "status": "ok",
        "models": sorted(gw.routes),
        "shared_state": gw.state.shared,
        "breakers": {d.name: gw.breakers.state_of(d.name) for d in gw.config.deployments},
    }


@router.get("/metrics")
async def prometheus(request: Request, gw: GatewayParts = Depends(parts)):
    if not gw.sees_internals(request):  # every team's name and token totals
        raise APIError(401, "/metrics needs the admin key when gateway.require_api_key is on", code="invalid_api_key")
    for d in gw.config.deployments:
        gw.metrics.leases.labels(d.name).set(gw.admission.leases_held(d.name)[0])
        gw.metrics.breaker.labels(d.name).set(STATE_CODES[gw.breakers.state_of(d.name)])
    return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/usage")
async def usage(request: Request, team: str | None = None, gw: GatewayParts = Depends(parts)):
    """A team's spend; the admin key sees every team with a budget (or ``?team=``)."""
    caller = gw.caller(request)
    if caller.admin:
        teams = [team] if team else sorted(gw.config.budgets)
        return {"object": "list", "data": [gw.admission.usage(t) for t in teams]}
    return gw.admission.usage(caller.team)
