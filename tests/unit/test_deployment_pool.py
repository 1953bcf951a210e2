"""The capacity pool is exact across gateway replicas: creates racing through two replicas on one
Redis never hold more slots than the pool has. And what a replica shows of a deployment, it routes."""

import threading

from serve.admission import Admission
from serve.auth import Caller
from serve.config import CapacityPool, Deployment, GatewayConfig, ModelRoute
from serve.deployments import CreateRequest, Deployments, Observed
from serve.errors import APIError
from serve.routes import RouteTable
from serve.shared_state import SharedState


def replica(redis_url: str, model_dir, path) -> Deployments:
    cfg = GatewayConfig(
        deployments=[Deployment(name="local", url="http://127.0.0.1:9", model_path=str(model_dir))],
        models={"tiny": ModelRoute(deployment="local", upstream_model="tiny")},
        pool=CapacityPool(slots=3, serverless_slots=1),
        redis_url=redis_url,
        deployments_file=str(path),
    )
    state = SharedState(redis_url, timeout_s=5)
    return Deployments(cfg, state, RouteTable(cfg.models, state, None), Admission(cfg, state))


def test_creates_racing_through_two_replicas_take_only_the_free_slots(redis_server, tiny_model_dir, tmp_path):
    a = replica(redis_server.url, tiny_model_dir, tmp_path / "a.json")
    b = replica(redis_server.url, tiny_model_dir, tmp_path / "b.json")
    red = Caller(team="red", key_id="k", scopes=frozenset({"deployments"}))
    answers, start = [], threading.Barrier(8)

    def create(deployments: Deployments, i: int) -> None:
        start.wait()
        try:
            deployments.create(red, CreateRequest(model="tiny", name=f"n{i}"))
            answers.append("created")
        except APIError as exc:
            answers.append(exc.code)

    threads = [threading.Thread(target=create, args=(a if i % 2 else b, i)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == ["created"] * 2 + ["insufficient_capacity"] * 6, answers
    b.refresh()
    assert len(b.table) == 2 and b.pool() == {"slots": 3, "held": 3, "free": 0}


def test_a_deployment_shows_running_only_once_its_alias_routes_and_stops_routing_before_it_shows_deleting(
    redis_server, tiny_model_dir, tmp_path, monkeypatch
):
    """Writing a row takes an fsync and a Redis round trip while requests read it: a client that sees
    RUNNING and sends at once must find the alias (CI once got model_not_found just so)."""
    gw = replica(redis_server.url, tiny_model_dir, tmp_path / "a.json")
    red = Caller(team="red", key_id="k", scopes=frozenset({"deployments"}))
    dep = gw.create(red, CreateRequest(model="tiny", name="n"))
    seen, write = [], gw.table._write_file

    def look_then_write() -> None:  # what a request reads while the row is being written
        row = gw.table.get(dep.id)
        seen.append(row and (row.status, row.served_model in gw.routes))
        write()

    monkeypatch.setattr(gw.table, "_write_file", look_then_write)
    gw.observe(dep.id, Observed(ready=1, url="http://127.0.0.1:9"))
    gw.delete(red, dep.id)
    gw.observe(dep.id, Observed(ready=0, gone=True))
    assert seen == [("RUNNING", True), ("DELETING", False), None], seen
