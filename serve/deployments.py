"""Dedicated deployments: capacity a team creates, scales and deletes through the API
(serve/api/deployments.py), kept to that team and billed by replica time.

The gateway holds each deployment's desired state (a :class:`SharedTable`: Redis with a file
behind it, so it survives restarts and is one table for every replica). The supervisor
(deploy/stack/reconciler.py) reads it, starts, scales or stops the deployment's own Dynamo graph
and reports what it observed: ready replicas, the graph's frontend. ``serve/`` never starts a
process. Status:

    DEPLOYING -> RUNNING (every desired replica ready) -> SCALING (a scale being carried out)
    DELETING (out of routing; the graph drains, then stops and the deployment is gone)
    STOPPED  (its team's budget ran out: reason insufficient_quota; the graph is stopped)
    FAILED   (its graph could not start: reason)

A deployment is routable (its ``served_model`` in the alias table, visible to its team only)
while RUNNING or SCALING. Replica time is charged from RUNNING on: every report, scale and delete
charges the replicas ready since the last charge. A deployment of a served base model may spill to
the serverless deployment of that model (``overflow: "serverless"``, :meth:`Deployments.spill_to`).

A *shared* deployment (``team`` null; the admin's ``shared: true``) is the platform's serverless
capacity rather than a team's: a blue-green deploy (deploy/stack/bluegreen.py) starts one on a
checkpoint and moves the profile's aliases to it. It has no route of its own and no replica-time
bill (its requests are charged by the token, as on any serverless model), and it cannot be deleted
while an alias routes to it. The profile's own graph holds its slots while an alias routes to it.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from serve.admission import Admission
from serve.autoscale import Autoscale, Decision, Proposal, ReplicaRange, decide
from serve.auth import Caller
from serve.config import Capacity, Deployment, GatewayConfig, ModelRoute, StrictModel
from serve.errors import APIError, model_not_found
from serve.routes import RouteTable
from serve.shared_state import LOCAL, SharedState
from serve.shared_table import SharedTable

Status = Literal["DEPLOYING", "RUNNING", "SCALING", "DELETING", "STOPPED", "FAILED"]
HOLDS_SLOTS = ("DEPLOYING", "RUNNING", "SCALING", "DELETING")  # its processes run (or are starting)
ROUTABLE = ("RUNNING", "SCALING")
HISTORY_KEPT = 500
ID_PREFIX = "dep-"
LOCK = "flywheel:deployments:lock"
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
SHARED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")  # a served model name, as profiles set one
TEAM = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # as serve/keys.py allows


class Replicas(BaseModel):
    desired: int
    ready: int = 0
    draining: int = Field(0, description="scaled away, out of routing, finishing their requests")
    min: int | None = Field(None, description="autoscaled between min and max; null: a fixed count")
    max: int | None = None

    @property
    def held(self) -> int:
        """Replicas whose slots are taken: a draining one still runs."""
        return self.held_at(self.desired)

    def held_at(self, desired: int) -> int:
        """The replicas whose slots would be taken with ``desired`` replicas wanted."""
        return max(desired, self.ready + self.draining)


class DedicatedDeployment(BaseModel):
    id: str
    object: Literal["deployment"] = "deployment"
    name: str
    team: str | None = Field(description="whose it is; null: shared, the platform's serverless capacity (blue-green)")
    model: str = Field(description="what the create asked for: a checkpoint version or a served base model")
    checkpoint_version: str
    served_model: str = Field(description="the name to send as `model`")
    status: Status = "DEPLOYING"
    reason: str | None = None
    replicas: Replicas
    created_at: int
    # what the supervisor needs and reports
    model_path: str = Field(description="the weights the graph's workers start on")
    lora_path: str | None = Field(None, description="an adapter each worker loads, served as served_model")
    slots_per_replica: int = 1
    url: str | None = None
    admin_urls: list[str] = Field(default_factory=list)
    max_model_len: int | None = None
    # replica time
    running_since: float | None = None
    billed_until: float | None = None
    replica_seconds: float = 0.0
    cost_usd: float = 0.0
    # autoscaling (serve/autoscale.py)
    autoscale: Autoscale | None = None
    decisions: list[Decision] = Field(default_factory=list, description="the last autoscaling decisions, newest last")
    scale_events: dict[str, int] = Field(default_factory=dict, description="'<up|down>:<signal>' -> autoscaled changes")
    replica_history: list[tuple[float, int, int]] = Field(
        default_factory=list, description="(unix time, desired, ready) at each change, the last 500: the usage page's plot"
    )
    # overflow
    overflow: Literal["serverless"] | None = None
    overflow_model: str | None = Field(None, description="the serverless model it spills to, charged per token there")

    def public(self, operator: bool) -> dict:
        """The API's deployment object; where the weights and processes are is the operator's."""
        hidden = set() if operator else {"model_path", "lora_path", "url", "admin_urls"}
        return self.model_dump(exclude=hidden | {"billed_until", "replica_history"})

    def note_replicas(self, now: float) -> None:
        """Add a point to the replica history if the desired or ready count changed."""
        point = (round(now, 1), self.replicas.desired, self.replicas.ready)
        if not self.replica_history or self.replica_history[-1][1:] != point[1:]:
            self.replica_history = [*self.replica_history[-(HISTORY_KEPT - 1) :], point]


class CreateRequest(StrictModel):
    model: str = Field(min_length=1, description="a registered checkpoint version or a served base model")
    name: str | None = Field(None, description="served as <team>/<name>; default the checkpoint version")
    replicas: int | ReplicaRange = Field(1, description="a fixed count, or {min, max} to autoscale between")
    autoscale: Autoscale | None = Field(None, description="with replicas {min, max}: the policy's knobs")
    overflow: Literal["serverless"] | None = Field(
        None,
        description="a served base model's deployment: when it cannot grow (at max, or the pool full) and its "
        "replicas are at target_concurrency, spill requests to the serverless deployment of that model",
    )
    team: str | None = Field(None, description="admin only: whose deployment")
    shared: bool = Field(
        False, description="admin only: the platform's serverless capacity, no team's: aliases are pointed at it (blue-green)"
    )


class ScaleRequest(StrictModel):
    replicas: int | ReplicaRange = Field(description="a fixed count, or {min, max} to autoscale between")
    autoscale: Autoscale | None = Field(None, description="with replicas {min, max}: the policy's knobs")


class Observed(StrictModel):
    """What the supervisor saw of one deployment's graph."""

    ready: int = Field(ge=0)
    draining: int = Field(0, ge=0)
    url: str | None = None
    admin_urls: list[str] = Field(default_factory=list)
    max_model_len: int | None = None
    gone: bool = Field(False, description="a DELETING deployment's graph has drained and stopped")
    failed: str | None = Field(None, description="why its graph cannot start")
    autoscale: Proposal | None = Field(None, description="an autoscaled deployment: what its policy wants")


class Deployments:
    def __init__(self, config: GatewayConfig, state: SharedState, routes: RouteTable, admission: Admission):
        self.config, self.routes, self.admission, self.state = config, routes, admission, state
        self.table: SharedTable[DedicatedDeployment] = SharedTable(
            DedicatedDeployment, "flywheel:deployments", {}, state, config.deployments_file
        )
        self.static = list(config.deployments)  # the profile's own (serverless, blue-green)
        self._lock = threading.Lock()  # one change at a time in this replica
        self._apply()

    # -- reading ----------------------------------------------------------------------------------

    def visible(self, caller: Caller) -> list[DedicatedDeployment]:
        return sorted((d for d in self.table.values() if caller.admin or d.team == caller.team), key=lambda d: d.created_at)

    def get(self, caller: Caller, dep_id: str) -> DedicatedDeployment:
        """The caller's deployment; another team's answers as no deployment at all."""
        d = self.table.get(dep_id)
        if d is None or not (caller.admin or d.team == caller.team):
            raise APIError(404, f"no deployment {dep_id!r}", param="id", code="deployment_not_found")
        return d

    def pool(self) -> dict:
        """Slots in all, held and free."""
        static = {d.name for d in self.static}
        routed = any(static & _targets(route) for route in self.routes.values())
        held = self.config.pool.serverless_slots * routed + sum(
            d.replicas.held * d.slots_per_replica for d in self.table.values() if d.status in HOLDS_SLOTS
        )
        total = self.config.pool.slots or 0
        return {"slots": total, "held": held, "free": max(0, total - held)}

    def spill_to(self, dep_id: str) -> str | None:
        """The serverless model a request for ``dep_id`` goes to instead, when it has overflow on,
        cannot grow (at its max, or no free slot for another replica) and its ready replicas each
        have ``target_concurrency`` requests in flight; else None. At zero replicas a request
        wakes the deployment rather than spilling."""
        d = self.table.get(dep_id)
        if d is None or d.overflow_model is None or d.replicas.ready == 0:
            return None
        r = d.replicas
        if r.desired < (r.max or r.desired) and self.pool()["free"] >= d.slots_per_replica:
            return None  # it can grow: the autoscaler adds a replica
        target = (d.autoscale or Autoscale()).target_concurrency
        if self.admission.leases_held(dep_id)[0] < r.ready * target:
            return None
        return d.overflow_model

    # -- changing ---------------------------------------------------------------------------------

    def create(self, caller: Caller, req: CreateRequest) -> DedicatedDeployment:
        team = req.team if (caller.admin and req.team) else caller.team
        if req.team and not caller.admin and req.team != caller.team:
            raise APIError(403, "only the admin key creates deployments for another team", param="team", type="permission_error")
        if req.shared and not caller.admin:
            raise APIError(403, "only the admin key creates shared deployments", param="shared", type="permission_error")
        if req.shared and (req.team or req.overflow):
            raise APIError(400, "a shared deployment has no team and no overflow", param="shared")
        if not TEAM.match(team):
            raise APIError(400, f"invalid team {team!r}: letters, digits, '-' and '_'", param="team")
        version, model_path, lora_path = self._resolve(caller, team, req.model)
        team = None if req.shared else team
        if req.overflow and version != "base":
            raise APIError(
                400,
                f"overflow needs a deployment of a served base model: {req.model!r} is a checkpoint, and the "
                "serverless deployment does not serve its weights",
                param="overflow",
            )
        name = req.name or version
        if not (SHARED_NAME if req.shared else NAME).match(name):
            raise APIError(400, f"invalid name {name!r}: lower-case letters, digits, '.', '_' and '-', at most 63", param="name")
        wanted = self._wanted(req.replicas, req.autoscale)
        with self._exclusive():
            # a shared deployment's name is the model its engines serve (the alias's upstream model);
            # it has no route of its own, so two may share one (the old and the new of a blue-green)
            served = name if req.shared else f"{team}/{name}"
            taken = served in self.routes and not self.routes[served].deployment.startswith(ID_PREFIX)  # an alias
            if not req.shared and (taken or any(d.served_model == served for d in self.table.values())):
                raise APIError(409, f"team {team!r} already has a deployment named {name!r}", param="name", code="conflict")
            self._fit(wanted.desired * self.config.pool.slots_per_replica)
            dep = DedicatedDeployment(
                id=ID_PREFIX + secrets.token_hex(6),
                name=name,
                team=team,
                model=req.model,
                checkpoint_version=version,
                served_model=served,
                replicas=wanted,
                autoscale=self._knobs(req.replicas, req.autoscale),
                created_at=int(time.time()),
                model_path=model_path,
                lora_path=lora_path,
                slots_per_replica=self.config.pool.slots_per_replica,
                overflow=req.overflow,
                overflow_model=req.model if req.overflow else None,
            )
            dep.note_replicas(time.time())
            self.table[dep.id] = dep
            return dep

    def scale(self, caller: Caller, dep_id: str, req: ScaleRequest) -> DedicatedDeployment:
        """A fixed count, or a new range (the desired count brought inside it) and knobs."""
        wanted = self._wanted(req.replicas, req.autoscale)
        with self._exclusive():
            dep = self.get(caller, dep_id).model_copy(deep=True)
            if dep.status not in ("DEPLOYING", "RUNNING", "SCALING"):
                raise APIError(409, f"deployment {dep_id} is {dep.status}: it cannot be scaled", code="conflict")
            if isinstance(req.replicas, ReplicaRange):
                wanted.desired = min(max(dep.replicas.desired, wanted.min), wanted.max)
            more = (dep.replicas.held_at(wanted.desired) - dep.replicas.held) * dep.slots_per_replica
            if more > 0:
                self._fit(more)
            self._bill(dep, time.time())
            r = dep.replicas
            r.desired, r.min, r.max = wanted.desired, wanted.min, wanted.max
            dep.autoscale = self._knobs(req.replicas, req.autoscale or dep.autoscale)
            if dep.status == "RUNNING" and r.ready != r.desired:
                dep.status = "SCALING"
            self._save(dep)
            return dep

    def delete(self, caller: Caller, dep_id: str) -> DedicatedDeployment:
        """Out of routing now; the supervisor stops the graph once its requests have finished."""
        with self._exclusive():
            dep = self.get(caller, dep_id).model_copy(deep=True)
            aliases = self._aliases_on(dep)
            if aliases:
                raise APIError(
                    409,
                    f"aliases {aliases} route to {dep_id}: move them first (flywheel checkpoint deploy), "
                    "or their requests would find nothing",
                    code="conflict",
                )
            if dep.status != "DELETING":
                self._bill(dep, time.time())
                dep.status, dep.reason = "DELETING", None
                self._save(dep)
            return dep

    def observe(self, dep_id: str, seen: Observed) -> DedicatedDeployment | None:
        """The supervisor's report: replicas ready, where the graph listens; charge the time since
        the last charge; move the status on. None once a deleted deployment is gone."""
        with self._exclusive():
            dep = self.table.get(dep_id)
            if dep is None:
                return None
            dep = dep.model_copy(deep=True)
            now = time.time()
            self._bill(dep, now)
            if dep.status == "DELETING" and seen.gone:
                del self.table[dep_id]
                self._apply()
                return None
            dep.replicas.ready, dep.replicas.draining = seen.ready, seen.draining
            if seen.url:
                dep.url, dep.admin_urls, dep.max_model_len = seen.url, seen.admin_urls, seen.max_model_len
            if dep.status in ("DEPLOYING", "RUNNING", "SCALING"):
                if seen.failed:
                    dep.status, dep.reason = "FAILED", seen.failed
                elif seen.ready == dep.replicas.desired and not seen.draining:
                    if dep.running_since is None:
                        dep.running_since = dep.billed_until = now
                    dep.status = "RUNNING"
                elif dep.status == "RUNNING":
                    dep.status = "SCALING"  # a replica was lost: the supervisor heals it
                if dep.autoscale and seen.autoscale and dep.status in ROUTABLE:
                    decide(dep, seen.autoscale, self.pool()["free"])
            self._save(dep)
            return dep

    def asleep(self, dep_id: str) -> DedicatedDeployment | None:
        """The deployment, if it is autoscaled and has no replica ready (scaled to zero, or
        waking): a request for it waits for one (:meth:`wake`)."""
        d = self.table.get(dep_id)
        return d if d is not None and d.autoscale is not None and d.replicas.ready == 0 and d.status in ROUTABLE else None

    def wake(self, dep_id: str) -> DedicatedDeployment | None:
        """A request arrived for a deployment at zero: one replica, if the pool has its slots
        (else the decision says it waits). The deployment as it is now; None once it is gone."""
        self.refresh()
        d = self.table.get(dep_id)
        if d is None or d.replicas.desired > 0:
            return d
        with self._exclusive():
            dep = self.table.get(dep_id)
            if dep is None or dep.replicas.desired > 0 or dep.status not in ROUTABLE:
                return dep
            dep = dep.model_copy(deep=True)
            self._bill(dep, time.time())
            if decide(dep, Proposal(replicas=1, signal="wake", value=1, target=0), self.pool()["free"]) is not None:
                self._save(dep)
            return dep

    # -- inside -----------------------------------------------------------------------------------

    def _aliases_on(self, dep: DedicatedDeployment) -> list[str]:
        """The aliases (other than the deployment's own route) that send requests to ``dep``."""
        own = dep.served_model if dep.team is not None else None
        return sorted(a for a, r in self.routes.items() if a != own and dep.id in _targets(r))

    @contextmanager
    def _exclusive(self):
        """One change at a time across every replica (a Redis lock, when there is Redis), made on
        the table as it is now: two creates through two replicas cannot both take the last slots."""
        with self._lock:
            lock = self.state.call(lambda client: client.lock(LOCK, timeout=10, blocking_timeout=5))
            held = lock is not LOCAL and self.state.call(lambda _: lock.acquire())
            if lock is not LOCAL and held is False:
                raise APIError(503, "deployments are being changed through another gateway; retry", type="server_error")
            try:
                if held is True:
                    self.refresh()
                yield
            finally:
                if held is True:
                    from redis.exceptions import LockError

                    try:
                        self.state.call(lambda _: lock.release())
                    except LockError:  # it lapsed (after 10 s): nothing left to release
                        pass

    def _bill(self, dep: DedicatedDeployment, now: float) -> None:
        """Charge the replicas ready (or draining) since the last charge; stop the deployment when
        its team's budget is spent."""
        if dep.status not in ROUTABLE or dep.billed_until is None or dep.team is None:
            return
        replica_s = (dep.replicas.ready + dep.replicas.draining) * max(0.0, now - dep.billed_until)
        dep.billed_until = now
        price = self.config.prices.get(dep.model) or self.config.prices.get(dep.served_model)
        cost = replica_s * (price.replica_hour_usd if price else 0.0) / 3600
        dep.replica_seconds += replica_s
        dep.cost_usd += cost
        left = self.admission.charge_replica_time(dep.team, round(replica_s * 1000), math.ceil(cost * 1e6))
        if not left:
            dep.status, dep.reason = "STOPPED", "insufficient_quota"

    def _save(self, dep: DedicatedDeployment) -> None:
        """Routes first, then the row: a request sent once the row says RUNNING finds its alias
        (writing the row takes an fsync and a Redis round trip, and readers see it meanwhile)."""
        dep.note_replicas(time.time())
        self._apply({**self.table, dep.id: dep})
        self.table[dep.id] = dep

    def _fit(self, slots: int) -> None:
        pool = self.pool()
        if slots > pool["free"]:
            raise APIError(
                409,
                f"insufficient capacity: this needs {slots} slot(s), {pool['free']} of {pool['slots']} are free "
                "(delete or scale down a deployment to free some)",
                code="insufficient_capacity",
            )

    def _wanted(self, replicas: int | ReplicaRange, autoscale: Autoscale | None) -> Replicas:
        """The replicas a create or scale asks for (a range starts at its min)."""
        most = self.config.pool.max_replicas
        if isinstance(replicas, int):
            if replicas < 1:
                raise APIError(400, "replicas must be at least 1 (delete a deployment to free its slots)", param="replicas")
            if autoscale is not None:
                raise APIError(400, "autoscale needs replicas as {min, max}", param="autoscale")
            replicas = ReplicaRange(min=replicas, max=replicas)
            fixed = True
        else:
            fixed = False
        if replicas.max > most:
            raise APIError(400, f"replicas must be at most {most}", param="replicas")
        # a range starting at 0 starts with one replica all the same: it sleeps once idle
        return Replicas(desired=max(1, replicas.min), min=None if fixed else replicas.min, max=None if fixed else replicas.max)

    @staticmethod
    def _knobs(replicas: int | ReplicaRange, autoscale: Autoscale | None) -> Autoscale | None:
        return None if isinstance(replicas, int) else (autoscale or Autoscale())

    def _resolve(self, caller: Caller, team: str, model: str) -> tuple[str, str, str | None]:
        """``model`` as (checkpoint version, the weights its workers start on, its adapter)."""
        if model == "base" and caller.admin:  # the profile's own weights (a blue-green deploy back to them)
            dep = next((d for d in self.static if d.model_path), None)
            if dep is not None:
                return "base", dep.model_path, None
        ckpt = _registered(self.config.checkpoints_file).get(model)
        if ckpt is not None:
            if ckpt.get("team") not in (None, team) and not caller.admin:
                raise model_not_found(model)  # another team's checkpoint: as if there were none
            if ckpt["kind"] == "lora":
                return model, ckpt["base_model"], ckpt["path"]
            return model, ckpt["path"], None
        route = self.routes.get(model)
        if route is not None and route.lora_path is None and route.teams is None and route.checkpoint_version == "base":
            dep = next((d for d in self.static if d.name == route.deployment and d.model_path), None)
            if dep is not None:
                return "base", dep.model_path, None
        raise model_not_found(model)

    def refresh(self) -> None:
        """Take up changes another replica made (the follower calls this)."""
        if self.table.refresh():
            self._apply(routes=False)

    def _apply(self, rows: dict[str, DedicatedDeployment] | None = None, routes: bool = True) -> None:
        """This replica's deployments list and capacity from ``rows`` (the table's); with
        ``routes``, the alias table too (only the replica that made a change writes it)."""
        rows = self.table if rows is None else rows
        dedicated = [d for d in rows.values() if d.url and d.status in HOLDS_SLOTS]
        self.config.deployments = self.static + [
            Deployment(name=d.id, url=d.url, admin_urls=d.admin_urls, max_model_len=d.max_model_len, model_path=d.model_path)
            for d in dedicated
        ]
        for d in dedicated:  # leases count its requests in flight: a delete drains to 0
            self.config.capacity[d.id] = Capacity(max_requests=64 * max(1, d.replicas.desired))
        if not routes:
            return
        want = {d.served_model: d for d in dedicated if d.status in ROUTABLE and d.team is not None}
        shared = {d.id for d in rows.values() if d.team is None}
        for alias, route in list(self.routes.items()):  # an alias moved to a shared deployment stays
            if route.deployment.startswith(ID_PREFIX) and alias not in want and route.deployment not in shared:
                del self.routes[alias]
        for alias, d in want.items():
            route = ModelRoute(
                deployment=d.id,
                upstream_model=d.served_model,
                checkpoint_version=d.checkpoint_version,
                lora_path=d.lora_path,
                teams=[d.team],
                created=d.created_at,
            )
            if self.routes.get(alias) != route:
                self.routes[alias] = route


def _targets(route: ModelRoute) -> set[str]:
    """The deployments a route sends requests to: its own (and fallbacks), and each arm's."""
    arms = [a.route for a in route.split or []]
    return {route.deployment, *route.fallbacks} | {d for r in arms for d in (r.deployment, *r.fallbacks)}


def _registered(path: str | None) -> dict[str, dict]:
    """The checkpoint registry's checkpoints (feedback/registry.py writes it), version -> record."""
    if not path:
        return {}
    try:
        return json.loads(Path(path).read_text()).get("checkpoints", {})
    except (FileNotFoundError, ValueError):
        return {}
