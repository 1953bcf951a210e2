"""Hot-swap a registered checkpoint behind a gateway alias, and roll it back.

Everything goes through the gateway's admin API: the adapter is loaded on every worker of the
deployment and listed by its frontend (``/load_lora_adapter`` waits for both) before the alias
moves, so no request ever reaches a worker without the weights it asks for; requests already
running finish on the version they started with. Each trace records the version its alias
pointed at when it arrived.

A full checkpoint is reloaded in place (``/update_weights``: the deployment pauses only for the
reload, its requests are frozen rather than failed) and every alias serving the deployment's base
weights records its version. Going back to ``base`` reloads the base weights the same way.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from feedback.registry import BASE, Registry


class HotSwapError(RuntimeError):
    pass


class HotSwap:
    def __init__(self, gateway_url: str, admin_key: str, registry: Registry,
                 deployment: str, base_model_name: str, base_model_path: str | Path | None = None):
        self.url, self.registry = gateway_url.rstrip("/"), registry
        self.deployment, self.base_model_name = deployment, base_model_name
        self.base_model_path = str(Path(base_model_path).resolve()) if base_model_path else None
        self.headers = {"Authorization": f"Bearer {admin_key}"}

    def _post(self, path: str, body: dict | None, method: str = "POST") -> dict:
        # 720 s: a full reload may take as long as prime-rl allows it
        r = httpx.request(method, f"{self.url}{path}", json=body, headers=self.headers, timeout=720)
        if r.status_code != 200:
            raise HotSwapError(f"{path}: HTTP {r.status_code} {r.text[:400]}")
        return r.json()

    def _reload(self, weight_dir: str, version: str) -> None:
        self._post("/update_weights", {"weight_dir": weight_dir, "weight_version": version,
                                       "deployment": self.deployment})

    def _weights_now(self, alias: str) -> str | None:
        route = self._post("/admin/models", None, method="GET").get(alias) or {}
        return route.get("weight_dir")

    def upstream_name(self, alias: str, version: str) -> str:
        if version == BASE or self.registry.get(version).kind == "full":
            return self.base_model_name
        return f"{alias}@{version}"

    def load(self, alias: str, version: str) -> str:
        """Make ``version`` servable on the deployment (idempotent); returns its model name."""
        if version == BASE:
            swapped = self._weights_now(alias)
            if swapped and self.base_model_path and swapped != self.base_model_path:
                self._reload(self.base_model_path, BASE)
            return self.base_model_name
        ckpt = self.registry.get(version)
        if ckpt.kind == "full":
            self._reload(ckpt.path, version)
            return self.base_model_name
        name = self.upstream_name(alias, version)
        self._post("/load_lora_adapter", {"lora_name": name, "lora_path": ckpt.path,
                                          "deployment": self.deployment, "checkpoint_version": version})
        return name

    def point(self, alias: str, version: str) -> None:
        ckpt = None if version == BASE else self.registry.get(version)
        path = str(Path(ckpt.path).resolve()) if ckpt else None
        full = ckpt is not None and ckpt.kind == "full"
        self._post(f"/admin/models/{alias}", {
            "deployment": self.deployment, "upstream_model": self.upstream_name(alias, version),
            "checkpoint_version": version, "lora_path": None if full else path,
            "weight_dir": path if full else self._weights_now(alias) if version == BASE else None},
            method="PUT")

    def reset(self, alias: str) -> None:
        """Serve the base model under ``alias`` and record that as the new starting point."""
        self.load(alias, BASE)
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
