"""The autoscaling policy of one deployment (its knobs: serve/autoscale.py), asked on every look
of the supervisor; the gateway applies what it proposes within the pool.

Dynamo's own Planner (``dynamo.planner``) does not import here (it needs ``aisimulate_core``,
served only from NVIDIA's index), so this is its load-based policy for an aggregated graph,
rewritten on the signals it reads, plus the one only the gateway has:
- ``concurrency``: requests in flight for the deployment at the gateway, queued ones included
  (the gateway sees demand whole, also what a worker has not taken yet, and what it spilled to
  serverless while the deployment could not grow); it wants
  ``ceil(in flight / target_concurrency)`` replicas.
- ``kv_usage``: the Planner's signal, each worker's KV cache in use (the graph frontend's
  ``dynamo_frontend_worker_active_decode_blocks`` over ``dynamo_frontend_model_total_kv_blocks``).
  As the Planner's throughput target does, one more replica when any worker is full (>= 1.0), and
  no fewer while any is above 0.6.
- ``ttft_p90``, with the ``ttft_p90_ms`` knob (the Planner's SLA target): the 90th percentile of
  time to first token over the requests since the last look, from the graph frontend's
  ``dynamo_frontend_time_to_first_token_seconds`` histogram (so at most a bucket's upper bound).
  One more replica while it is above the target, and no fewer while it is above 0.8 of it.
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
from dataclasses import dataclass, field

import httpx

KV_FULL, KV_BUSY = 1.0, 0.6  # the Planner's throughput-target thresholds for aggregated workers
TTFT_CALM = 0.8  # of ttft_p90_ms: above it, no replica goes
ACTIVE_BLOCKS = re.compile(r'^dynamo_frontend_worker_active_decode_blocks\{[^}]*worker_id="(\d+)"[^}]*\} (\S+)', re.M)
TOTAL_BLOCKS = re.compile(r"^dynamo_frontend_model_total_kv_blocks\{[^}]*\} (\S+)", re.M)
TTFT_BUCKET = re.compile(r'^dynamo_frontend_time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)', re.M)


@dataclass
class Signals:
    """What the graph's frontend says: each routed worker's share of its KV cache in use, and
    its cumulative time-to-first-token histogram (upper bound in seconds -> requests)."""

    kv: list[float] = field(default_factory=list)
    ttft: dict[float, float] = field(default_factory=dict)


def frontend_signals(frontend_url: str) -> Signals:
    """Empty when the frontend cannot say."""
    try:
        text = httpx.get(f"{frontend_url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return Signals()
    ttft: dict[float, float] = {}
    for le, n in TTFT_BUCKET.findall(text):  # summed over the models it serves
        ttft[float(le)] = ttft.get(float(le), 0.0) + float(n)
    total = TOTAL_BLOCKS.search(text)
    if not total or float(total.group(1)) <= 0:
        return Signals(ttft=ttft)
    return Signals([float(active) / float(total.group(1)) for _, active in ACTIVE_BLOCKS.findall(text)], ttft)


def p90_ms(before: dict[float, float], now: dict[float, float]) -> float | None:
    """The 90th percentile (a bucket's upper bound, in ms) of the requests counted between two
    readings of a cumulative histogram; None when none were (or the frontend restarted)."""
    delta = {le: n - before.get(le, 0.0) for le, n in now.items()}
    total = delta.get(math.inf, 0.0)
    if total <= 0 or min(delta.values()) < 0:
        return None
    return next(le * 1000 for le in sorted(delta) if delta[le] >= 0.9 * total)


class Autoscaler:
    def __init__(self):
        self.samples: deque[tuple[float, dict]] = deque()  # (when, what was wanted and why)
        self.settled_at: float | None = None
        self.ttft_seen: dict[float, float] = {}  # the frontend's histogram at the last look

    def propose(self, now: float, dep: dict, signals: Signals) -> dict | None:
        """The replicas deployment ``dep`` (the admin's view of it: ``in_flight`` included)
        should have, with the signal behind it; None while it changes or wants what it has."""
        ttft_ms, self.ttft_seen = p90_ms(self.ttft_seen, signals.ttft), signals.ttft
        if dep["status"] != "RUNNING":  # a change is being carried out: its effect is not seen yet
            self.samples.clear()
            self.settled_at = None
            return None
        knobs, current = dep["autoscale"], dep["replicas"]["desired"]
        if self.settled_at is None:
            self.settled_at = now
        want = self._want(dep, knobs, current, signals.kv, ttft_ms)
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

    def _want(self, dep: dict, knobs: dict, current: int, kv: list[float], ttft_ms: float | None) -> dict:
        target = knobs["target_concurrency"]
        in_flight = dep.get("in_flight", 0) + dep.get("overflow_in_flight", 0)
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
        slo = knobs.get("ttft_p90_ms")
        if slo and ttft_ms is not None:
            if ttft_ms > slo and want["replicas"] <= current:
                want = {"replicas": current + 1, "signal": "ttft_p90", "value": ttft_ms, "target": slo}
            elif ttft_ms > TTFT_CALM * slo and want["replicas"] < current:
                want = {"replicas": current, "signal": "ttft_p90", "value": ttft_ms, "target": slo}
        return want

    def _over(self, now: float, window_s: float) -> list[dict]:
        """What was wanted over the last ``window_s``; empty until the deployment has been
        settled that long."""
        if now - self.settled_at < window_s:
            return []
        return [w for t, w in self.samples if t >= now - window_s]
