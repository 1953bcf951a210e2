"""/v1/deployments without processes: the gateway's side of dedicated deployments (who may do
what, what another team sees, the supervisor's reports moving the status and charging replica
time, the usage page), on a TestClient; the processes are tests/integration/test_deployments.py's."""

import json
import re
import shutil

import pytest

from serve.config import CapacityPool, Price
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
        assert dep["replicas"] == {"desired": 2, "ready": 0, "draining": 0}
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
        assert got["replicas"] == {"desired": 1, "ready": 1, "draining": 1}
        assert client.get("/v1/deployments", headers=red_ops).json()["capacity"]["held"] == held
        seen = client.post(f"/admin/deployments/{dep['id']}/observed", json={**report, "ready": 1}, headers=admin)
        assert seen.json()["status"] == "RUNNING"
        assert client.get("/v1/deployments", headers=red_ops).json()["capacity"]["held"] == held - 1
        # delete: out of routing at once; gone once the supervisor says its graph stopped
        assert client.delete(f"/v1/deployments/{dep['id']}", headers=red_ops).json()["status"] == "DELETING"
        assert "red/red-v1" not in [m["id"] for m in client.get("/v1/models", headers=red_ops).json()["data"]]
        r = client.post(f"/v1/deployments/{dep['id']}/scale", json={"replicas": 3}, headers=red_ops)
        assert r.status_code == 409, r.text
        client.post(f"/admin/deployments/{dep['id']}/observed", json={"ready": 0, "gone": True}, headers=admin)
        assert client.get(f"/v1/deployments/{dep['id']}", headers=red_ops).status_code == 404
        assert json.loads((tmp_path / "deployments.json").read_text()) == {}
