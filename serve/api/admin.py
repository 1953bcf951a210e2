"""Every admin route, in one router: the alias table and the deployments here, and the engine's
own admin routes (LoRA load and unload, pause, resume, full-weight reload) from the modules that
do that work. Each needs the admin key, except ``/liveness``, which vLLM's RL API leaves open."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from serve import engine_admin, json_codec, weights
from serve.config import ModelRoute
from serve.errors import APIError, invalid_request, model_not_found
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from serve.split import SplitRequest, split_route

router = APIRouter()


@router.get("/admin/models")
async def admin_models(request: Request, gw: GatewayParts = Depends(parts)):
    gw.require_admin(request)
    return {alias: r.model_dump() for alias, r in gw.routes.items()}


@router.get("/admin/deployments")
async def admin_deployments(request: Request, gw: GatewayParts = Depends(parts)):
    """Each deployment, its requests in flight (a drain waits for 0) and the aliases it serves."""
    gw.require_admin(request)
    return {
        "object": "list",
        "data": [
            {
                "name": d.name,
                "url": d.url,
                "model_path": d.model_path,
                "in_flight": gw.admission.leases_held(d.name)[0],
                "breaker": gw.breakers.state_of(d.name),
                "aliases": sorted(a for a, r in gw.routes.items() if r.deployment == d.name),
            }
            for d in gw.config.deployments
        ],
    }


@router.put("/admin/models/{alias}", openapi_extra=json_body(ModelRoute, SplitRequest))
async def admin_set_model(alias: str, request: Request, gw: GatewayParts = Depends(parts)):
    """Point an alias at a deployment's model (a base model or a loaded LoRA), or split it over
    several such routes with weights (serve/split.py)."""
    gw.require_admin(request)
    body = json_codec.request_object(await request.body())[0]
    if isinstance(body, dict) and "routes" in body:
        route = split_route(body)
    else:
        try:
            route = ModelRoute.model_validate(body)
        except ValidationError as exc:
            raise invalid_request(exc.errors()) from None
        if route.split:
            raise APIError(400, 'a split is PUT as {"routes": [...]}, where its weights are checked', param="split")
    for arm in [a.route for a in route.split or []] or [route]:
        for name in [arm.deployment, *arm.fallbacks]:
            try:
                gw.config.deployment(name)
            except KeyError:
                raise APIError(400, f"unknown deployment {name!r}", param="deployment") from None
    gw.routes[alias] = route
    return {alias: route.model_dump()}


@router.delete("/admin/models/{alias}")
async def admin_delete_model(alias: str, request: Request, gw: GatewayParts = Depends(parts)):
    """Forget an alias (its deployment keeps running; nothing is unloaded)."""
    gw.require_admin(request)
    if alias not in gw.routes:
        raise model_not_found(alias)
    del gw.routes[alias]
    return {"deleted": alias}


router.include_router(engine_admin.router)
router.include_router(weights.router)
