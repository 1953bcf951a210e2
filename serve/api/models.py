"""``/v1/models``: the aliases a caller may use, as vLLM's model cards plus what catalogs read."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from serve.auth import Caller
from serve.config import ModelRoute, Price
from serve.errors import model_not_found
from serve.gateway_parts import GatewayParts, parts

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    return {
        "object": "list",
        "data": [
            _model_card(gw, alias, r, caller) for alias, r in sorted(gw.routes.items()) if r.serves(caller.team, caller.admin)
        ],
    }


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    route = gw.routes.get(model_id)
    if route is None or not route.serves(caller.team, caller.admin):
        raise model_not_found(model_id)
    return _model_card(gw, model_id, route, caller)


def _per_token(usd_per_mtok: float) -> str:
    """OpenRouter's price format: USD per token, as a decimal string."""
    return f"{usd_per_mtok / 1e6:.12f}".rstrip("0").rstrip(".") or "0"


def _model_card(gw: GatewayParts, alias: str, r: ModelRoute, caller: Caller) -> dict:
    """vLLM's card (``root``, ``parent`` for an adapter, ``max_model_len``: prime-rl sizes its
    concurrency from it), the checkpoint the alias serves, and what catalogs read: OpenRouter's
    ``context_length`` and per-token ``pricing``, Prime's ``*_usd_per_mtok`` and ``specs``."""
    config = gw.config
    dep = next((d for d in config.deployments if d.name == r.deployment), None)
    base = next((b.upstream_model for b in gw.routes.values() if b.deployment == r.deployment and b.lora_path is None), None)
    context = dep.max_model_len if dep else None
    price = config.prices.get(alias) or Price()
    # where the weights live on the serving hosts is the operator's business, not a team's
    operator = caller.admin or not config.require_api_key
    path = (r.lora_path or r.weight_dir or (dep.model_path if dep else None)) if operator else None
    return {
        "id": alias,
        "object": "model",
        "created": r.created,
        "owned_by": "flywheel",
        "root": path or r.upstream_model,
        "parent": None if r.lora_path is None else base,
        "max_model_len": context,
        "context_length": context,
        "checkpoint_version": r.checkpoint_version,
        "pricing": {
            "input_usd_per_mtok": price.input_per_mtok,
            "output_usd_per_mtok": price.output_per_mtok,
            "cache_read_usd_per_mtok": price.cached,
            "prompt": _per_token(price.input_per_mtok),
            "completion": _per_token(price.output_per_mtok),
            "input_cache_read": _per_token(price.cached),
        },
        "specs": {"context_window": context, "max_output_tokens": context},
    }
