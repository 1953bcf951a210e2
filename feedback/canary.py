"""Canary releases: a candidate checkpoint serves a share of an alias's sessions beside the version
serving it now, and a controller promotes it (the alias goes to 100 % of the candidate) or rolls
it back (0 %) by itself, on the arms' online reward.

The controller reads the trace store by SQL like any client: each arm's traces since the canary
started (the ``arm`` column, serve/split.py) joined to the ``rewards`` view (the latest feedback
per trace and reward name, from the trace's own team or the admin). The test is one-sided, on the
difference of the arms' mean rewards ``d = candidate - baseline``, with the normal approximation
to Welch's standard error ``se = sqrt(var_c / n_c + var_b / n_b)`` and ``z`` the ``confidence``
quantile:

- **promote** when both arms have ``min_samples`` rewarded traces and ``d - z*se > -max_regression``
  (the candidate is no worse than the allowed regression, at that confidence);
- **roll back** when ``d + z*se < -max_regression`` (it is worse than allowed, at that confidence);
- and, as guard rails, roll back as soon as the candidate has ``min_samples`` requests and its
  error rate exceeds the baseline's by ``max_error_increase``, or its median time to first token
  is ``max_ttft_ratio`` times the baseline's; and roll back when ``max_hours`` pass undecided.

The controller looks every ``interval_s``; every look is a test, so a long canary that hovers at
the bound can cross it by chance: ``min_samples`` and ``confidence`` are the knobs against that.
Sessions are the unit the split assigns, so many turns of one session are not independent
samples; the figures count traces.

A canary is a record in the checkpoint registry (``canaries``) plus the alias's split in the
gateway's route table; both outlive any process. A controller that stops leaves the canary
holding its share; another picks it up (``flywheel checkpoint canary --resume``). Its decision is
written to the registry's lineage (the candidate's ``canary``, and the list of ``decisions``)
before the alias moves, and by one controller only.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from statistics import NormalDist
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from feedback.hotswap import HotSwap
from feedback.registry import Registry

# the outcomes that are the serving arm's fault (serve/outcome.py): a client that left, a 4xx or
# a budget refusal is not
ARM_ERRORS = ("unreachable", "timeout", "upstream_error", "malformed", "invalid_tool_call")


# how a decision reads once made, wherever it is shown
DONE = {"promote": "promoted", "rollback": "rolled back"}


class CanaryError(RuntimeError):
    pass


class CanaryPolicy(BaseModel):
    """How a canary is run and judged (``flywheel checkpoint canary``'s flags)."""

    model_config = ConfigDict(extra="forbid")

    share: float = Field(0.1, gt=0, lt=1, description="the candidate's share of sessions (or of copies, shadow)")
    shadow: bool = Field(False, description="the candidate answers copies of its share; no client sees them")
    metric: str = Field("reward", min_length=1, description="the feedback name compared")
    team: str | None = Field(None, description="judge on this team's traffic only (default: every team's)")
    min_samples: int = Field(100, ge=2, description="rewarded traces each arm needs before any reward decision")
    max_regression: float = Field(0.02, ge=0, description="how much lower the candidate's mean reward may be")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="of the one-sided bound on the difference")
    max_hours: float = Field(24.0, gt=0, description="undecided this long: rolled back")
    max_error_increase: float = Field(0.05, ge=0, description="guard rail: error rate above the baseline's")
    max_ttft_ratio: float = Field(2.0, gt=1, description="guard rail: median TTFT over the baseline's")
    interval_s: float = Field(30.0, gt=0, description="between the controller's looks")


@dataclass
class ArmEvidence:
    requests: int = 0
    errors: int = 0
    rewarded: int = 0
    mean: float | None = None
    var: float | None = None
    ttft_p50_ms: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass
class Decision:
    action: Literal["promote", "rollback", "wait"]
    reason: str
    figures: dict

    @property
    def final(self) -> bool:
        return self.action != "wait"


def evidence(
    store, alias: str, arms: tuple[str, str], since: str, metric: str, team: str | None = None
) -> dict[str, ArmEvidence]:
    """Each arm's traces on ``alias`` since ``since`` (ISO time), with their ``metric`` reward;
    ``team``'s traces only, if given."""
    store.refresh()
    errors = ", ".join(f"'{o}'" for o in ARM_ERRORS)
    rows = store.sql(
        f"""
        SELECT t.arm, count(*) AS requests, count(*) FILTER (WHERE t.outcome IN ({errors})) AS errors,
               count(r.reward) AS rewarded, avg(r.reward) AS mean, var_samp(r.reward) AS var,
               median(t.ttft_ms) AS ttft_p50_ms
        FROM traces t LEFT JOIN (SELECT trace_id, reward FROM rewards WHERE name = $1) r USING (trace_id)
        WHERE t.gen_ai_request_model = $2 AND list_contains($3, t.arm) AND t.time_received >= $4::TIMESTAMPTZ
          AND ($5::VARCHAR IS NULL OR t.team = $5)
        GROUP BY t.arm
        """,
        params=[metric, alias, list(arms), since, team],
    ).to_pylist()
    out = {a: ArmEvidence() for a in arms}
    for r in rows:
        name = r.pop("arm")
        out[name] = ArmEvidence(**r)
    return out


def decide(policy: CanaryPolicy, baseline: ArmEvidence, candidate: ArmEvidence, hours: float) -> Decision:
    """The controller's rule (module docstring), on one look's evidence."""
    z = NormalDist().inv_cdf(policy.confidence)
    figures: dict = {
        "baseline": asdict(baseline),
        "candidate": asdict(candidate),
        "hours": round(hours, 4),
        "confidence": policy.confidence,
        "max_regression": policy.max_regression,
    }
    if candidate.requests >= policy.min_samples and baseline.requests:
        excess = candidate.error_rate - baseline.error_rate
        if excess > policy.max_error_increase:
            return Decision(
                "rollback", f"error rate {candidate.error_rate:.3f} vs {baseline.error_rate:.3f} (guard rail)", figures
            )
        slow, usual = candidate.ttft_p50_ms, baseline.ttft_p50_ms
        if slow and usual and slow > policy.max_ttft_ratio * usual:
            return Decision(
                "rollback",
                f"median TTFT {slow:.0f} ms vs {usual:.0f} ms (guard rail)",
                figures,
            )
    if min(candidate.rewarded, baseline.rewarded) >= policy.min_samples:
        d = candidate.mean - baseline.mean
        se = math.sqrt((candidate.var or 0.0) / candidate.rewarded + (baseline.var or 0.0) / baseline.rewarded)
        lower, upper, floor = d - z * se, d + z * se, -policy.max_regression
        figures.update(difference=round(d, 6), stderr=round(se, 6), lower=round(lower, 6), upper=round(upper, 6))
        if lower > floor:
            return Decision("promote", f"reward difference {d:+.4f}, lower bound {lower:+.4f} > {floor:+.4f}", figures)
        if upper < floor:
            return Decision("rollback", f"reward difference {d:+.4f}, upper bound {upper:+.4f} < {floor:+.4f}", figures)
    if hours >= policy.max_hours:
        return Decision("rollback", f"no decision within {policy.max_hours:g} h", figures)
    need = policy.min_samples
    return Decision("wait", f"rewarded: baseline {baseline.rewarded}/{need}, candidate {candidate.rewarded}/{need}", figures)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class CanaryController:
    """Starts canaries, looks at them, and acts on their decisions, through ``swap`` (the gateway's
    admin API) and ``registry``; reads ``store`` (a TraceStore)."""

    def __init__(self, swap: HotSwap, registry: Registry, store, now: Callable[[], datetime] = _now):
        self.swap, self.registry, self.store, self.now = swap, registry, store, now

    def start(self, alias: str, version: str, policy: CanaryPolicy) -> dict:
        """Serve ``version`` to ``policy.share`` of ``alias``'s sessions beside what it serves now."""
        self.registry.get(version)  # an unknown version: refused before anything is written
        baseline = self.registry.current(alias)
        if version == baseline:
            raise CanaryError(f"{alias!r} already serves {version}: nothing to compare it with")
        record = {
            "alias": alias,
            "candidate": version,
            "baseline": baseline,
            "started": self.now().isoformat(),
            "policy": policy.model_dump(),
        }
        self.registry.start_canary(alias, record)  # refused while one runs: before any route moves
        try:
            self._split(record)
        except BaseException:
            self.registry.drop_canary(alias, record["started"])  # it never served: no decision
            raise
        return record

    def _split(self, record: dict) -> None:
        policy, baseline, version = CanaryPolicy.model_validate(record["policy"]), record["baseline"], record["candidate"]
        if policy.shadow:
            self.swap.split(record["alias"], {baseline: 1.0, version: policy.share}, shadow=frozenset({version}))
        else:
            self.swap.split(record["alias"], {baseline: 1 - policy.share, version: policy.share})

    def reapply(self, alias: str) -> bool:
        """Set the running canary's split on ``alias`` again (after something moved the alias, as a
        resumed loop does to reload its weights); False if none is running."""
        record = self.registry.canaries().get(alias)
        if record:
            self._split(record)
        return bool(record)

    def look(self, alias: str) -> Decision:
        """One look at ``alias``'s canary; a final decision is acted on before it is returned."""
        record = self.registry.canaries().get(alias)
        if record is None:
            raise CanaryError(f"no canary is running on {alias!r}")
        policy = CanaryPolicy.model_validate(record["policy"])
        arms = (record["baseline"], record["candidate"])
        found = evidence(self.store, alias, arms, record["started"], policy.metric, policy.team)
        hours = (self.now() - datetime.fromisoformat(record["started"])).total_seconds() / 3600
        decision = decide(policy, found[arms[0]], found[arms[1]], hours)
        if decision.final:
            self._act(record, decision)
        return decision

    def stop(self, alias: str) -> Decision:
        """Roll ``alias``'s canary back now, by hand."""
        record = self.registry.canaries().get(alias)
        if record is None:
            raise CanaryError(f"no canary is running on {alias!r}")
        decision = Decision("rollback", "stopped by hand", {})
        self._act(record, decision)
        return decision

    def _act(self, record: dict, decision: Decision) -> None:
        alias = record["alias"]
        entry = {
            "alias": alias,
            "candidate": record["candidate"],
            "baseline": record["baseline"],
            "started": record["started"],
            "decided": self.now().isoformat(),
            "action": decision.action,
            "reason": decision.reason,
            "figures": decision.figures,
            "policy": record["policy"],
        }
        if not self.registry.finish_canary(alias, record["started"], entry):
            return  # another controller decided first and moved the alias
        try:
            if decision.action == "promote":
                self.swap.deploy(alias, record["candidate"])
            else:
                self.swap.point(alias, record["baseline"])
        except BaseException:
            self.registry.restore_canary(alias, record, entry)
            raise
        self.registry.canary_moved(entry, self.now().isoformat())

    def watch(self, alias: str, on_look: Callable[[Decision], None] = lambda d: None, sleep=time.sleep) -> Decision:
        """Look every ``interval_s`` until a decision; returns it."""
        record = self.registry.canaries().get(alias)
        interval = CanaryPolicy.model_validate(record["policy"]).interval_s if record else 0
        while True:
            try:
                decision = self.look(alias)
            except CanaryError:  # decided meanwhile by another controller
                done = [d for d in self.registry.decisions() if d.get("alias") == alias]
                if not done:
                    raise
                return Decision(done[-1]["action"], done[-1]["reason"], done[-1]["figures"])
            on_look(decision)
            if decision.final:
                return decision
            sleep(interval)
