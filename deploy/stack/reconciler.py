"""Carries the dedicated deployments' desired state (kept by the gateway: serve/deployments.py)
into processes, the way the Dynamo operator reconciles a DynamoGraphDeployment: the supervisor
calls :meth:`Reconciler.tick` on every look.

Every ``dedicated.poll_s`` it reads every deployment from the gateway (admin key), and for each:
- DEPLOYING, RUNNING, SCALING: starts what of its graph is not running (a crashed process too),
  stops the workers above the desired count, loads an adapter deployment's LoRA into each new
  worker, and reports the replicas ready (their engine up and listed by the graph's frontend);
- DELETING: waits until the gateway counts none of its requests in flight (it left routing when
  the delete was asked), then stops the graph and reports it gone;
- STOPPED, FAILED: stops the graph.
An autoscaled deployment's report carries what its policy (deploy/stack/autoscaler.py) proposes.
A graph of a deployment the gateway no longer has is stopped. While the gateway cannot be reached
nothing is changed: what runs keeps running.

Scale-down drains (deploy/stack/drain.py): a worker scaled away leaves routing, finishes what it
serves (at most ``dedicated.drain_timeout_s``), then stops; it counts as ``draining`` meanwhile,
its slot still held and billed. One scaled back up while it drains is started anew once drained.
"""

from __future__ import annotations

import logging
from functools import partial
import time

import httpx

from deploy.stack import placement
from deploy.stack.autoscaler import Autoscaler, Signals, frontend_signals
from deploy.stack.config import StackConfig
from deploy.stack.graphs import GRAPH_PROCESS, graph_config, graph_indexes, graph_processes
from deploy.stack.drain import Drains, leave_etcd_routing, leave_routing
from deploy.stack.dynamo_graph import deployment_components, discovery_dir
from deploy.stack.frontend_instances import routes_to
from deploy.stack.processes import Component, ProcessManager, StartError, log_tail
from deploy.stack.serverless import worker_index
from serve.engine_admin import LORA_ROUTE, lora_load_body
from serve.workers import worker_result

log = logging.getLogger("flywheel.reconciler")
STARTS_BEFORE_FAILED = 5  # starts of one process that never became ready: the deployment FAILED
RUNS = ("DEPLOYING", "RUNNING", "SCALING")
CONVERGING, CONVERGING_POLL_S = ("DEPLOYING", "SCALING", "DELETING"), 0.1


class Reconciler:
    def __init__(self, cfg: StackConfig, pm: ProcessManager):
        self.cfg, self.pm = cfg, pm
        self.gateway = cfg.resolved_gateway().url
        self.next_look = 0.0
        self.starts: dict[str, int] = {}  # process -> starts since it was last ready
        self.adapter_in: dict[str, int] = {}  # worker -> the pid its adapter was loaded into
        self.drains = Drains(cfg.dedicated.drain_timeout_s)
        self.autoscalers: dict[str, Autoscaler] = {}  # deployment id -> its policy

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + self.cfg.dedicated.poll_s
        deps = self._desired()
        if deps is None:
            return
        if any(d["status"] in CONVERGING for d in deps):  # a start or drain is seen as soon as it is done
            self.next_look = now + min(CONVERGING_POLL_S, self.cfg.dedicated.poll_s)
        indexes = graph_indexes(self.cfg.run_dir, [d["id"] for d in deps])
        graphs = {d["id"]: graph_config(self.cfg, d, indexes[d["id"]]) for d in deps}
        if self.cfg.hosts.enabled:
            self._place(deps, graphs)
        for dep in deps:
            g = graphs[dep["id"]]
            try:
                seen = self._reconcile(dep, g)
            except (StartError, OSError, httpx.HTTPError) as exc:
                log.warning("%s: %s", dep["id"], exc)
                continue
            if dep.get("autoscale"):
                policy = self.autoscalers.setdefault(dep["id"], Autoscaler())
                signals = frontend_signals(g.frontend_url) if dep["status"] == "RUNNING" else Signals()
                seen["autoscale"] = policy.propose(now, dep, signals)
            self._report(dep["id"], seen)
        listed = {d["id"] for d in deps}
        for dep_id in set(self.autoscalers) - {d["id"] for d in deps if d.get("autoscale")}:
            del self.autoscalers[dep_id]
        for dep_id, names in graph_processes(self.cfg.run_dir).items():
            if dep_id not in listed:  # deleted while this supervisor was away
                self._stop(names)

    def _place(self, deps: list[dict], graphs: dict[str, StackConfig]) -> None:
        """Give each wanted worker of a running deployment its host (deploy/stack/placement.py);
        a draining one keeps its own."""
        wanted = {
            f"worker-{i}{graphs[d['id']].suffix}": d.get("slots_per_replica", 1)
            for d in deps
            if d["status"] in RUNS
            for i in range(graphs[d["id"]].worker.count)
        }
        running = {name for names in graph_processes(self.cfg.run_dir).values() for name in names}
        for name, host in placement.place(self.cfg, wanted, running).items():
            dep_id = GRAPH_PROCESS.search(name)
            if dep_id and dep_id.group(1) in graphs:  # a draining worker's too
                graphs[dep_id.group(1)].placement[worker_index(name)] = host

    def _desired(self) -> list[dict] | None:
        key = self.cfg.admin_key()
        try:
            r = httpx.get(f"{self.gateway}/v1/deployments", headers={"Authorization": f"Bearer {key}"}, timeout=5)
            r.raise_for_status()
            return r.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def _report(self, dep_id: str, seen: dict) -> None:
        key = self.cfg.admin_key()
        try:
            httpx.post(
                f"{self.gateway}/admin/deployments/{dep_id}/observed",
                json=seen,
                headers={"Authorization": f"Bearer {key}"},
                timeout=5,
            ).raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("%s: report not taken: %s", dep_id, exc)

    def _reconcile(self, dep: dict, g: StackConfig) -> dict:
        mine = graph_processes(self.cfg.run_dir).get(dep["id"], [])
        if dep["status"] == "DELETING":
            if dep.get("in_flight", 0):
                return self._seen(g, mine, ready=dep["replicas"]["ready"])
            self._stop(mine)
            return {"ready": 0, "gone": True}
        if dep["status"] not in RUNS:
            self._stop(mine)
            return {"ready": 0}
        comps = deployment_components(g)
        workers = [c for c in comps if c.name.startswith("worker-")]
        wanted = {c.name for c in comps}
        for name in sorted(n for n in mine if n not in wanted or n in self.drains):  # scaled down
            if self._drained(name, dep, g):
                self._stop([name])
        unplaced = {f"worker-{i}{g.suffix}" for i in range(g.worker.count) if g.hosts.enabled and i not in g.placement}
        failed = None
        for comp in comps:
            if comp.name not in self.drains and comp.name not in unplaced and self.pm.pid(comp.name) is None:
                failed = failed or self._start(comp)
        ready = sum(c.name not in self.drains and self._ready(dep, g, i, c) for i, c in enumerate(workers))
        return self._seen(g, mine, ready, failed)

    def _drained(self, name: str, dep: dict, g: StackConfig) -> bool:
        """Whether ``name``, no longer wanted, may stop now: a worker once it has drained."""
        index = name.removeprefix("worker-").removesuffix(g.suffix)
        if not (name.startswith("worker-") and index.isdigit()) or self.pm.pid(name) is None:
            self.drains.forget(name)
            return True
        if g.hosts.enabled:
            leave = partial(leave_etcd_routing, g.hosts.etcd_url)
        else:
            leave = partial(leave_routing, discovery_dir(g))
        return self.drains.step(name, g.worker_admin_url(int(index)), leave, partial(routes_to, g.frontend_url))

    def _seen(self, g: StackConfig, mine: list[str], ready: int, failed: str | None = None) -> dict:
        """The report on graph ``g``, whose processes were ``mine`` at the start of this look (one
        stopped since is no longer draining)."""
        return {
            "ready": ready,
            "draining": sum(n in self.drains for n in mine),
            "url": g.frontend_url,
            "admin_urls": [g.worker_admin_url(i) for i in range(g.worker.count)],
            "max_model_len": g.worker.max_model_len,
            "failed": failed,
        }

    def _start(self, comp: Component) -> str | None:
        """Start ``comp`` (what a dead one left of its group stopped first); why the deployment
        failed, once it has been started too often without becoming ready."""
        starts = self.starts.get(comp.name, 0)
        if starts >= STARTS_BEFORE_FAILED:
            return f"{comp.name} did not start {starts} times; its log ends:\n{log_tail(self.pm.log_file(comp.name), 10)}"
        self.pm.stop(comp.name, timeout=5)
        self.pm.start(comp)
        self.starts[comp.name] = starts + 1
        return None

    def _ready(self, dep: dict, g: StackConfig, i: int, comp: Component) -> bool:
        pid = self.pm.pid(comp.name)
        try:
            if pid is None or not self.pm.check_ready(comp):
                return False
        except (StartError, httpx.HTTPError, ValueError):
            return False
        self.pm.settle(comp.name)
        self.starts.pop(comp.name, None)
        if dep.get("lora_path") and self.adapter_in.get(comp.name) != pid:
            url = g.worker_admin_url(i)
            answer = worker_result(
                url, httpx.post(url + LORA_ROUTE, json=lora_load_body(dep["served_model"], dep["lora_path"]), timeout=120)
            )
            if not answer.ok:
                log.warning("%s: adapter not loaded yet: %s", comp.name, answer.reason[:200])
                return False
            self.adapter_in[comp.name] = pid
        return True

    def _stop(self, names: list[str]) -> None:
        for name in names:
            self.pm.stop(name, timeout=10)
            self.starts.pop(name, None)
            self.drains.forget(name)
