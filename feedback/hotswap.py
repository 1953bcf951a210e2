"""Put a trained LoRA adapter into a running deployment, then move the alias to it.

Order matters for zero failed requests: the adapter is loaded on every worker of the
deployment and visible in the deployment's model list before the gateway's alias points at it;
requests already running on the old version finish there.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx


class HotSwapError(RuntimeError):
    pass


def load_lora(worker_admin_urls: list[str], frontend_url: str, name: str, path: str | Path,
              timeout_s: float = 60.0) -> None:
    """Load adapter ``path`` as model ``name`` on each worker (Dynamo's ``POST /v1/loras``) and
    wait until the deployment's frontend lists it."""
    uri = Path(path).resolve().as_uri()
    for url in worker_admin_urls:
        r = httpx.post(f"{url}/v1/loras", json={"lora_name": name, "source": {"uri": uri}},
                       timeout=timeout_s)
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if r.status_code != 200 or body.get("status") != "success":
            raise HotSwapError(f"worker {url} refused LoRA {name!r}: HTTP {r.status_code} {r.text[:300]}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        models = httpx.get(f"{frontend_url}/v1/models", timeout=5).json().get("data", [])
        if any(m.get("id") == name for m in models):
            return
        time.sleep(0.2)
    raise HotSwapError(f"LoRA {name!r} loaded but not listed by {frontend_url} after {timeout_s:.0f} s")


def point_alias(gateway_url: str, admin_key: str, alias: str, deployment: str,
                upstream_model: str, checkpoint_version: str) -> dict:
    """Move a public model name to ``upstream_model`` on ``deployment`` (gateway admin API)."""
    r = httpx.put(f"{gateway_url}/admin/models/{alias}",
                  headers={"Authorization": f"Bearer {admin_key}"},
                  json={"deployment": deployment, "upstream_model": upstream_model,
                        "checkpoint_version": checkpoint_version}, timeout=10)
    if r.status_code != 200:
        raise HotSwapError(f"gateway refused to move alias {alias!r}: HTTP {r.status_code} {r.text[:300]}")
    return r.json()
