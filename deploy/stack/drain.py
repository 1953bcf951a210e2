"""A worker taken out of its graph without failing or cutting a request: first out of routing,
then what it is serving finishes, then it stops. Dynamo's own scale-down does not do this
(ai-dynamo/dynamo#13559: what still runs is aborted after a grace period), and a plain SIGTERM
here is followed by SIGKILL once the stop's timeout passes, whatever the worker still streams.

- Out of routing: the worker's instance entries are removed from the graph's discovery: files
  on one host, etcd keys on several. The frontend watches them and routes nothing new to it
  (measured on files: none of 20 requests sent 0.5 s after the removal reached it); the worker's
  keep-alive refreshes an entry (or renews its lease) but never writes one back.
- Out of the frontend's view: its ``/health`` no longer lists the worker
  (deploy/stack/frontend_instances.py). The removal reaches the frontend in ~0.04 s when idle;
  with a grace counted from the removal alone, one busy CI run saw the frontend migrate a request
  of a scale-down under load (a worker stopped while still routed to, or before its last answer
  had left: both are waited for now). (At most
  ``FRONTEND_WAIT_S``: when etcd cannot be reached its keys stay, and only the worker's own
  requests are waited for.)
- Finished: the worker's own metrics say no generate request is in flight
  (``dynamo_component_inflight_requests``) on two looks ``IDLE_S`` apart (an answer counted done
  may still be on its way to the frontend), after a grace for a request the frontend routed just
  before it stopped listing the worker, and at most ``timeout_s`` after it left routing.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import quote

import httpx

log = logging.getLogger("flywheel.drain")
GENERATE_LOAD = re.compile(
    r'^dynamo_component_inflight_requests\{[^}]*dynamo_endpoint="generate"[^}]*worker_id="([0-9a-f]+)"[^}]*\} (\d+)',
    re.M,
)
IN_TRANSIT_GRACE_S = 1.0  # a request routed just before the frontend let go reaches the worker within it
IDLE_S = 0.5  # nothing in flight for this long: the last answer has left the worker
FRONTEND_WAIT_S = 10.0  # a frontend still listing it after this (its entries could not be removed) is not waited for


def worker_load(admin_url: str) -> tuple[str, int] | None:
    """(the worker's instance id, its generate requests in flight), from its system server's
    metrics; None when it cannot say (not up, or no generate endpoint yet)."""
    try:
        text = httpx.get(f"{admin_url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    m = GENERATE_LOAD.search(text)
    return (m.group(1), int(m.group(2))) if m else None


def leave_routing(discovery_dir: Path, worker_id: str) -> int:
    """Remove worker ``worker_id``'s instance entries from file discovery; how many there were."""
    removed = 0
    suffix = quote(f"/{worker_id}", safe="")
    for entry in (discovery_dir / "v1" / "instances").glob(f"*{suffix}"):
        entry.unlink(missing_ok=True)
        removed += 1
    return removed


INSTANCES = b"v1/instances/"  # Dynamo's discovery keys, the same on every backend


def leave_etcd_routing(etcd_url: str, worker_id: str) -> int:
    """The same on etcd (its JSON gateway): delete worker ``worker_id``'s keys; how many there
    were (0 when etcd cannot be reached: the drain then waits for the worker's requests alone)."""

    def call(op: str, **fields: bytes | bool) -> dict:
        body = {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in fields.items()}
        r = httpx.post(f"{etcd_url}/v3/kv/{op}", json=body, timeout=5)
        r.raise_for_status()
        return r.json()

    end = INSTANCES[:-1] + bytes([INSTANCES[-1] + 1])
    try:
        keys = [base64.b64decode(kv["key"]) for kv in call("range", key=INSTANCES, range_end=end, keys_only=True).get("kvs", [])]
        mine = [k for k in keys if k.endswith(f"/{worker_id}".encode())]
        for key in mine:
            call("deleterange", key=key)
    except httpx.HTTPError as exc:
        log.warning("worker %s stays in routing: etcd at %s: %s", worker_id, etcd_url, exc)
        return 0
    return len(mine)


@dataclass
class _Drain:
    left_at: float
    worker_id: str | None
    unrouted_at: float | None = None  # when the frontend was first seen not listing it
    idle_since: float | None = None  # since when its metrics count nothing in flight


class Drains:
    """The workers being drained, by process name; ``step`` is called on every look."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.draining: dict[str, _Drain] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.draining

    def step(self, name: str, admin_url: str, leave: Callable[[str], int], routed: Callable[[str], bool | None]) -> bool:
        """Move worker ``name`` along its drain (``leave(worker_id)`` takes it out of routing,
        ``routed(worker_id)`` says whether the frontend still routes to it, None if it cannot say);
        True once it may be stopped."""
        now = time.monotonic()
        load = worker_load(admin_url)
        drain = self.draining.get(name)
        if drain is None:
            worker_id = load[0] if load else None
            if worker_id is not None:
                leave(worker_id)
            drain = self.draining[name] = _Drain(now, worker_id)
            log.info("%s: out of routing, draining (%s in flight)", name, load[1] if load else "?")
        if load is None or load[0] != drain.worker_id:  # gone or not answering: nothing to wait for
            done = True
        elif now - drain.left_at >= self.timeout_s:
            log.warning("%s: %d requests still in flight after %.0f s; stopping it", name, load[1], self.timeout_s)
            done = True
        else:
            # routed() None: the frontend cannot say (it is down, so it routes nothing anywhere)
            if drain.unrouted_at is None and not routed(drain.worker_id):
                drain.unrouted_at = now
            elif drain.unrouted_at is None and now - drain.left_at >= FRONTEND_WAIT_S:
                log.warning("%s: the frontend still lists it %.0f s after it left routing", name, FRONTEND_WAIT_S)
                drain.unrouted_at = now
            if load[1] > 0:
                drain.idle_since = None
            elif drain.idle_since is None:
                drain.idle_since = now
            let_go = drain.unrouted_at is not None and now - drain.unrouted_at >= IN_TRANSIT_GRACE_S
            done = let_go and drain.idle_since is not None and now - drain.idle_since >= IDLE_S
            if done:
                left_for = drain.unrouted_at - drain.left_at
                log.info("%s: drained in %.1f s (the frontend let go after %.2f s)", name, now - drain.left_at, left_for)
        if done:
            self.draining.pop(name)
        return done

    def forget(self, name: str) -> None:
        self.draining.pop(name, None)
