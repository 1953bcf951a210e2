"""Hot-swap a registered checkpoint behind a gateway alias, and roll it back.

Everything goes through the gateway's admin API: the adapter is loaded on every worker of the
deployment and listed by its frontend (``/load_lora_adapter`` waits for both) before the alias
moves, so no request ever reaches a worker without the weights it asks for; requests already
running finish on the version they started with. Each trace records the version its alias
pointed at when it arrived.

A full checkpoint of a different architecture or size goes blue-green (:meth:`HotSwap.blue_green`):
a new deployment starts on it beside the serving one, the aliases move across, the old one drains
and is stopped; :class:`Slots` is the process side (deploy/stack/bluegreen.py: a shared deployment
like any other).

A full checkpoint of the same shape is reloaded in place (``/update_weights``: the deployment pauses only for the
reload, its requests are frozen rather than failed) and every alias serving the deployment's base
weights records its version. Going back to ``base`` reloads the base weights the same way.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import httpx

from feedback.registry import BASE, Registry


class HotSwapError(RuntimeError):
    pass


class HotSwap:
    def __init__(
        self,
        gateway_url: str,
        admin_key: str,
        registry: Registry,
        deployment: str,
        base_model_name: str,
        base_model_path: str | Path | None = None,
    ):
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
        self._post("/update_weights", {"weight_dir": weight_dir, "weight_version": version, "deployment": self.deployment})

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
            # loaded already: no reload, whose pause would refuse the adapters' requests meanwhile
            if self._weights_now(alias) != ckpt.path:
                self._reload(ckpt.path, version)
            return self.base_model_name
        name = self.upstream_name(alias, version)
        self._post(
            "/load_lora_adapter",
            {"lora_name": name, "lora_path": ckpt.path, "deployment": self.deployment, "checkpoint_version": version},
        )
        return name

    def point(self, alias: str, version: str) -> None:
        self._post(f"/admin/models/{alias}", self._route(alias, version), method="PUT")

    def split(self, alias: str, weights: dict[str, float], shadow: frozenset[str] = frozenset()) -> None:
        """Serve ``alias`` from several versions at once, each a share of its sessions
        (serve/split.py): adapters, or ``base``, all over the weights the deployment has loaded;
        each is loaded first, then the split is set in one PUT. A version in ``shadow`` gets a
        copy of its share and answers no client. Not recorded as a promotion."""
        loaded = self._weights_now(alias)
        fulls = [v for v in weights if v != BASE and self.registry.get(v).kind == "full"]
        for version in fulls:  # an arm on full weights: only on the ones loaded now, which no arm may reload
            if self.registry.get(version).path != loaded or BASE in weights or len(fulls) > 1:
                raise HotSwapError(
                    f"{version} is a full checkpoint the deployment has not loaded alone: reloading it "
                    "would change every arm; deploy it dedicated (flywheel deployments create) and split "
                    "to that instead"
                )
        for version in weights:
            if version not in fulls:
                self.load(alias, version)
        arms = [{"route": self._route(alias, v), "weight": w, "name": v, "shadow": v in shadow} for v, w in weights.items()]
        self._post(f"/admin/models/{alias}", {"routes": arms}, method="PUT")

    def _route(self, alias: str, version: str) -> dict:
        """The route body that serves ``version`` under ``alias``."""
        lora_path = weight_dir = None
        if version == BASE:
            weight_dir = self.base_model_path  # what load() left there (None: never known)
        else:
            ckpt = self.registry.get(version)
            if ckpt.kind == "full":
                weight_dir = str(Path(ckpt.path).resolve())
            else:
                # the adapter runs over whatever base weights are loaded: record them, so a reset
                # or a restarted worker knows they were swapped
                lora_path, weight_dir = str(Path(ckpt.path).resolve()), self._weights_now(alias)
        return {
            "deployment": self.deployment,
            "upstream_model": self.upstream_name(alias, version),
            "checkpoint_version": version,
            "lora_path": lora_path,
            "weight_dir": weight_dir,
        }

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

    def blue_green(self, alias: str, version: str, slots: "Slots", drain_timeout_s: float = 300, record: bool = True) -> str:
        """Serve ``version`` (a full checkpoint, or ``base``) from a new deployment: ``slots``
        starts it and returns its name once it serves; every alias on the base weights of the old
        deployment moves to it; when nothing is in flight on the old one, the aliases of adapters
        loaded there are dropped and the old one is retired. If anything fails before that, the
        aliases go back and the new deployment is stopped. Returns the new deployment's name."""
        ckpt = None if version == BASE else self.registry.get(version)
        if ckpt is not None and ckpt.kind != "full":
            raise HotSwapError(f"{version} is a LoRA: it loads beside the base weights, no new deployment")
        table = self._post("/admin/models", None, method="GET")
        old = table.get(alias, {}).get("deployment", self.deployment)
        moving = [a for a, r in table.items() if r["deployment"] == old and (a == alias or not r["lora_path"])]
        stranded = [
            a
            for a, r in table.items()
            if r["deployment"] == old and r["lora_path"] and a not in moving and a != r["upstream_model"]
        ]
        if stranded:
            raise HotSwapError(
                f"aliases {stranded} serve adapters of {old}'s base weights: move them "
                "first (they cannot follow to another checkpoint)"
            )
        new, upstream = slots.start_beside(version)
        path = str(Path(ckpt.path).resolve()) if ckpt else self.base_model_path
        try:
            for a in moving:
                self._post(
                    f"/admin/models/{a}",
                    {
                        "deployment": new,
                        "upstream_model": upstream,
                        "checkpoint_version": version,
                        "weight_dir": path,
                    },
                    method="PUT",
                )
            self._drain(old, drain_timeout_s)
        except BaseException:
            for a in moving:  # back where they were; then the new deployment goes
                self._post(f"/admin/models/{a}", table[a], method="PUT")
            slots.abandon(new)
            raise
        for a, r in table.items():  # the adapters loaded on the old deployment go with it
            if r["deployment"] == old and r["lora_path"] and a == r["upstream_model"]:
                self._post(f"/admin/models/{a}", None, method="DELETE")
        slots.retire(old, version)
        self.deployment = new
        if record:
            self.registry.promote(alias, version)
        return new

    def _drain(self, deployment: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            deps = {d["name"]: d for d in self._post("/admin/deployments", None, method="GET")["data"]}
            if deps[deployment]["in_flight"] == 0:
                return
            if time.monotonic() > deadline:
                raise HotSwapError(
                    f"{deployment} still has {deps[deployment]['in_flight']} requests in "
                    f"flight after {timeout_s:.0f} s; it was not stopped"
                )
            time.sleep(0.2)

    def rollback_blue_green(self, alias: str, slots: "Slots") -> str:
        """:meth:`rollback` by a new deployment (the previous version has another shape)."""
        target = self.registry.previous(alias)
        self.blue_green(alias, target, slots, record=False)
        self.registry.pop(alias)
        return target

    def unload_adapter(self, alias: str, version: str) -> None:
        """Unload ``version``'s adapter (no alias may still serve it)."""
        self._post("/unload_lora_adapter", {"lora_name": self.upstream_name(alias, version), "deployment": self.deployment})


class Slots(Protocol):
    """The process side of a blue-green deploy (deploy/stack/bluegreen.py)."""

    def start_beside(self, version: str) -> tuple[str, str]: ...  # the new deployment and its model name, serving
    def retire(self, old: str, version: str) -> None: ...  # the new one is the stack's; stop old
    def abandon(self, new: str) -> None: ...  # stop the new one (the deploy failed)
