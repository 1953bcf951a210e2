"""The process side of a blue-green deploy (feedback/hotswap.py moves the aliases between them),
made of deployments like any other.

A checkpoint starts as a *shared* deployment (serve/deployments.py: the platform's serverless
capacity, no team's), created through the gateway's ``/v1/deployments`` as the admin; the
supervisor's reconciler starts its graph, heals it and brings it back after `down` and `up`, as it
does a team's. Going back to the base model starts the profile's own graph again if an earlier
deploy retired it (deploy/stack/serverless.py), else it is a shared deployment of the base weights.

``retire`` stops what served before: a shared deployment is deleted (the reconciler stops it once
its requests have finished); the profile's graph is recorded as retired and stopped, the
supervisor stopped first so it does not restart it, then started again without it.
"""

from __future__ import annotations

import time

import httpx

from deploy.stack.config import StackConfig
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.launcher import console, start_components, start_supervisors, supervisor_components
from deploy.stack.processes import ProcessManager
from deploy.stack.run_state import stack_lock
from deploy.stack.serverless import retired, set_retired
from feedback.hotswap import HotSwapError
from feedback.registry import BASE

POLL_S = 0.5


class BlueGreen:
    def __init__(self, cfg: StackConfig, start_timeout_s: float | None = None):
        self.cfg = cfg
        self.profile_graph = cfg.deployment_name  # `local`: the profile's own
        self.start_timeout_s = start_timeout_s or cfg.start_timeout_s
        gw = cfg.resolved_gateway()
        self.http = httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {cfg.admin_key()}"}, timeout=30)

    def start_beside(self, version: str) -> tuple[str, str]:
        """Start ``version`` (a full checkpoint, or ``base``) beside what serves; once it serves,
        (its deployment's name, the model name its workers serve)."""
        if version == BASE and retired(self.cfg.run_dir) is not None:
            console.print(f"starting {self.profile_graph} on {self.cfg.model_path} again")
            with stack_lock(self.cfg.run_dir):
                start_components(self.cfg, deployment_components(self.cfg))
            return self.profile_graph, self.cfg.worker.served_model_name
        # its engines serve the profile's model name, so the aliases' upstream model and an adapter
        # loaded over the new weights later are named as on the profile's graph
        body = {"model": version, "name": self.cfg.worker.served_model_name, "replicas": self.cfg.worker.count, "shared": True}
        dep = self._call("POST", "/v1/deployments", body)
        console.print(f"starting {dep['id']} ({dep['served_model']}) on {version}")
        deadline, last = time.monotonic() + self.start_timeout_s, None
        while dep["status"] != "RUNNING":
            now = (dep["status"], dep["replicas"]["ready"], dep["replicas"]["desired"])
            if now != last:
                console.print(f"  {dep['id']}: {now[0]}, replicas {now[1]}/{now[2]}")
                last = now
            if dep["status"] in ("FAILED", "STOPPED") or time.monotonic() > deadline:
                self._call("DELETE", f"/v1/deployments/{dep['id']}")
                why = dep.get("reason") or f"not RUNNING after {self.start_timeout_s:.0f} s"
                raise HotSwapError(f"{dep['id']} on {version} did not start ({why}); it was deleted")
            time.sleep(POLL_S)
            dep = self._call("GET", f"/v1/deployments/{dep['id']}")
        return dep["id"], dep["served_model"]

    def retire(self, old: str, version: str) -> None:
        """``old`` (already drained, no alias left on it) stops; what started beside it serves."""
        if old == self.profile_graph:
            self._restart_supervisor(lambda pm: self._stop_profile_graph(pm, by=version))
        else:
            if retired(self.cfg.run_dir) is not None and version == BASE:
                self._restart_supervisor(lambda pm: set_retired(self.cfg.run_dir, None))  # it heals the graph again
            self._delete(old)
        console.print(f"stopped {old}; {version} serves")

    def abandon(self, new: str) -> None:
        """Stop what :meth:`start_beside` started (the deploy did not go through)."""
        if new == self.profile_graph:
            pm = ProcessManager(self.cfg.run_dir)
            for comp in reversed(deployment_components(self.cfg)):
                pm.stop(comp.name)
        else:
            self._delete(new)
        console.print(f"stopped {new}; what served before still serves")

    def _stop_profile_graph(self, pm: ProcessManager, by: str) -> None:
        set_retired(self.cfg.run_dir, by)
        for comp in reversed(deployment_components(self.cfg)):
            pm.stop(comp.name)

    def _restart_supervisor(self, change) -> None:
        """``change(pm)`` with the supervisors stopped, then the supervisors started on what `up` runs now."""
        pm = ProcessManager(self.cfg.run_dir)
        with stack_lock(self.cfg.run_dir):
            for comp in supervisor_components(self.cfg):
                pm.stop(comp.name)
            change(pm)
            if self.cfg.supervisor.enabled:
                start_supervisors(self.cfg, pm)

    def _delete(self, dep_id: str) -> None:
        """Delete ``dep_id`` and wait until the reconciler has stopped its graph."""
        self._call("DELETE", f"/v1/deployments/{dep_id}")
        deadline = time.monotonic() + self.cfg.dedicated.drain_timeout_s + 60
        while self.http.get(f"/v1/deployments/{dep_id}").status_code != 404:
            if time.monotonic() > deadline:
                raise HotSwapError(f"{dep_id} was deleted but its graph has not stopped yet; the supervisor carries on")
            time.sleep(POLL_S)

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            r = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise HotSwapError(f"cannot reach the gateway at {self.http.base_url}: {exc}") from None
        if r.status_code >= 400:
            raise HotSwapError(f"{method} {path}: HTTP {r.status_code} {r.text[:300]}")
        return r.json()
