"""What a (re)started worker must load again: the full weights reloaded into its deployment in
place, and every LoRA adapter the alias table names.

A worker starts on the configured model with no adapters, so one that the supervisor restarted,
or that `flywheel up` started after a `down`, would serve other weights than the gateway's
persisted alias table (``gateway.routes_file``) records.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from deploy.stack.config import StackConfig
from serve.config import ModelRoute
from serve.engine_admin import LORA_ROUTE, lora_load_body
from serve.weights import PAUSE, RESUME, UPDATE
from serve.workers import worker_result


def _routes(cfg: StackConfig) -> list[ModelRoute]:
    """The persisted table's routes to this stack's serving deployment."""
    try:
        table = json.loads(Path(cfg.resolved_gateway().routes_file).read_text())
    except (FileNotFoundError, ValueError):
        return []
    routes = [ModelRoute.model_validate(r) for r in table.values()]
    return [r for r in routes if r.deployment == cfg.deployment_name]


def named_adapters(cfg: StackConfig) -> dict[str, str]:
    """Adapter name -> directory, for every route of the persisted table that serves a LoRA."""
    return {r.upstream_model: r.lora_path for r in _routes(cfg) if r.lora_path and Path(r.lora_path).is_dir()}


def swapped_weights(cfg: StackConfig) -> tuple[str, str] | None:
    """(directory, version) of full weights reloaded in place, when the workers start on others."""
    # an adapter's route records the base weights under it too; a base-weight alias names their version
    for r in sorted(_routes(cfg), key=lambda r: r.lora_path is not None):
        if r.weight_dir and Path(r.weight_dir) != cfg.serving_model_path:
            return r.weight_dir, r.checkpoint_version if r.lora_path is None else Path(r.weight_dir).name
    return None


def _call(cfg: StackConfig, worker: int, path: str, body: dict, what: str) -> None:
    url = cfg.worker_admin_url(worker)
    answer = worker_result(url, httpx.post(url + path, json=body, timeout=720))
    if not answer.ok:
        raise RuntimeError(f"worker-{worker} refused {what}: {answer.reason[:200]}")


def reload_adapters(cfg: StackConfig, worker: int) -> list[str]:
    """Reload the swapped-in weights and every named adapter on worker ``worker``; returns what
    it loaded. Raises on a refusal."""
    loaded = []
    swapped = swapped_weights(cfg)
    if swapped:
        weight_dir, version = swapped
        _call(cfg, worker, PAUSE, {"mode": "keep", "clear_cache": False}, "a pause")
        try:
            _call(cfg, worker, UPDATE, {"model_path": weight_dir, "weight_version": version}, f"weights {version!r}")
        finally:
            _call(cfg, worker, RESUME, {}, "a resume")
        loaded.append(f"weights {version}")
    for name, path in sorted(named_adapters(cfg).items()):
        _call(cfg, worker, LORA_ROUTE, lora_load_body(name, path), f"adapter {name!r}")
        loaded.append(name)
    return loaded
