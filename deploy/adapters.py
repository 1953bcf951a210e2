"""LoRA adapters a (re)started worker must load again: every adapter the alias table names.

A worker loads adapters at run time only, so one that the supervisor restarted, or that
`flywheel up` started after a `down`, comes back with none, while the gateway's persisted alias
table (``gateway.routes_file``) may still point an alias at one.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from deploy.config import StackConfig
from serve.config import ModelRoute
from serve.engine_admin import LORA_ROUTE, lora_load_body


def named_adapters(cfg: StackConfig) -> dict[str, str]:
    """Adapter name -> directory, for every route of the persisted table that serves a LoRA."""
    path = Path(cfg.resolved_gateway().routes_file)
    try:
        table = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    routes = [ModelRoute.model_validate(r) for r in table.values()]
    return {r.upstream_model: r.lora_path for r in routes if r.lora_path and Path(r.lora_path).is_dir()}


def reload_adapters(cfg: StackConfig, worker: int) -> list[str]:
    """Load every named adapter on worker ``worker``; returns their names. Raises on a refusal."""
    loaded = []
    for name, path in sorted(named_adapters(cfg).items()):
        r = httpx.post(cfg.worker_admin_url(worker) + LORA_ROUTE, json=lora_load_body(name, path), timeout=120)
        data = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if r.status_code >= 400 or data.get("status") == "error":
            raise RuntimeError(f"worker-{worker} refused adapter {name!r}: {data.get('message') or r.text[:200]}")
        loaded.append(name)
    return loaded
