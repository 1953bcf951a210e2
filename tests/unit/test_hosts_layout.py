"""A multi-host profile's layout: every component on the host its role names, listening on that
host's address only, discovering over etcd in a namespace of its own graph; a layout that cannot
work is refused with what to change."""

import pytest

from deploy.stack.config import load_config
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.graphs import graph_config
from deploy.stack.launcher import components, supervisor_components, write_redis_conf
from deploy.stack.supervisor import watched_by


def _cfg(tmp_path, *overrides):
    return load_config("cluster-sim", [f"home={tmp_path}", *overrides], environ={})


def test_each_component_runs_on_its_roles_host_and_binds_that_hosts_address(tmp_path):
    cfg = _cfg(tmp_path)
    write_redis_conf(cfg)  # as `up` does first
    by_host = {h.name: h for h in cfg.hosts.hosts}
    placed = {c.name: c for c in components(cfg)}
    assert {n: c.host for n, c in placed.items()} == {
        "etcd": "control",
        "redis": "control",
        "event-broker": "control",
        "frontend": "control",
        "worker-0": "worker1",
        "worker-1": "worker2",
        "gateway": "gw1",
        "gateway-gw2": "gw2",
    }
    for comp in placed.values():
        host = by_host[comp.host]
        assert comp.address == host.address and comp.exec_prefix[-1] == f"fwbr0-{host.name}"
        assert "0.0.0.0" not in " ".join(comp.argv) and "127.0.0.1" not in " ".join(comp.argv)
        for key in ("DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_EVENT_PLANE_HOST", "DYN_SYSTEM_HOST"):
            assert comp.env.get(key, host.address) == host.address, (comp.name, key)
        if comp.health_url:
            assert comp.health_url.startswith(f"http://{host.address}:")
    worker = placed["worker-1"].env
    assert worker["DYN_DISCOVERY_BACKEND"] == "etcd" and worker["ETCD_ENDPOINTS"] == "http://10.89.0.10:2379"
    assert "tcp://10.89.0.10:" in worker["DYN_ZMQ_BROKER_URL"] and "DYN_FILE_KV" not in worker
    # two gateway replicas: one Redis, a spool each
    gateways = [placed["gateway"], placed["gateway-gw2"]]
    configs = [(tmp_path / "run" / f"{g.name}.json").read_text() for g in gateways]
    # Redis listens beyond loopback: it wants a password, kept out of its command line
    password = (tmp_path / "run" / "redis.password").read_text()
    assert all(f'"redis_url": "redis://:{password}@10.89.0.10:6390/0"' in c for c in configs)
    conf = tmp_path / "run" / "redis.conf"
    assert conf.read_text() == f"requirepass {password}\n" and conf.stat().st_mode & 0o077 == 0
    assert password not in " ".join(placed["redis"].argv) and str(conf) in placed["redis"].argv
    assert '"instance": "gateway-gw1"' in configs[0] and '"instance": "gateway-gw2"' in configs[1]


def test_a_dedicated_graph_discovers_in_a_dynamo_namespace_of_its_own(tmp_path):
    cfg = _cfg(tmp_path)
    dep = {
        "id": "dep-000000000001",
        "model_path": "/ckpt",
        "served_model": "team/x",
        "replicas": {"desired": 3},
        "lora_path": None,
    }
    graph = deployment_components(graph_config(cfg, dep, 0))
    mine = {c.env["DYN_NAMESPACE"] for c in components(cfg) if "DYN_NAMESPACE" in c.env}
    theirs = {c.env["DYN_NAMESPACE"] for c in graph if "DYN_NAMESPACE" in c.env}
    assert len(mine) == 1 and len(theirs) == 1 and mine != theirs
    assert [c.host for c in graph if c.name.startswith("worker-")] == ["worker1", "worker2", "worker1"]


def test_one_host_profiles_stay_on_loopback_with_file_discovery(tmp_path):
    cfg = load_config("sim", [f"home={tmp_path}"], environ={})
    for comp in components(cfg):
        assert comp.host is None and comp.exec_prefix == [] and comp.address == "127.0.0.1"
        assert comp.env.get("DYN_DISCOVERY_BACKEND", "file") == "file"


@pytest.mark.parametrize(
    "override, says",
    [
        ('hosts.hosts=[{"name": "a", "address": "10.89.0.10", "roles": ["worker", "gateway"]}]', "role 'control'"),
        (
            'hosts.hosts=[{"name": "a", "address": "10.89.0.10", "roles": ["control", "worker", "gateway"]},'
            ' {"name": "b", "address": "10.89.0.11", "roles": ["control"]}]',
            "exactly one host must have the role 'control' (2 have)",
        ),
        ('hosts.hosts=[{"name": "a", "address": "10.1.0.10", "roles": ["control", "worker", "gateway"]}]', "not a host address"),
        ('hosts.hosts=[{"name": "a", "address": "10.89.0.1", "roles": ["control", "worker", "gateway"]}]', "besides the bridge"),
        (
            'hosts.hosts=[{"name": "a", "address": "10.89.0.10", "roles": ["control", "worker", "gateway"]},'
            ' {"name": "a", "address": "10.89.0.11", "roles": ["worker"]}]',
            "a name and an address of its own",
        ),
        ('hosts.hosts=[{"name": "averylongname", "address": "10.89.0.10", "roles": ["control"]}]', "hosts.hosts.0.name"),
        ("hosts.bridge=toolongbridge", "hosts.bridge"),  # <bridge>-<host> names an interface: 15 bytes
    ],
)
def test_a_layout_that_cannot_work_is_refused_saying_what_to_change(tmp_path, override, says):
    with pytest.raises(ValueError) as err:
        _cfg(tmp_path, override)
    assert says in str(err.value)


def test_each_host_has_an_agent_watching_what_runs_there_and_the_stack_supervisor_watches_the_agents(tmp_path):
    cfg = _cfg(tmp_path)
    agents = supervisor_components(cfg)
    assert [(a.name, a.host) for a in agents] == [("supervisor", None)] + [
        (f"supervisor-{h.name}", h.name) for h in cfg.hosts.hosts
    ]
    for agent in agents[1:]:
        assert agent.argv[-2:] == ["--host", agent.host] and agent.exec_prefix[-1] == f"fwbr0-{agent.host}"
    # a host's agent restarts its host's components; the stack's supervisor, the agents
    assert {c.name for c in watched_by(cfg, "worker2")} == {"worker-1"}
    assert {c.name for c in watched_by(cfg, "control")} == {"etcd", "redis", "event-broker", "frontend"}
    assert [c.name for c in watched_by(cfg, None)] == [a.name for a in agents[1:]]
