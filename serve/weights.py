"""Full weights in place, and the rest of the engine contract prime-rl calls: ``/pause``,
``/resume``, ``/update_weights``, ``/liveness``, ``/init_broadcaster``.

``POST /update_weights {"weight_dir"}`` reloads a Hugging Face safetensors checkpoint into every
worker of one deployment (Dynamo's ``/engine/update_weights_from_disk``, which runs vLLM's
layer-by-layer ``reload_weights`` and then resets the prefix cache, so no request after the
swap reuses KV computed with the old weights). Only that deployment pauses, and only for the
reload: its in-flight requests are frozen (``keep``), not aborted, and finish afterwards; an
adapter's request cannot be frozen (Dynamo refuses the pause while one runs), so the pause waits,
new requests held, until those in flight have ended (``gateway.pause_wait_s``). It is
all workers or none: when one worker fails, every worker is reloaded with the weights it served
before and the answer is a 502 with each worker's result. On success every alias that serves
the deployment's base weights records the new version, so each trace row names the weights that
produced it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from serve.config import Deployment, GatewayConfig, ModelRoute
from serve.errors import APIError
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from serve.reload_gate import ReloadGate
from serve.workers import WorkerResult, call_workers, on_workers, parse_body, pick_deployment

PAUSE, RESUME = "/engine/pause_generation", "/engine/resume_generation"
UPDATE, LIVENESS = "/engine/update_weights_from_disk", "/engine/liveness_probe"
RELOAD_TIMEOUT_S = 720.0  # prime-rl's own client timeout for /update_weights
# Dynamo's vLLM handler refuses to pause in keep mode while an adapter's request runs (it cannot
# freeze one); this is its refusal's wording, and how often a pause asks again meanwhile.
ADAPTERS_RUNNING, PAUSE_RETRY_S = "active LoRA requests", 0.05
# What must match for new weights to fit the running engine's tensors.
SHAPE_KEYS = (
    "model_type",
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)


class UpdateWeights(BaseModel):
    weight_dir: str = Field(
        min_length=1, description="a Hugging Face checkpoint directory (config.json + *.safetensors) on the serving host"
    )
    weight_version: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._@:/-]+$",
        description="recorded in every trace row; default: the directory's name",
    )
    deployment: str | None = None


def checkpoint_shape(weight_dir: str | Path) -> dict:
    """The config.json fields a reload in place must keep; raises 400 when it is no checkpoint."""
    d = Path(weight_dir)
    if not d.is_dir():
        raise APIError(400, f"weight_dir {str(d)!r} is not a directory on the serving host", param="weight_dir")
    if not any(d.glob("*.safetensors")):
        raise APIError(400, f"weight_dir {str(d)!r} holds no *.safetensors files", param="weight_dir")
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise APIError(400, f"weight_dir {str(d)!r} has no readable config.json ({exc})", param="weight_dir") from None
    return {k: config.get(k) for k in SHAPE_KEYS}


class FullWeights:
    """Pause state and the weights each deployment serves, for this gateway replica."""

    def __init__(self, config: GatewayConfig, routes: MutableMapping[str, ModelRoute], gate: ReloadGate):
        self.config, self.routes, self.gate = config, routes, gate
        self.paused_by_client: set[str] = set()
        self.locks: dict[str, asyncio.Lock] = {}

    def serving(self, dep: Deployment) -> tuple[str | None, str]:
        """(weight dir, version) of the base weights the deployment serves now (an adapter's
        route records the weights under it; a base-weight alias names their version)."""
        for r in sorted(self.routes.values(), key=lambda r: r.lora_path is not None):
            if r.deployment == dep.name and r.weight_dir:
                return r.weight_dir, r.checkpoint_version if r.lora_path is None else Path(r.weight_dir).name
        return dep.model_path, "base"

    async def reload(self, http, dep: Deployment, weight_dir: str, version: str) -> list[WorkerResult]:
        async with self.locks.setdefault(dep.name, asyncio.Lock()):
            previous_dir, previous_version = self.serving(dep)
            new = checkpoint_shape(weight_dir)  # a 400 before anything pauses
            if previous_dir and Path(previous_dir).is_dir():
                old = checkpoint_shape(previous_dir)
                changed = sorted(k for k in SHAPE_KEYS if old[k] != new[k])
                if changed:
                    raise APIError(
                        400,
                        f"weight_dir has a different architecture or size ({', '.join(changed)} "
                        "differ): it cannot be reloaded in place; deploy it blue-green "
                        "(flywheel checkpoint deploy --strategy blue-green)",
                        param="weight_dir",
                    )
            resume = dep.name not in self.paused_by_client  # else the client resumes when it is ready
            async with self.gate.closed(dep.name):  # this replica sends it nothing until the reload ends
                try:
                    await pause_workers(http, dep, {"mode": "keep", "clear_cache": False}, self.config.pause_wait_s)
                    results = await call_workers(
                        http,
                        dep,
                        "POST",
                        UPDATE,
                        {"model_path": weight_dir, "weight_version": version},
                        timeout_s=RELOAD_TIMEOUT_S,
                    )
                    if not all(r.ok for r in results):
                        await self._roll_back(http, dep, results, previous_dir, previous_version)
                    self._record(dep, weight_dir, version)  # before resuming: no new row names the old version
                finally:
                    if resume:
                        await on_workers(http, dep, "POST", RESUME, {})
            return results

    async def _roll_back(
        self, http, dep: Deployment, results: list[WorkerResult], previous_dir: str | None, previous_version: str
    ) -> None:
        failed = [r.summary() for r in results if not r.ok]
        if not previous_dir:
            raise APIError(
                502,
                f"weight reload failed on {len(failed)} of {len(results)} workers and the "
                f"deployment's previous weights are unknown: {failed}",
                type="server_error",
            )
        # A failed layer-by-layer reload may have replaced some layers: every worker goes back.
        back = await call_workers(
            http,
            dep,
            "POST",
            UPDATE,
            {"model_path": previous_dir, "weight_version": previous_version},
            timeout_s=RELOAD_TIMEOUT_S,
        )
        restored = all(r.ok for r in back)
        raise APIError(
            502,
            f"weight reload failed on {len(failed)} of {len(results)} workers: {failed}; "
            + (
                f"every worker serves {previous_version!r} again"
                if restored
                else f"restoring {previous_version!r} failed too: {[r.summary() for r in back]}"
            ),
            type="server_error",
        )

    def _record(self, dep: Deployment, weight_dir: str, version: str) -> None:
        for alias, r in list(self.routes.items()):
            if r.deployment == dep.name and r.lora_path is None:
                self.routes[alias] = r.model_copy(update={"checkpoint_version": version, "weight_dir": weight_dir})
            elif r.deployment == dep.name:  # an adapter keeps its version, over the new weights
                self.routes[alias] = r.model_copy(update={"weight_dir": weight_dir})


async def pause_workers(http, dep: Deployment, body: dict, wait_s: float) -> None:
    """Pause every worker of ``dep``. A worker that refuses because adapter requests are running
    is asked again until they have ended (the caller holds new ones back), for at most ``wait_s``;
    any other refusal is the answer at once."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        refused = [r for r in await call_workers(http, dep, "POST", PAUSE, body) if not r.ok]
        if not refused:
            return
        if not all(ADAPTERS_RUNNING in r.reason for r in refused):
            raise next(r for r in refused if ADAPTERS_RUNNING not in r.reason).error(PAUSE)
        if asyncio.get_running_loop().time() >= deadline:
            raise APIError(
                503,
                f"deployment {dep.name!r} still runs adapter requests after {wait_s:g} s, which its engine cannot "
                f"freeze ({refused[0].reason}); nothing was changed: try again, or raise gateway.pause_wait_s",
                type="server_error",
            )
        await asyncio.sleep(PAUSE_RETRY_S)


def full_weights(request: Request) -> FullWeights:
    """The FastAPI dependency: the app's one ``FullWeights`` (it remembers which deployments a
    client paused, so a reload does not resume them)."""
    return request.app.state.full_weights


router = APIRouter()


@router.post("/pause")
async def pause(
    request: Request,
    mode: str = "keep",
    clear_cache: bool = False,
    deployment: str | None = None,
    gw: GatewayParts = Depends(parts),
    weights: FullWeights = Depends(full_weights),
):
    """Freeze (``keep``), drain (``wait``) or abort (``abort``) one deployment's requests."""
    gw.require_admin(request)
    if mode not in ("keep", "wait", "abort"):
        raise APIError(400, f"mode must be keep, wait or abort, not {mode!r}", param="mode")
    dep = pick_deployment(gw.config, deployment, gw.routes)
    http = request.app.state.http
    if dep.name in weights.paused_by_client:  # paused already: its hold stands
        await on_workers(http, dep, "POST", PAUSE, {"mode": mode, "clear_cache": clear_cache})
        return {"status": "success", "paused": dep.name, "mode": mode}
    # held until /resume: the adapter requests in flight end, and none reaches the paused engine
    # (Dynamo would refuse it with a 500); base requests wait here as they would inside it
    weights.gate.hold(dep.name)
    try:
        await pause_workers(http, dep, {"mode": mode, "clear_cache": clear_cache}, gw.config.pause_wait_s)
    except BaseException:  # refused, or cut short: none stays paused, nothing stays held
        weights.gate.release(dep.name)
        await call_workers(http, dep, "POST", RESUME, {})
        raise
    weights.paused_by_client.add(dep.name)
    return {"status": "success", "paused": dep.name, "mode": mode}


@router.post("/resume")
async def resume(
    request: Request,
    deployment: str | None = None,
    gw: GatewayParts = Depends(parts),
    weights: FullWeights = Depends(full_weights),
):
    """Idempotent: resuming a running deployment is a no-op."""
    gw.require_admin(request)
    dep = pick_deployment(gw.config, deployment, gw.routes)
    await on_workers(request.app.state.http, dep, "POST", RESUME, {})
    if dep.name in weights.paused_by_client:
        weights.paused_by_client.discard(dep.name)
        weights.gate.release(dep.name)
    return {"status": "success", "resumed": dep.name}


@router.post("/update_weights", openapi_extra=json_body(UpdateWeights))
async def update_weights(request: Request, gw: GatewayParts = Depends(parts), weights: FullWeights = Depends(full_weights)):
    gw.require_admin(request)
    req = await parse_body(request, UpdateWeights)
    weight_dir = str(Path(req.weight_dir).resolve())
    dep = pick_deployment(gw.config, req.deployment, gw.routes)
    version = req.weight_version or Path(weight_dir).name
    results = await weights.reload(request.app.state.http, dep, weight_dir, version)
    return {
        "status": "success",
        "deployment": dep.name,
        "weight_version": version,
        "weight_dir": weight_dir,
        "workers": [r.summary() for r in results],
    }


@router.get("/liveness")
async def liveness(request: Request, deployment: str | None = None, gw: GatewayParts = Depends(parts)):
    """200 while every worker's engine answers, 503 (with each worker's result) when one does not."""
    dep = pick_deployment(gw.config, deployment, gw.routes)
    results = await call_workers(request.app.state.http, dep, "POST", LIVENESS, {}, timeout_s=10)
    workers = [r.summary() for r in results if r.status != 404]  # 404: an engine without the probe
    if all(w["ok"] for w in workers):
        return {"status": "ok", "deployment": dep.name, "workers": workers}
    return JSONResponse(
        APIError(
            503,
            f"{sum(not w['ok'] for w in workers)} of {len(workers)} workers of {dep.name!r} do not answer: {workers}",
            type="server_error",
        ).body(),
        status_code=503,
    )


@router.post("/init_broadcaster")
async def init_broadcaster(request: Request, gw: GatewayParts = Depends(parts)):
    gw.require_admin(request)
    # prime-rl skips the broadcaster on a 404 and falls back to checkpoints on disk.
    raise APIError(
        404,
        "NCCL/NIXL weight broadcast is not available on this platform's engines "
        "(it needs GPUs); write the checkpoint to disk and POST /update_weights "
        '{"weight_dir"} instead',
        type="not_found_error",
    )
