"""The autoscaling policy on explicit clocks: demand must last a window before a change, a
spike shorter than the window changes nothing, nothing is proposed while a change is carried
out, the Planner's KV signal adds a replica or holds one, and so does a TTFT p90 over its target."""

from deploy.stack.autoscaler import Autoscaler, Signals, p90_ms

KNOBS = {"target_concurrency": 4, "scale_up_window_s": 10, "scale_down_delay_s": 60}
NONE = Signals()


def dep(in_flight: int, desired: int = 1, status: str = "RUNNING") -> dict:
    return {
        "status": status,
        "in_flight": in_flight,
        "autoscale": KNOBS,
        "replicas": {"desired": desired, "ready": desired, "min": 1, "max": 5},
    }


def test_up_after_the_window_to_the_least_it_wanted_throughout():
    policy = Autoscaler()
    assert policy.propose(0, dep(12), NONE) is None  # 3 wanted, but only just
    assert policy.propose(5, dep(9), NONE) is None
    proposal = policy.propose(10, dep(16), NONE)
    assert proposal == {"replicas": 3, "signal": "concurrency", "value": 12.0, "target": 4}  # the least of 3, 3, 4


def test_a_spike_shorter_than_the_window_changes_nothing():
    policy = Autoscaler()
    for t, load in ((0, 2), (4, 40), (8, 2), (12, 2)):
        assert policy.propose(t, dep(load), NONE) is None


def test_down_only_after_the_delay_and_to_the_most_it_wanted_meanwhile():
    policy = Autoscaler()
    assert policy.propose(0, dep(5, desired=4), NONE) is None  # wants 2
    assert policy.propose(30, dep(0, desired=4), NONE) is None  # wants 0 (min applies at the gateway)
    assert policy.propose(59, dep(0, desired=4), NONE) is None
    assert policy.propose(60, dep(0, desired=4), NONE)["replicas"] == 2
    # demand for all four once inside the delay keeps them
    policy = Autoscaler()
    for t, load in ((0, 0), (30, 16), (60, 0)):
        assert policy.propose(t, dep(load, desired=4), NONE) is None


def test_nothing_while_scaling_and_the_windows_start_again_after_it():
    policy = Autoscaler()
    policy.propose(0, dep(40), NONE)
    assert policy.propose(20, dep(40, status="SCALING"), NONE) is None
    assert policy.propose(25, dep(40, desired=3), NONE) is None  # settled at 25: its window starts there
    assert policy.propose(35, dep(40, desired=3), NONE)["replicas"] == 10


def test_kv_full_adds_a_replica_and_kv_busy_holds_them():
    policy = Autoscaler()
    assert policy.propose(0, dep(1), Signals(kv=[0.2, 1.0])) is None
    full = {"replicas": 2, "signal": "kv_usage", "value": 1.0, "target": 1.0}
    assert policy.propose(10, dep(1), Signals(kv=[0.3, 1.0])) == full
    policy = Autoscaler()
    for t in (0, 30, 60, 90):
        assert policy.propose(t, dep(0, desired=3), Signals(kv=[0.1, 0.7])) is None


def test_idle_goes_to_zero_only_with_min_0_and_after_its_own_delay():
    def idle(desired: int, low: int) -> dict:
        d = dep(0, desired=desired)
        d["autoscale"] = {**KNOBS, "scale_to_zero_after_s": 120}
        d["replicas"]["min"] = low
        return d

    policy = Autoscaler()
    assert policy.propose(0, idle(1, 0), NONE) is None
    assert policy.propose(60, idle(1, 0), NONE) is None  # past the scale-down delay, not the zero one
    assert policy.propose(120, idle(1, 0), NONE) == {"replicas": 0, "signal": "idle", "value": 120, "target": 120}
    policy = Autoscaler()
    assert policy.propose(0, idle(3, 0), NONE) is None
    assert policy.propose(60, idle(3, 0), NONE)["replicas"] == 1  # down to one first
    policy = Autoscaler()
    for t in (0, 60, 120, 600):
        assert policy.propose(t, idle(1, 1), NONE) is None  # min 1: never to zero


def ttft(fast: int, slow: int) -> dict[float, float]:
    """A cumulative histogram: ``fast`` requests under 0.1 s, ``slow`` ones between 1 and 2 s."""
    return {0.1: fast, 1.0: fast, 2.0: fast + slow, float("inf"): fast + slow}


def test_p90_is_over_the_requests_since_the_last_look():
    assert p90_ms({}, ttft(95, 5)) == 100.0
    assert p90_ms(ttft(95, 5), ttft(96, 25)) == 2000.0  # of the 21 since: 20 slow
    assert p90_ms(ttft(95, 5), ttft(95, 5)) is None  # none since
    assert p90_ms(ttft(95, 5), ttft(1, 0)) is None  # the frontend restarted: no reading


def test_a_ttft_p90_over_its_target_adds_a_replica_and_near_it_holds_them():
    def slo(in_flight: int, desired: int = 1) -> dict:
        d = dep(in_flight, desired=desired)
        d["autoscale"] = {**KNOBS, "ttft_p90_ms": 500}
        return d

    policy, seen = Autoscaler(), ttft(0, 0)
    for t in (0, 5, 10):  # 4 slow requests a look: p90 2000 ms, though the concurrency wants 1
        seen = {le: n + (4 if le >= 2.0 else 0) for le, n in seen.items()}
        proposal = policy.propose(t, slo(1), Signals(ttft=seen))
    assert proposal == {"replicas": 2, "signal": "ttft_p90", "value": 2000.0, "target": 500}
    policy, seen = Autoscaler(), ttft(0, 0)
    for t in (0, 30, 60, 90):  # p90 1000 ms of a 1200 ms target: above 0.8 of it, none of 3 goes
        seen = {le: n + (4 if le >= 1.0 else 0) for le, n in seen.items()}
        d = slo(0, desired=3)
        d["autoscale"]["ttft_p90_ms"] = 1200
        assert policy.propose(t, d, Signals(ttft=seen)) is None
    assert policy.propose(200, slo(0, desired=3), NONE)["replicas"] == 1  # no requests since: no reading, idle wins
