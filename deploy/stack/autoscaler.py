"""The autoscaling policy of one deployment (its knobs: serve/autoscale.py), asked on every look
of the supervisor; the gateway applies what it proposes within the pool.

Dynamo's own Planner (``dynamo.planner``) does not import here (it needs ``aisimulate_core``,
served only from NVIDIA's index), so this is its load-based policy for an aggregated graph,
rewritten on the signals it reads, plus the one only the gateway has:
- ``concurrency``: requests in flight for the deployment at the gateway, queued ones included
  (the gateway sees demand whole, also what a worker has not taken yet); it wants
  ``ceil(in flight / target_concurrency)`` replicas.
- ``kv_usage``: the Planner's signal, each worker's KV cache in use (the graph frontend's
  ``dynamo_frontend_worker_active_decode_blocks`` over ``dynamo_frontend_model_total_kv_blocks``).
  As the Planner's throughput target does, one more replica when any worker is full (>= 1.0), and
  no fewer while any is above 0.6.
Stabilisation, as Knative's and Kubernetes HPA's windows: up to the lowest want seen over
``scale_up_window_s``, down to the highest want seen over ``scale_down_delay_s``, each window
counted from when the deployment last settled; nothing while a change is being carried out
(the Planner's "scaling in progress, observing only"). The last replica goes (``min`` 0) only
after ``scale_to_zero_after_s`` idle; a request then wakes the deployment at the gateway
(serve/wake.py), which sees demand when no worker is left to.
"""

from __future__ import annotations

import math
import re
from collections import deque

import httpx

KV_FULL, KV_BUSY = 1.0, 0.6  # the Planner's throughput-target thresholds for aggregated workers
ACTIVE_BLOCKS = re.compile(r'^dynamo_frontend_worker_active_decode_blocks\{[^}]*worker_id="(\d+)"[^}]*\} (\S+)', re.M)
TOTAL_BLOCKS = re.compile(r"^dynamo_frontend_model_total_kv_blocks\{[^}]*\} (\S+)", re.M)


def kv_usage(frontend_url: str) -> list[float]:
    """Each routed worker's share of its KV cache in use; empty when the frontend cannot say."""
    try:
        text = httpx.get(f"{frontend_url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return []
    total = TOTAL_BLOCKS.search(text)
    if not total or float(total.group(1)) <= 0:
        return []
    return [float(active) / float(total.group(1)) for _, active in ACTIVE_BLOCKS.findall(text)]


class Autoscaler:
    def __init__(self):
        self.samples: deque[tuple[float, dict]] = deque()  # (when, what was wanted and why)
        self.settled_at: float | None = None

    def propose(self, now: float, dep: dict, kv: list[float]) -> dict | None:
        """The replicas deployment ``dep`` (the admin's view of it: ``in_flight`` included)
        should have, with the signal behind it; None while it changes or wants what it has."""
        if dep["status"] != "RUNNING":  # a change is being carried out: its effect is not seen yet
            self.samples.clear()
            self.settled_at = None
            return None
        knobs, current = dep["autoscale"], dep["replicas"]["desired"]
        if self.settled_at is None:
            self.settled_at = now
        want = self._want(dep, knobs["target_concurrency"], current, kv)
        self.samples.append((now, want))
        longest = max(knobs["scale_up_window_s"], knobs["scale_down_delay_s"], knobs.get("scale_to_zero_after_s", 0))
        while self.samples and self.samples[0][0] < now - longest:
            self.samples.popleft()
        if want["replicas"] > current:
            seen = self._over(now, knobs["scale_up_window_s"])
            if seen and all(w["replicas"] > current for w in seen):
                return min(seen, key=lambda w: w["replicas"])
        elif want["replicas"] < current:
            seen = self._over(now, knobs["scale_down_delay_s"])
            if seen and all(w["replicas"] < current for w in seen):
                most = max(seen, key=lambda w: w["replicas"])
                return most if most["replicas"] > 0 else self._to_zero(now, dep, current, most)
        return None

    def _to_zero(self, now: float, dep: dict, current: int, idle: dict) -> dict | None:
        """Idle over the scale-down delay: to zero once idle ``scale_to_zero_after_s`` as well
        (with min 0), else down to one."""
        after = dep["autoscale"].get("scale_to_zero_after_s")
        if dep["replicas"].get("min") == 0 and after is not None:
            seen = self._over(now, after)
            if seen and all(w["replicas"] == 0 for w in seen):
                return {"replicas": 0, "signal": "idle", "value": after, "target": after}
        return {**idle, "replicas": 1} if current > 1 else None

    def _want(self, dep: dict, target: float, current: int, kv: list[float]) -> dict:
        in_flight = dep.get("in_flight", 0)
        want = {
            "replicas": math.ceil(in_flight / target),
            "signal": "concurrency",
            "value": in_flight / max(1, dep["replicas"]["ready"]),
            "target": target,
        }
        fullest = max(kv, default=0.0)
        if fullest >= KV_FULL and want["replicas"] <= current:
            want = {"replicas": current + 1, "signal": "kv_usage", "value": fullest, "target": KV_FULL}
        elif fullest > KV_BUSY and want["replicas"] < current:
            want = {"replicas": current, "signal": "kv_usage", "value": fullest, "target": KV_BUSY}
        return want

    def _over(self, now: float, window_s: float) -> list[dict]:
        """What was wanted over the last ``window_s``; empty until the deployment has been
        settled that long."""
        if now - self.settled_at < window_s:
            return []
        return [w for t, w in self.samples if t >= now - window_s]
