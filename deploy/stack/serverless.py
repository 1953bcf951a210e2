"""Whether the profile's own serverless graph (deployment `local`: its frontend, event broker and
workers) runs.

A blue-green deploy (deploy/stack/bluegreen.py) moves the profile's aliases to a shared deployment
of the new checkpoint and then retires the profile's graph; a blue-green deploy back to the base
model starts it again. The retirement is recorded in ``<home>/run/serverless-retired`` (holding
the checkpoint version that took over), so `up` and the supervisor leave the graph stopped.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

RETIRED_FILE = "serverless-retired"


def retired(run_dir: Path) -> str | None:
    """The checkpoint version that took over from the profile's graph, or None while the graph serves."""
    try:
        return (run_dir / RETIRED_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def set_retired(run_dir: Path, by: str | None) -> None:
    """Record that version ``by`` took over from the profile's graph (None: the graph serves)."""
    path = run_dir / RETIRED_FILE
    if by is None:
        path.unlink(missing_ok=True)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{RETIRED_FILE}.tmp"
    with open(tmp, "w") as f:
        f.write(by)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def serving_deployment(cfg, alias: str | None = None) -> str:
    """The deployment the profile's alias (or ``alias``) is served by: the profile's graph, or,
    once a blue-green deploy retired it, the one the gateway routes the alias to now."""
    if retired(cfg.run_dir) is None:
        return cfg.deployment_name
    gw = cfg.resolved_gateway()
    try:
        r = httpx.get(f"{gw.url}/admin/models", headers={"Authorization": f"Bearer {gw.admin_key}"}, timeout=10)
        route = r.json().get(alias or cfg.worker.served_model_name) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        route = None
    return (route or {}).get("deployment") or cfg.deployment_name


def worker_index(component: str) -> int:
    """``worker-3`` and ``worker-3-dep-1a2b`` are worker 3."""
    return int(component.split("-")[1])
