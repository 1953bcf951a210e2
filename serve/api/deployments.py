"""``/v1/deployments``: dedicated deployments a team creates, lists, scales and deletes
(serve/deployments.py), and the route the supervisor reports what it observed on.

Reading needs any key of the team; creating, scaling and deleting need the ``deployments``
scope. Another team's deployment answers 404, as one that does not exist.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from serve import json_codec
from serve.auth import Caller, require_scope
from serve.deployments import CreateRequest, DedicatedDeployment, Observed, ScaleRequest
from serve.errors import invalid_request
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body

router = APIRouter()


def _body(model: type[BaseModel], raw: bytes):
    try:
        return model.model_validate(json_codec.request_object(raw)[0])
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None


def _shown(gw: GatewayParts, caller: Caller, dep: DedicatedDeployment) -> dict:
    out = dep.public(operator=caller.admin or not gw.config.require_api_key)
    if caller.admin:  # the supervisor drains a deleted deployment down to 0 of these
        out["in_flight"] = gw.admission.leases_held(dep.id)[0]
        if dep.overflow:  # its demand too: its autoscaler counts them
            out["overflow_in_flight"] = gw.admission.spilled(dep.id)
    return out


@router.post("/v1/deployments", status_code=202, openapi_extra=json_body(CreateRequest))
async def create_deployment(request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    require_scope(caller, "deployments")
    # in a thread: a change waits for the lock other gateway replicas may hold
    dep = await asyncio.to_thread(gw.deployments.create, caller, _body(CreateRequest, await request.body()))
    return JSONResponse(_shown(gw, caller, dep), status_code=202)


@router.get("/v1/deployments")
async def list_deployments(request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    return {
        "object": "list",
        "data": [_shown(gw, caller, d) for d in gw.deployments.visible(caller)],
        "capacity": gw.deployments.pool(),
    }


@router.get("/v1/deployments/{dep_id}")
async def get_deployment(dep_id: str, request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    return _shown(gw, caller, gw.deployments.get(caller, dep_id))


@router.post("/v1/deployments/{dep_id}/scale", status_code=202, openapi_extra=json_body(ScaleRequest))
async def scale_deployment(dep_id: str, request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    require_scope(caller, "deployments")
    dep = await asyncio.to_thread(gw.deployments.scale, caller, dep_id, _body(ScaleRequest, await request.body()))
    return JSONResponse(_shown(gw, caller, dep), status_code=202)


@router.delete("/v1/deployments/{dep_id}", status_code=202)
async def delete_deployment(dep_id: str, request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    require_scope(caller, "deployments")
    dep = await asyncio.to_thread(gw.deployments.delete, caller, dep_id)
    return JSONResponse(_shown(gw, caller, dep), status_code=202)


@router.post("/admin/deployments/{dep_id}/observed", openapi_extra=json_body(Observed), include_in_schema=False)
async def observed(dep_id: str, request: Request, gw: GatewayParts = Depends(parts)):
    """The supervisor's report on one deployment's graph."""
    gw.require_admin(request)
    dep = await asyncio.to_thread(gw.deployments.observe, dep_id, _body(Observed, await request.body()))
    return {"id": dep_id, "gone": dep is None, "status": dep.status if dep else None}
