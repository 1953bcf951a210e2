"""The canary controller's rule on explicit evidence, its evidence read by SQL from a real store,
and its record in the registry: one canary per alias, decided once, the decision in the lineage."""

from datetime import datetime, timedelta, timezone

import pytest

from feedback.canary import ArmEvidence, CanaryController, CanaryPolicy, decide, evidence
from feedback.registry import CanaryRunning, Registry
from traces.feedback import write_feedback
from traces.store import TraceStore
from traces.writer import TraceWriter

POLICY = CanaryPolicy(min_samples=50, max_regression=0.02, confidence=0.95, max_hours=24)


def arm(n: int, mean: float, var: float = 0.25, requests: int | None = None, errors: int = 0, ttft: float = 50.0):
    return ArmEvidence(requests=requests or n, errors=errors, rewarded=n, mean=mean, var=var, ttft_p50_ms=ttft)


def test_a_clearly_better_candidate_is_promoted_with_its_bound():
    d = decide(POLICY, arm(400, 0.30), arm(50, 0.70), hours=0.1)
    assert d.action == "promote"
    # d = 0.4, se = sqrt(.25/50 + .25/400) = 0.075, z = 1.645: lower = 0.2766
    assert d.figures["difference"] == pytest.approx(0.4) and d.figures["lower"] == pytest.approx(0.2766, abs=1e-3)


def test_a_clearly_worse_candidate_is_rolled_back_with_its_bound():
    d = decide(POLICY, arm(400, 0.70), arm(50, 0.30), hours=0.1)
    assert d.action == "rollback" and d.figures["upper"] == pytest.approx(-0.2766, abs=1e-3)


def test_a_large_difference_on_too_few_samples_waits():
    assert decide(POLICY, arm(400, 0.0, 0.0), arm(49, 1.0, 0.0), hours=0.1).action == "wait"
    assert decide(POLICY, arm(49, 1.0, 0.0), arm(400, 0.0, 0.0), hours=0.1).action == "wait"


def test_a_difference_inside_the_noise_waits_then_rolls_back_at_max_hours():
    # d = -0.03, se = 0.075: the bounds straddle -0.02 on both sides
    assert decide(POLICY, arm(400, 0.50), arm(50, 0.47), hours=1).action == "wait"
    late = decide(POLICY, arm(400, 0.50), arm(50, 0.47), hours=24)
    assert late.action == "rollback" and "24 h" in late.reason


def test_a_slightly_worse_candidate_within_the_allowed_regression_is_promoted():
    d = decide(POLICY, arm(20_000, 0.500, 0.01), arm(20_000, 0.495, 0.01), hours=1)
    assert d.action == "promote" and -0.02 < d.figures["lower"] < 0


def test_the_guard_rails_roll_back_a_candidate_that_errs_or_is_slow_whatever_its_reward():
    failing = decide(POLICY, arm(400, 0.3, errors=4), arm(50, 0.9, errors=5), hours=0.1)  # 10 % vs 1 %
    assert failing.action == "rollback" and "error rate" in failing.reason
    slow = decide(POLICY, arm(400, 0.3, ttft=50), arm(50, 0.9, ttft=101), hours=0.1)
    assert slow.action == "rollback" and "TTFT" in slow.reason
    # guard rails wait for min_samples requests too: two errors in three is no evidence yet
    assert decide(POLICY, arm(400, 0.3), arm(3, 0.9, requests=3, errors=2), hours=0.1).action == "wait"


@pytest.mark.parametrize(
    "bad", [{"share": 0}, {"share": 1}, {"min_samples": 1}, {"confidence": 0.4}, {"max_regression": -0.1}, {"typo": 1}]
)
def test_a_bad_policy_is_refused(bad):
    with pytest.raises(ValueError):
        CanaryPolicy(**bad)


def test_evidence_counts_each_arms_traces_since_the_start_with_their_own_teams_rewards(tmp_path):
    started = datetime(2026, 12, 4, 12, tzinfo=timezone.utc)
    writer = TraceWriter(tmp_path, "gw")
    rows = [  # (trace id, alias, arm, team, received, outcome, ttft)
        ("b1", "tiny", "v1", "red", started + timedelta(minutes=1), "ok", 40.0),
        ("b2", "tiny", "v1", "red", started + timedelta(minutes=2), "ok", 60.0),
        ("b3", "tiny", "v1", "red", started + timedelta(minutes=3), "ok", 50.0),  # never rewarded
        ("c1", "tiny", "v2", "red", started + timedelta(minutes=1), "ok", 90.0),
        ("c2", "tiny", "v2", "blue", started + timedelta(minutes=2), "upstream_error", None),
        ("c3", "tiny", "v2", "red", started + timedelta(minutes=3), "client_gone", 70.0),  # not the arm's fault
        ("old", "tiny", "v2", "red", started - timedelta(minutes=1), "ok", 10.0),  # before the canary
        ("other", "other", "v2", "red", started + timedelta(minutes=1), "ok", 10.0),  # another alias
    ]
    for tid, alias, arm_name, team, at, outcome, ttft in rows:
        writer.write(
            {
                "trace_id": tid,
                "team": team,
                "gen_ai_request_model": alias,
                "arm": arm_name,
                "time_received": at,
                "outcome": outcome,
                "ttft_ms": ttft,
                "http_status": 200,
                "prompt_token_ids": [1],
                "completion_token_ids": [2],
            }
        )
    writer.close()
    write_feedback(
        tmp_path,
        [
            {"trace_id": "b1", "team": "red", "name": "reward", "reward": 0.0},
            {"trace_id": "b2", "team": "red", "name": "reward", "reward": 1.0},
            {"trace_id": "c1", "team": "red", "name": "reward", "reward": 0.2},
            {"trace_id": "c1", "team": "red", "name": "reward", "reward": 1.0},  # the latest counts
            {"trace_id": "c3", "team": "blue", "name": "reward", "reward": -9.0},  # another team's trace
            {"trace_id": "c3", "team": "red", "name": "format", "reward": -9.0},  # another metric
            {"trace_id": "old", "team": "red", "name": "reward", "reward": -9.0},
            {"trace_id": "other", "team": "red", "name": "reward", "reward": -9.0},
        ],
    )
    found = evidence(TraceStore(tmp_path), "tiny", ("v1", "v2"), started.isoformat(), "reward")
    assert found["v1"] == ArmEvidence(requests=3, errors=0, rewarded=2, mean=0.5, var=0.5, ttft_p50_ms=50.0)
    assert found["v2"] == ArmEvidence(requests=3, errors=1, rewarded=1, mean=1.0, var=None, ttft_p50_ms=80.0)
    red = evidence(TraceStore(tmp_path), "tiny", ("v1", "v2"), started.isoformat(), "reward", team="red")
    assert red["v2"] == ArmEvidence(requests=2, errors=0, rewarded=1, mean=1.0, var=None, ttft_p50_ms=80.0)


def test_one_canary_per_alias_decided_once_and_recorded_in_the_lineage(tmp_path):
    (tmp_path / "v2").mkdir()
    registry = Registry(tmp_path / "checkpoints.json")
    registry.register("v2", "lora", tmp_path / "v2", "tiny")
    record = {"alias": "tiny", "candidate": "v2", "baseline": "base", "started": "2026-12-04T12:00:00+00:00"}
    registry.start_canary("tiny", record)
    with pytest.raises(CanaryRunning, match="already has a canary running: v2"):
        registry.start_canary("tiny", {**record, "started": "later"})
    reopened = Registry(tmp_path / "checkpoints.json")  # a restarted controller finds it
    assert reopened.canaries() == {"tiny": record}
    decision = {"alias": "tiny", "candidate": "v2", "action": "promote", "figures": {"lower": 0.1}}
    assert reopened.finish_canary("tiny", record["started"], decision)
    assert not registry.finish_canary("tiny", record["started"], decision)  # a second controller does nothing
    assert registry.canaries() == {} and registry.decisions() == [decision]
    assert registry.get("v2").canary == decision
    registry.start_canary("tiny", {**record, "started": "again"})  # the alias is free again


class RouteMovesSeen:
    """Stands in for the gateway's admin API (feedback/hotswap.py): records, at each move of an
    alias, what the registry held then."""

    def __init__(self, registry: Registry):
        self.registry, self.moves = registry, []

    def split(self, alias, weights, shadow=frozenset()):
        pass

    def point(self, alias, version):
        self.moves.append((alias, version, self.registry.decisions()))


def test_a_decision_is_recorded_before_the_alias_moves_and_says_when_it_moved(tmp_path):
    (tmp_path / "v2").mkdir()
    registry = Registry(tmp_path / "checkpoints.json")
    registry.register("v2", "lora", tmp_path / "v2", "tiny")
    clock = iter(datetime(2026, 12, 7, 12, 0, s, tzinfo=timezone.utc) for s in range(60))
    swap = RouteMovesSeen(registry)
    controller = CanaryController(swap, registry, store=None, now=lambda: next(clock))
    controller.start("tiny", "v2", CanaryPolicy())
    controller.stop("tiny")
    ((alias, version, seen),) = swap.moves
    assert (alias, version) == ("tiny", "base")
    assert [d["action"] for d in seen] == ["rollback"] and "moved" not in seen[0]  # decided, not moved yet
    decision = registry.get("v2").canary
    assert registry.decisions() == [decision] and decision["decided"] < decision["moved"]
    assert {k: v for k, v in decision.items() if k != "moved"} == seen[0]
