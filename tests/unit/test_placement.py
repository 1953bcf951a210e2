"""Dedicated replicas across worker hosts: each goes where the most slots are free, keeps its host
while it is wanted or still runs, and one that fits nowhere waits instead of overfilling a host."""

from deploy.stack.config import load_config
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.graphs import graph_config
from deploy.stack.placement import load, place


def _cfg(tmp_path, worker1: int, worker2: int):
    cfg = load_config("cluster-sim", [f"home={tmp_path}"], environ={})
    cfg.hosts.hosts[1].slots, cfg.hosts.hosts[2].slots = worker1, worker2
    cfg.run_dir.mkdir(parents=True)
    return cfg


def test_replicas_go_to_the_host_with_the_most_free_slots_and_wait_when_none_fits(tmp_path):
    cfg = _cfg(tmp_path, 2, 4)  # the profile's two workers take one slot on each: 1 and 3 free
    assert place(cfg, {"worker-0-dep-a": 1, "worker-1-dep-a": 1}, set()) == {
        "worker-0-dep-a": "worker2",
        "worker-1-dep-a": "worker2",
    }
    # 1 and 1 free: a tie goes to the host running fewer workers
    assert place(cfg, {"worker-0-dep-a": 1, "worker-1-dep-a": 1, "worker-0-dep-b": 1}, set())["worker-0-dep-b"] == "worker1"
    # the last free slot taken, a fifth replica waits, and is placed once a replica is gone
    full = {"worker-0-dep-a": 1, "worker-1-dep-a": 1, "worker-0-dep-b": 1, "worker-1-dep-b": 1, "worker-2-dep-b": 1}
    placed = place(cfg, full, set())
    assert placed["worker-1-dep-b"] == "worker2" and "worker-2-dep-b" not in placed
    del full["worker-1-dep-a"]
    assert place(cfg, full, set())["worker-2-dep-b"] == "worker2"


def test_a_replica_keeps_its_host_while_wanted_or_draining(tmp_path):
    cfg = _cfg(tmp_path, 3, 4)  # 2 and 3 free
    first = place(cfg, {"worker-0-dep-a": 1, "worker-1-dep-a": 1}, set())
    assert sorted(first.values()) == ["worker1", "worker2"]  # spread
    # scaled down to one: worker-1 drains (not wanted, still running), holding its slot
    place(cfg, {"worker-0-dep-a": 1}, {"worker-0-dep-a", "worker-1-dep-a"})
    assert load(cfg.run_dir)["worker-1-dep-a"]["host"] == first["worker-1-dep-a"]
    # a replica needing two slots fits only where the draining one is not
    big = place(cfg, {"worker-0-dep-a": 1, "worker-0-dep-b": 2}, {"worker-0-dep-a", "worker-1-dep-a"})
    assert big["worker-0-dep-b"] == first["worker-0-dep-a"]
    assert big["worker-0-dep-a"] == first["worker-0-dep-a"]  # kept, though its host is now the fuller
    assert big["worker-1-dep-a"] == first["worker-1-dep-a"]  # the draining one's host, for its admin URL
    # stopped: its slot is given back
    place(cfg, {"worker-0-dep-a": 1, "worker-0-dep-b": 2}, {"worker-0-dep-a", "worker-0-dep-b"})
    assert "worker-1-dep-a" not in load(cfg.run_dir)


def test_the_pool_is_the_hosts_slots_and_a_graph_runs_where_it_was_placed(tmp_path):
    cfg = _cfg(tmp_path, 2, 5)
    assert cfg.resolved_gateway().pool.slots == 7
    dep = {"id": "dep-000000000001", "model_path": "/ckpt", "served_model": "t/x", "replicas": {"desired": 2}}
    g = graph_config(cfg, dep, 0)
    g.placement = {0: "worker2", 1: "worker2"}
    workers = [c for c in deployment_components(g) if c.name.startswith("worker-")]
    assert [(c.host, c.address) for c in workers] == [("worker2", "10.89.0.22")] * 2
    assert g.worker_admin_url(1).startswith("http://10.89.0.22:")
