"""/v1/deployments without processes: the gateway's side of dedicated deployments (who may do
what, what another team sees, the supervisor's reports moving the status and charging replica
time, the usage page), on a TestClient; the processes are tests/integration/test_deployments.py's."""

import json
import re
import shutil
import threading
import time
from contextlib import contextmanager

import pytest

from serve.config import AdmissionConfig, CapacityPool, Price
from serve.keys import KeyStore
from tests.unit.conftest import seeded_gateway

PRICE = 3600.0  # a dollar a replica-second


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_a_dedicated_deployment_through_its_life_as_the_gateway_sees_it(tmp_path, tiny_model_dir):
    ckpt = tmp_path / "red-v1"
    shutil.copytree(tiny_model_dir, ckpt)
    registry = {
        "checkpoints": {
            "red-v1": {"version": "red-v1", "kind": "full", "path": str(ckpt), "base_model": str(tiny_model_dir), "team": "red"}
        }
    }
    (tmp_path / "checkpoints.json").write_text(json.dumps(registry))
    config = dict(
        checkpoints_file=str(tmp_path / "checkpoints.json"),
        deployments_file=str(tmp_path / "deployments.json"),
        prices={"red-v1": Price(replica_hour_usd=PRICE)},
        pool=CapacityPool(slots=4),
    )
    with seeded_gateway(tmp_path, **config) as (client, keys):
        store = KeyStore(tmp_path / "keys.json")
        red_ops, blue_ops = (bearer(store.create(team, scopes=["inference", "deployments"])[1]) for team in ("red", "blue"))
        admin = bearer(keys["admin"])
        r = client.post("/v1/deployments", json={"model": "red-v1"}, headers=bearer(keys["red"]))
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope", r.text
        assert client.post("/v1/deployments", json={"model": "red-v1"}, headers=blue_ops).status_code == 404
        r = client.post("/v1/deployments", json={"model": "red-v1", "replicas": 2}, headers=red_ops)
        assert r.status_code == 202, r.text
        dep = r.json()
        assert (dep["status"], dep["served_model"]) == ("DEPLOYING", "red/red-v1")
        assert dep["replicas"] == {"desired": 2, "ready": 0, "draining": 0, "min": None, "max": None}
        again = client.post("/v1/deployments", json={"model": "red-v1"}, headers=red_ops)
        assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"  # the same name twice
        # not routable before it runs; the supervisor's report makes it so, for red alone
        assert "red/red-v1" not in [m["id"] for m in client.get("/v1/models", headers=red_ops).json()["data"]]
        report = {"ready": 2, "url": "http://127.0.0.1:9", "admin_urls": [], "max_model_len": 2048}
        assert client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=red_ops).status_code == 401
        assert client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=admin).json()["status"] == "RUNNING"
        assert "red/red-v1" in [m["id"] for m in client.get("/v1/models", headers=red_ops).json()["data"]]
        assert "red/red-v1" not in [m["id"] for m in client.get("/v1/models", headers=blue_ops).json()["data"]]
        assert client.get(f"/v1/deployments/{dep['id']}", headers=blue_ops).status_code == 404
        # a replica lost: SCALING until it is back; replica time charged at each report
        assert (
            client.post(f"/admin/deployments/{dep['id']}/observed", json={**report, "ready": 1}, headers=admin).json()["status"]
            == "SCALING"
        )
        client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=admin)
        got = client.get(f"/v1/deployments/{dep['id']}", headers=red_ops).json()
        assert got["status"] == "RUNNING" and got["replica_seconds"] > 0
        assert got["cost_usd"] == got["replica_seconds"] * PRICE / 3600
        usage = client.get("/v1/usage", headers=red_ops).json()
        assert usage["dedicated"]["usd"] == pytest.approx(got["cost_usd"], abs=2e-6)  # whole micro-dollars
        assert usage["serverless_usd"] == 0
        # the usage page shows it to red, not to blue
        for team, shown in (("red", True), ("blue", False)):
            client.cookies.clear()
            client.post("/ui/login", data={"key": keys[team], "next": "/ui/usage"})
            page = client.get("/ui/usage").text
            assert (dep["id"] in page) == shown, team
            assert bool(re.search(r"Replica-hours", page))
        # scale-down: the replica scaled away drains; its slot stays held until it has stopped
        held = client.get("/v1/deployments", headers=red_ops).json()["capacity"]["held"]
        assert client.post(f"/v1/deployments/{dep['id']}/scale", json={"replicas": 1}, headers=red_ops).status_code == 202
        seen = client.post(f"/admin/deployments/{dep['id']}/observed", json={**report, "ready": 1, "draining": 1}, headers=admin)
        assert seen.json()["status"] == "SCALING"
        got = client.get(f"/v1/deployments/{dep['id']}", headers=red_ops).json()
        assert got["replicas"] == {"desired": 1, "ready": 1, "draining": 1, "min": None, "max": None}
        assert client.get("/v1/deployments", headers=red_ops).json()["capacity"]["held"] == held
        seen = client.post(f"/admin/deployments/{dep['id']}/observed", json={**report, "ready": 1}, headers=admin)
        assert seen.json()["status"] == "RUNNING"
        assert client.get("/v1/deployments", headers=red_ops).json()["capacity"]["held"] == held - 1
        # the usage page plots its replicas over time: a step at each change (desired, ready)
        client.cookies.clear()
        client.post("/ui/login", data={"key": keys["red"], "next": "/ui/usage"})
        page = client.get("/ui/usage").text
        plot = re.search(rf'data-deployment="{dep["id"]}">.*?class="ready"[^>]*points="([^"]*)"', page, re.S)
        heights = [float(p.split(",")[1]) for p in plot.group(1).split()]
        steps = [h for i, h in enumerate(heights) if i == 0 or h != heights[i - 1]]
        assert steps == [160.0, 0.0, 80.0, 0.0, 80.0], heights  # ready 0, 2, 1 (lost), 2, then 1 (scaled down); y down
        # delete: out of routing at once; gone once the supervisor says its graph stopped
        assert client.delete(f"/v1/deployments/{dep['id']}", headers=red_ops).json()["status"] == "DELETING"
        assert "red/red-v1" not in [m["id"] for m in client.get("/v1/models", headers=red_ops).json()["data"]]
        r = client.post(f"/v1/deployments/{dep['id']}/scale", json={"replicas": 3}, headers=red_ops)
        assert r.status_code == 409, r.text
        client.post(f"/admin/deployments/{dep['id']}/observed", json={"ready": 0, "gone": True}, headers=admin)
        assert client.get(f"/v1/deployments/{dep['id']}", headers=red_ops).status_code == 404
        assert json.loads((tmp_path / "deployments.json").read_text()) == {}


@contextmanager
def pooled_gateway(tmp_path, tiny_model_dir, slots: int, **config):
    """A gateway with checkpoint v1 (the base weights) and a pool of ``slots``, 1 of them serverless."""
    registry = {"checkpoints": {"v1": {"version": "v1", "kind": "full", "path": str(tiny_model_dir), "base_model": "x"}}}
    (tmp_path / "checkpoints.json").write_text(json.dumps(registry))
    with seeded_gateway(
        tmp_path,
        checkpoints_file=str(tmp_path / "checkpoints.json"),
        deployments_file=str(tmp_path / "deployments.json"),
        pool=CapacityPool(slots=slots, serverless_slots=1),
        **config,
    ) as gateway:
        yield gateway


def test_autoscaled_the_gateway_applies_proposals_within_the_pool_and_says_why(tmp_path, tiny_model_dir):
    with pooled_gateway(tmp_path, tiny_model_dir, slots=4) as (client, keys):
        admin = bearer(keys["admin"])
        for body in (
            {"model": "v1", "replicas": {"min": 3, "max": 2}},
            {"model": "v1", "replicas": {"min": 0, "max": 0}},
            {"model": "v1", "replicas": {"min": -1, "max": 2}},
            {"model": "v1", "replicas": {"min": 1, "max": 10_000}},
            {"model": "v1", "replicas": 2, "autoscale": {"target_concurrency": 2}},
            {"model": "v1", "replicas": {"min": 1, "max": 2}, "autoscale": {"target_concurrency": 0}},
            {"model": "v1", "replicas": {"min": 1, "max": 2}, "autoscale": {"ttl": 1}},
        ):
            r = client.post("/v1/deployments", json=body, headers=admin)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (body, r.text)
        auto = client.post(
            "/v1/deployments",
            json={"model": "v1", "name": "auto", "replicas": {"min": 1, "max": 3}, "autoscale": {"target_concurrency": 2}},
            headers=admin,
        ).json()
        assert auto["replicas"] == {"desired": 1, "ready": 0, "draining": 0, "min": 1, "max": 3}
        assert auto["autoscale"]["target_concurrency"] == 2 and auto["autoscale"]["scale_down_delay_s"] > 0
        other = client.post("/v1/deployments", json={"model": "v1", "name": "other", "replicas": 2}, headers=admin).json()
        report = {"ready": 1, "url": "http://127.0.0.1:9", "admin_urls": [], "max_model_len": 2048}

        def observe(dep_id, ready, wants=None):
            proposal = None if wants is None else {"replicas": wants, "signal": "concurrency", "value": 5.0, "target": 2.0}
            seen = {**report, "ready": ready, "autoscale": proposal}
            client.post(f"/admin/deployments/{dep_id}/observed", json=seen, headers=admin)
            return client.get(f"/v1/deployments/{dep_id}", headers=admin).json()

        observe(other["id"], 2)
        assert observe(auto["id"], 1)["status"] == "RUNNING"
        # 1 serverless + 2 other + 1 auto: the pool (4) is full; a scale-up waits and says so, once
        waiting = observe(auto["id"], 1, wants=5)
        waiting = observe(auto["id"], 1, wants=5)
        assert waiting["replicas"]["desired"] == 1 and waiting["status"] == "RUNNING"
        (decision,) = waiting["decisions"]
        assert not decision["applied"] and decision["replicas_to"] == 3  # clamped to max
        assert decision["reason"].startswith("waiting for capacity: needs 2 slot(s), 0 free")
        # another deployment's slots are never taken: a delete frees them, and the scale-up goes ahead
        client.delete(f"/v1/deployments/{other['id']}", headers=admin)
        client.post(f"/admin/deployments/{other['id']}/observed", json={"ready": 0, "gone": True}, headers=admin)
        scaled = observe(auto["id"], 1, wants=5)
        assert (scaled["status"], scaled["replicas"]["desired"]) == ("SCALING", 3)
        assert scaled["decisions"][-1] | {"at": 0} == {
            "at": 0,
            "replicas_from": 1,
            "replicas_to": 3,
            "signal": "concurrency",
            "value": 5.0,
            "target": 2.0,
            "applied": True,
            "reason": "scale_up",
        }
        assert observe(auto["id"], 3)["status"] == "RUNNING"
        down = observe(auto["id"], 3, wants=0)  # idle: down to min, never below
        assert down["replicas"]["desired"] == 1 and down["decisions"][-1]["reason"] == "scale_down"
        metrics = client.get("/metrics", headers=admin).text
        assert f'flywheel_deployment_replicas{{deployment="{auto["id"]}",state="max"}} 3.0' in metrics
        assert f'flywheel_scale_events_total{{deployment="{auto["id"]}",direction="up",reason="concurrency"}} 1.0' in metrics
        # a fixed count ends autoscaling; a range again brings the count inside it
        fixed = client.post(f"/v1/deployments/{auto['id']}/scale", json={"replicas": 2}, headers=admin).json()
        assert fixed["autoscale"] is None and fixed["replicas"]["min"] is None
        ranged = client.post(f"/v1/deployments/{auto['id']}/scale", json={"replicas": {"min": 3, "max": 3}}, headers=admin)
        assert ranged.json()["replicas"]["desired"] == 3 and ranged.json()["autoscale"]["target_concurrency"] == 4


def test_a_request_for_a_deployment_at_zero_waits_for_a_replica_then_gets_503_starting(tmp_path, tiny_model_dir):
    with pooled_gateway(tmp_path, tiny_model_dir, slots=2) as (client, keys):
        admin = bearer(keys["admin"])
        knobs = {"scale_to_zero_after_s": 0, "cold_start_timeout_s": 0.5}
        dep = client.post(
            "/v1/deployments",
            json={"model": "v1", "name": "sleepy", "replicas": {"min": 0, "max": 1}, "autoscale": knobs},
            headers=admin,
        ).json()
        assert dep["replicas"]["desired"] == 1  # it starts with one all the same
        report = {"ready": 1, "url": "http://127.0.0.1:9", "admin_urls": [], "max_model_len": 2048}
        client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=admin)
        idle = {"replicas": 0, "signal": "idle", "value": 0, "target": 0}
        client.post(f"/admin/deployments/{dep['id']}/observed", json={**report, "autoscale": idle}, headers=admin)
        client.post(f"/admin/deployments/{dep['id']}/observed", json={**report, "ready": 0}, headers=admin)
        asleep = client.get(f"/v1/deployments/{dep['id']}", headers=admin).json()
        assert (asleep["status"], asleep["replicas"]["desired"]) == ("RUNNING", 0)
        # the pool fills meanwhile: the wake waits for a slot, then says it is starting
        filler = client.post("/v1/deployments", json={"model": "v1", "name": "filler"}, headers=admin).json()
        chat = {"model": "admin/sleepy", "messages": [{"role": "user", "content": "wake up"}]}
        r = client.post("/v1/chat/completions", json=chat, headers=admin)
        assert r.status_code == 503 and r.json()["error"]["code"] == "deployment_starting", r.text
        assert r.headers["Retry-After"] == "10" and "waiting for capacity" in r.json()["error"]["message"]
        woke = client.get(f"/v1/deployments/{dep['id']}", headers=admin).json()
        assert woke["replicas"]["desired"] == 0 and woke["decisions"][-1]["signal"] == "wake"
        assert not woke["decisions"][-1]["applied"]
        # with a slot free, the next request's wake asks for the replica
        client.delete(f"/v1/deployments/{filler['id']}", headers=admin)
        client.post(f"/admin/deployments/{filler['id']}/observed", json={"ready": 0, "gone": True}, headers=admin)
        r = client.post("/v1/chat/completions", json=chat, headers=admin)
        assert r.status_code == 503  # nothing starts a worker in this test: it times out again
        woke = client.get(f"/v1/deployments/{dep['id']}", headers=admin).json()
        assert (woke["status"], woke["replicas"]["desired"]) == ("SCALING", 1)
        assert woke["decisions"][-1]["applied"] and woke["decisions"][-1]["reason"] == "scale_up"


def test_a_request_waiting_for_a_wake_keeps_its_lease_past_the_ttl(tmp_path, tiny_model_dir):
    """Its lease is how the policy sees demand, and how a delete drains: it must not lapse while
    a replica starts (a vLLM-CPU worker takes ~40 s; the TTL is 10 s, here 0.5 s)."""
    with pooled_gateway(tmp_path, tiny_model_dir, slots=2, admission=AdmissionConfig(lease_ttl_s=0.5)) as (client, keys):
        admin = bearer(keys["admin"])
        knobs = {"scale_to_zero_after_s": 0, "cold_start_timeout_s": 4}
        body = {"model": "v1", "name": "sleepy", "replicas": {"min": 0, "max": 1}, "autoscale": knobs}
        dep = client.post("/v1/deployments", json=body, headers=admin).json()
        report = {"ready": 1, "url": "http://127.0.0.1:9", "admin_urls": [], "max_model_len": 2048}
        idle = {"replicas": 0, "signal": "idle", "value": 0, "target": 0}
        for seen in (report, {**report, "autoscale": idle}, {**report, "ready": 0}):
            client.post(f"/admin/deployments/{dep['id']}/observed", json=seen, headers=admin)
        client.post("/v1/deployments", json={"model": "v1", "name": "filler"}, headers=admin)  # the wake must wait
        answer = []
        chat = {"model": "admin/sleepy", "messages": [{"role": "user", "content": "wake up"}]}
        waiting = threading.Thread(target=lambda: answer.append(client.post("/v1/chat/completions", json=chat, headers=admin)))
        waiting.start()
        t0, in_flight = time.monotonic(), []
        while time.monotonic() - t0 < 3:  # six lease lifetimes
            in_flight.append(client.get(f"/v1/deployments/{dep['id']}", headers=admin).json()["in_flight"])
            time.sleep(0.1)
        waiting.join()
        assert answer[0].status_code == 503
        assert in_flight[-1] == 1 and min(in_flight[5:]) == 1, in_flight


def test_overflow_spills_only_when_the_deployment_cannot_grow_and_is_at_target(tmp_path, tiny_model_dir):
    with pooled_gateway(tmp_path, tiny_model_dir, slots=3) as (client, keys):
        gw, admin = client.app.state.parts, bearer(keys["admin"])
        gw.config.deployments[0].model_path = str(tiny_model_dir)  # `tiny` is a served base model
        r = client.post("/v1/deployments", json={"model": "v1", "overflow": "serverless"}, headers=admin)
        assert r.status_code == 400 and r.json()["error"]["param"] == "overflow", r.text  # a checkpoint's weights
        r = client.post("/v1/deployments", json={"model": "tiny", "overflow": "anywhere"}, headers=admin)
        assert r.status_code == 400, r.text
        body = {"model": "tiny", "name": "burst", "replicas": {"min": 1, "max": 2}, "autoscale": {"target_concurrency": 2}}
        dep = client.post("/v1/deployments", json={**body, "overflow": "serverless"}, headers=admin).json()
        assert (dep["overflow"], dep["overflow_model"]) == ("serverless", "tiny")
        report = {"ready": 1, "url": "http://127.0.0.1:9", "admin_urls": [], "max_model_len": 2048}
        client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=admin)
        held = [gw.admission.leases.reserve(dep["id"], f"r{i}", 0, 0, (-1, -1, -1)) for i in range(2)]
        assert gw.deployments.spill_to(dep["id"]) is None  # at target, but a slot is free: it grows instead
        client.post("/v1/deployments", json={"model": "v1", "name": "filler"}, headers=admin)
        assert gw.deployments.spill_to(dep["id"]) == "tiny"  # the pool is full, its one replica at target
        gw.admission.leases.settle(held.pop())
        assert gw.deployments.spill_to(dep["id"]) is None  # below target again
        assert gw.deployments.spill_to("d") is None  # the serverless deployment itself never spills
