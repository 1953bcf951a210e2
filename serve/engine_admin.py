"""Admin routes for LoRA adapters, shaped like the inference-server API prime-rl calls.

``POST /load_lora_adapter {lora_name, lora_path}`` loads an adapter on every worker of a
deployment (Dynamo's ``POST /v1/loras`` on each worker's status server), waits until the
deployment's frontend lists it, and only then makes ``lora_name`` a model clients can ask for.
``/unload_lora_adapter`` acts on every worker the same way. Full weights: serve/weights.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field, field_validator

from serve.config import Deployment, ModelRoute
from serve.errors import APIError
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from serve.workers import on_workers, parse_body, pick_deployment


LORA_ROUTE = "/v1/loras"  # Dynamo's LoRA route on a worker's system status server


def lora_load_body(name: str, path: str) -> dict:
    """What a Dynamo worker's ``POST /v1/loras`` takes to load the adapter in ``path``."""
    return {"lora_name": name, "source": {"uri": Path(path).as_uri()}}


# An adapter name is a model name (``alias@version``, ``org/name``), never a path: no empty,
# ``.`` or ``..`` segment, nothing that is not a letter, digit or one of ``._@:-``.
LORA_NAME = r"^[A-Za-z0-9._@:-]+(/[A-Za-z0-9._@:-]+)*$"


def _not_a_path(name: str) -> str:
    if any(part in (".", "..") for part in name.split("/")):
        raise ValueError("an adapter name may not have '.' or '..' segments")
    return name


class LoadLora(BaseModel):
    lora_name: str = Field(min_length=1, max_length=200, pattern=LORA_NAME)
    _name = field_validator("lora_name")(_not_a_path)
    lora_path: str = Field(min_length=1)
    deployment: str | None = None
    checkpoint_version: str | None = None


class UnloadLora(BaseModel):
    lora_name: str = Field(min_length=1, max_length=200, pattern=LORA_NAME)
    _name = field_validator("lora_name")(_not_a_path)
    deployment: str | None = None


async def _listed(http: httpx.AsyncClient, dep: Deployment, name: str) -> bool:
    """Whether the deployment's frontend lists ``name`` among its models (a loaded adapter is)."""
    try:
        models = (await http.get(f"{dep.url}/v1/models", timeout=5)).json().get("data", [])
    except (httpx.HTTPError, ValueError) as exc:
        raise APIError(502, f"deployment {dep.name!r} did not list its models: {exc}", type="server_error") from None
    return any(m.get("id") == name for m in models)


async def _wait_listed(http: httpx.AsyncClient, dep: Deployment, name: str, present: bool, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if await _listed(http, dep, name) == present:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise APIError(
                504,
                f"{name!r} did not {'appear in' if present else 'leave'} {dep.url}/v1/models within {timeout_s:.0f} s",
                type="server_error",
            )
        await asyncio.sleep(0.1)


router = APIRouter()


@router.post("/load_lora_adapter", openapi_extra=json_body(LoadLora))
@router.post("/v1/load_lora_adapter", openapi_extra=json_body(LoadLora))
async def load_lora(request: Request, gw: GatewayParts = Depends(parts)):
    gw.require_admin(request)
    req = await parse_body(request, LoadLora)
    if not Path(req.lora_path).is_dir():
        raise APIError(400, f"lora_path {req.lora_path!r} is not a directory on the serving host", param="lora_path")
    dep = pick_deployment(gw.config, req.deployment, gw.routes)
    http = request.app.state.http
    path = str(Path(req.lora_path).resolve())
    await on_workers(http, dep, "POST", LORA_ROUTE, lora_load_body(req.lora_name, path))
    await _wait_listed(http, dep, req.lora_name, present=True)
    gw.routes[req.lora_name] = ModelRoute(
        deployment=dep.name,
        upstream_model=req.lora_name,
        checkpoint_version=req.checkpoint_version or req.lora_name,
        lora_path=path,
    )
    return {"status": "success", "lora_name": req.lora_name, "workers": len(dep.admin_urls)}


@router.post("/unload_lora_adapter", openapi_extra=json_body(UnloadLora))
@router.post("/v1/unload_lora_adapter", openapi_extra=json_body(UnloadLora))
async def unload_lora(request: Request, gw: GatewayParts = Depends(parts)):
    gw.require_admin(request)
    req = await parse_body(request, UnloadLora)
    in_use = sorted(a for a, r in gw.routes.items() if r.upstream_model == req.lora_name and a != req.lora_name)
    if in_use:
        raise APIError(409, f"{req.lora_name!r} still serves alias(es) {in_use}; move them first", param="lora_name")
    dep = pick_deployment(gw.config, req.deployment, gw.routes)
    if not await _listed(request.app.state.http, dep, req.lora_name):
        raise APIError(
            404,
            f"no adapter {req.lora_name!r} is loaded on deployment {dep.name!r}",
            type="not_found_error",
            param="lora_name",
            code="model_not_found",
        )
    await on_workers(request.app.state.http, dep, "DELETE", f"/v1/loras/{quote(req.lora_name, safe='')}")
    gw.routes.pop(req.lora_name, None)
    return {"status": "success", "lora_name": req.lora_name}
