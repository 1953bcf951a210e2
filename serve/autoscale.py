"""A dedicated deployment's autoscaling: its knobs (in the API), what the supervisor's policy
proposes (deploy/stack/autoscaler.py decides, from the signals it reads), and the decisions the
gateway took on those proposals, kept on the deployment so that `flywheel deployments get` shows
why it has the replicas it has.

The gateway, not the policy, applies a proposal: it alone knows the pool, so a scale-up that
does not fit waits (a decision with ``applied`` false saying what is free) and goes ahead at a
later report once slots are free; it never takes slots another deployment holds.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field, model_validator

from serve.config import StrictModel

DECISIONS_KEPT = 10


class ReplicaRange(StrictModel):
    min: int = Field(ge=0, description="fewest replicas; 0: scaled to zero when idle, woken by a request")
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class Autoscale(StrictModel):
    """The knobs, named as Fireworks, Baseten and Modal name theirs; defaults in README."""

    target_concurrency: float = Field(
        4, gt=0, description="requests in flight per replica (at the gateway, queued ones too) to scale towards"
    )
    ttft_p90_ms: float | None = Field(
        None, gt=0, description="a latency target too: one more replica while the p90 time to first token is above it"
    )
    scale_up_window_s: float = Field(10, ge=0, description="demand must stay above the replicas this long before a scale-up")
    scale_down_delay_s: float = Field(120, ge=0, description="demand must stay below the replicas this long before a scale-down")
    scale_to_zero_after_s: float = Field(300, ge=0, description="with min 0: idle this long, the last replica stops")
    cold_start_timeout_s: float = Field(
        300, gt=0, description="with min 0: how long a request waits for a replica to start before a 503"
    )


class Proposal(StrictModel):
    """What the supervisor's policy wants, and the signal that made it want it."""

    replicas: int = Field(ge=0)
    signal: str = Field(
        description="concurrency (gateway requests in flight), kv_usage (the workers' KV cache), ttft_p90 (time "
        "to first token over ttft_p90_ms), idle (to zero), "
        "wake (a request for a deployment at zero)"
    )
    value: float
    target: float


class Decision(BaseModel):
    at: float
    replicas_from: int
    replicas_to: int
    signal: str
    value: float
    target: float
    applied: bool
    reason: str = Field(description="scale_up, scale_down, or why it waits")


def decide(dep, proposal: Proposal, free_slots: int) -> Decision | None:
    """The decision on ``proposal`` for ``dep`` (a DedicatedDeployment); None when it changes
    nothing. Applies it to ``dep`` (desired replicas, status, scale events) when it fits."""
    r = dep.replicas
    low = r.min if r.min is not None else 1
    want = min(max(proposal.replicas, low), r.max if r.max is not None else r.desired)
    if want == r.desired:
        return None
    direction = "scale_up" if want > r.desired else "scale_down"
    more = (r.held_at(want) - r.held) * dep.slots_per_replica
    made = Decision(
        at=time.time(),
        replicas_from=r.desired,
        replicas_to=want,
        signal=proposal.signal,
        value=round(proposal.value, 3),
        target=proposal.target,
        applied=more <= free_slots,
        reason=direction if more <= free_slots else f"waiting for capacity: needs {more} slot(s), {free_slots} free",
    )
    last = dep.decisions[-1] if dep.decisions else None
    if not made.applied and last is not None and not last.applied and last.replicas_to == want:
        return None  # still waiting, already said
    if made.applied:
        r.desired = want
        if dep.status == "RUNNING":
            dep.status = "SCALING"
        key = f"{'up' if direction == 'scale_up' else 'down'}:{proposal.signal}"
        dep.scale_events[key] = dep.scale_events.get(key, 0) + 1
    dep.decisions = [*dep.decisions, made][-DECISIONS_KEPT:]
    return made
