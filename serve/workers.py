"""Calls to every worker of a deployment (the engine routes on each worker's system port), with
one result per worker, and the request parsing the admin routes share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from fastapi import Request
from pydantic import BaseModel, ValidationError

from serve.config import Deployment, GatewayConfig, ModelRoute
from serve.errors import APIError, invalid_request


@dataclass
class WorkerResult:
    url: str
    status: int | None  # None: the worker could not be reached
    data: dict
    reason: str = ""

    @property
    def ok(self) -> bool:
        # Dynamo reports logical failures as HTTP 200 with status "error"
        return self.status is not None and self.status < 400 and self.data.get("status") != "error"

    def error(self, path: str) -> APIError:
        if self.status is None:
            return APIError(502, f"worker {self.url} unreachable: {self.reason}", type="server_error")
        if 400 <= self.status < 500:  # the worker says the request was wrong, not that it broke
            kind = "not_found_error" if self.status == 404 else "invalid_request_error"
            return APIError(self.status, f"worker {self.url} cannot do {path}: {self.reason}", type=kind)
        return APIError(502, f"worker {self.url} failed {path}: {self.reason}", type="server_error")

    def summary(self) -> dict:
        return {"worker": self.url, "ok": self.ok, **({} if self.ok else {"error": self.reason})}


def worker_result(url: str, r: httpx.Response) -> WorkerResult:
    """What a worker's engine route answered (JSON body or not). Dynamo's system server labels
    its engine routes' JSON ``text/plain``: the body is read as JSON whatever its label says, or a
    refusal ({"status": "error"}) would pass for success (measured: a pause refused for running
    adapter requests was taken as done, and the weights were recorded as reloaded)."""
    try:
        data = r.json()
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    return WorkerResult(url, r.status_code, data, str(data.get("message") or r.text[:300]))


async def call_workers(
    http: httpx.AsyncClient, dep: Deployment, method: str, path: str, body: dict | None = None, timeout_s: float = 120
) -> list[WorkerResult]:
    """``method path`` on every worker at once; never raises for one worker's failure."""
    if not dep.admin_urls:
        raise APIError(409, f"deployment {dep.name!r} has no worker admin URLs configured", type="invalid_request_error")

    async def one(url: str) -> WorkerResult:
        try:
            r = await http.request(method, url + path, json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            return WorkerResult(url, None, {}, type(exc).__name__)
        return worker_result(url, r)

    return list(await asyncio.gather(*(one(u) for u in dep.admin_urls)))


async def on_workers(
    http: httpx.AsyncClient, dep: Deployment, method: str, path: str, body: dict | None = None, timeout_s: float = 120
) -> list[WorkerResult]:
    """Like :func:`call_workers`, raising the first worker's failure as the answer."""
    results = await call_workers(http, dep, method, path, body, timeout_s)
    for r in results:
        if not r.ok:
            raise r.error(path)
    return results


async def parse_body(request: Request, model: type[BaseModel]):
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None


def pick_deployment(config: GatewayConfig, name: str | None, routes: Mapping[str, ModelRoute]) -> Deployment:
    """The named deployment; without a name, the first one (in configuration order) that an
    alias serves from (after a blue-green deploy that is the new one), else the first."""
    if not name:
        serving = {r.deployment for r in routes.values()}
        name = next((d.name for d in config.deployments if d.name in serving), None)
    try:
        return config.deployment(name) if name else config.deployments[0]
    except (KeyError, IndexError):
        raise APIError(400, f"unknown deployment {name!r}", param="deployment") from None
