"""The autoscaling policy on explicit clocks: demand must last a window before a change, a
spike shorter than the window changes nothing, nothing is proposed while a change is carried
out, and the Planner's KV signal adds a replica or holds one."""

from deploy.stack.autoscaler import Autoscaler

KNOBS = {"target_concurrency": 4, "scale_up_window_s": 10, "scale_down_delay_s": 60}


def dep(in_flight: int, desired: int = 1, status: str = "RUNNING") -> dict:
    return {
        "status": status,
        "in_flight": in_flight,
        "autoscale": KNOBS,
        "replicas": {"desired": desired, "ready": desired, "min": 1, "max": 5},
    }


def test_up_after_the_window_to_the_least_it_wanted_throughout():
    policy = Autoscaler()
    assert policy.propose(0, dep(12), []) is None  # 3 wanted, but only just
    assert policy.propose(5, dep(9), []) is None
    proposal = policy.propose(10, dep(16), [])
    assert proposal == {"replicas": 3, "signal": "concurrency", "value": 12.0, "target": 4}  # the least of 3, 3, 4


def test_a_spike_shorter_than_the_window_changes_nothing():
    policy = Autoscaler()
    for t, load in ((0, 2), (4, 40), (8, 2), (12, 2)):
        assert policy.propose(t, dep(load), []) is None


def test_down_only_after_the_delay_and_to_the_most_it_wanted_meanwhile():
    policy = Autoscaler()
    assert policy.propose(0, dep(5, desired=4), []) is None  # wants 2
    assert policy.propose(30, dep(0, desired=4), []) is None  # wants 0 (min applies at the gateway)
    assert policy.propose(59, dep(0, desired=4), []) is None
    assert policy.propose(60, dep(0, desired=4), [])["replicas"] == 2
    # demand for all four once inside the delay keeps them
    policy = Autoscaler()
    for t, load in ((0, 0), (30, 16), (60, 0)):
        assert policy.propose(t, dep(load, desired=4), []) is None


def test_nothing_while_scaling_and_the_windows_start_again_after_it():
    policy = Autoscaler()
    policy.propose(0, dep(40), [])
    assert policy.propose(20, dep(40, status="SCALING"), []) is None
    assert policy.propose(25, dep(40, desired=3), []) is None  # settled at 25: its window starts there
    assert policy.propose(35, dep(40, desired=3), [])["replicas"] == 10


def test_kv_full_adds_a_replica_and_kv_busy_holds_them():
    policy = Autoscaler()
    assert policy.propose(0, dep(1), [0.2, 1.0]) is None
    assert policy.propose(10, dep(1), [0.3, 1.0]) == {"replicas": 2, "signal": "kv_usage", "value": 1.0, "target": 1.0}
    policy = Autoscaler()
    for t in (0, 30, 60, 90):
        assert policy.propose(t, dep(0, desired=3), [0.1, 0.7]) is None


def test_idle_goes_to_zero_only_with_min_0_and_after_its_own_delay():
    def idle(desired: int, low: int) -> dict:
        d = dep(0, desired=desired)
        d["autoscale"] = {**KNOBS, "scale_to_zero_after_s": 120}
        d["replicas"]["min"] = low
        return d

    policy = Autoscaler()
    assert policy.propose(0, idle(1, 0), []) is None
    assert policy.propose(60, idle(1, 0), []) is None  # past the scale-down delay, not the zero one
    assert policy.propose(120, idle(1, 0), []) == {"replicas": 0, "signal": "idle", "value": 120, "target": 120}
    policy = Autoscaler()
    assert policy.propose(0, idle(3, 0), []) is None
    assert policy.propose(60, idle(3, 0), [])["replicas"] == 1  # down to one first
    policy = Autoscaler()
    for t in (0, 60, 120, 600):
        assert policy.propose(t, idle(1, 1), []) is None  # min 1: never to zero
