"""Shared deployments, the platform's serverless capacity made by a blue-green deploy
(deploy/stack/bluegreen.py), as the gateway keeps them: only the admin makes one, no team sees or
pays for it, an alias moved to it stays there, it cannot be deleted from under an alias, and the
profile's own graph gives its slots back once no alias routes to it."""

import json
import shutil

from serve.config import CapacityPool, Price
from serve.keys import KeyStore
from tests.unit.conftest import seeded_gateway


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_a_shared_deployment_takes_an_alias_and_the_profile_graphs_slots(tmp_path, tiny_model_dir):
    ckpt = tmp_path / "two-layer"
    shutil.copytree(tiny_model_dir, ckpt)
    registry = {"checkpoints": {"two-layer": {"version": "two-layer", "kind": "full", "path": str(ckpt), "team": None}}}
    (tmp_path / "checkpoints.json").write_text(json.dumps(registry))
    config = dict(
        checkpoints_file=str(tmp_path / "checkpoints.json"),
        deployments_file=str(tmp_path / "deployments.json"),
        prices={"two-layer": Price(replica_hour_usd=3600.0)},
        pool=CapacityPool(slots=3, serverless_slots=1),
    )
    with seeded_gateway(tmp_path, **config) as (client, keys):
        red_ops = bearer(KeyStore(tmp_path / "keys.json").create("red", scopes=["inference", "deployments"])[1])
        admin = bearer(keys["admin"])
        body = {"model": "two-layer", "name": "tiny", "shared": True}
        r = client.post("/v1/deployments", json=body, headers=red_ops)
        assert r.status_code == 403 and r.json()["error"]["param"] == "shared", r.text
        assert client.post("/v1/deployments", json={**body, "team": "red"}, headers=admin).status_code == 400
        r = client.post("/v1/deployments", json={**body, "replicas": 3}, headers=admin)
        assert r.status_code == 409 and r.json()["error"]["code"] == "insufficient_capacity", r.text  # 1 held by `d`
        r = client.post("/v1/deployments", json=body, headers=admin)
        assert r.status_code == 202, r.text
        dep = r.json()
        assert (dep["team"], dep["served_model"]) == (None, "tiny")  # its engines serve the alias's upstream name
        # a second one of the same name (the new side of the next blue-green) is no conflict
        second = client.post("/v1/deployments", json=body, headers=admin)
        assert second.status_code == 202, second.text
        gone = second.json()["id"]
        assert client.delete(f"/v1/deployments/{gone}", headers=admin).status_code == 202
        client.post(f"/admin/deployments/{gone}/observed", json={"ready": 0, "gone": True}, headers=admin)
        listed = client.get("/v1/deployments", headers=admin).json()
        assert listed["capacity"]["held"] == 2 and [d["id"] for d in listed["data"]] == [dep["id"]]
        assert client.get("/v1/deployments", headers=red_ops).json()["data"] == []  # no team's
        report = {"ready": 1, "url": "http://127.0.0.1:9", "admin_urls": [], "max_model_len": 2048}
        assert client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=admin).json()["status"] == "RUNNING"
        models = client.get("/admin/models", headers=admin).json()
        assert models["tiny"]["deployment"] == "d"  # no route of its own: the alias moves only when told

        route = {"deployment": dep["id"], "upstream_model": "tiny", "checkpoint_version": "two-layer"}
        assert client.put("/admin/models/tiny", json=route, headers=admin).status_code == 200
        client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=admin)  # the table is applied again
        assert client.get("/admin/models", headers=admin).json()["tiny"]["deployment"] == dep["id"]  # the alias stays
        got = client.get(f"/v1/deployments/{dep['id']}", headers=admin).json()
        assert got["replica_seconds"] == 0 and got["cost_usd"] == 0  # serverless: charged by the token
        # `d` holds nothing once no alias routes to it: two more replicas fit beside the shared one
        assert client.get("/v1/deployments", headers=admin).json()["capacity"]["held"] == 1
        r = client.post(f"/v1/deployments/{dep['id']}/scale", json={"replicas": 3}, headers=admin)
        assert r.status_code == 202, r.text
        client.post(f"/v1/deployments/{dep['id']}/scale", json={"replicas": 1}, headers=admin)
        client.post(f"/admin/deployments/{dep['id']}/observed", json=report, headers=admin)

        r = client.delete(f"/v1/deployments/{dep['id']}", headers=admin)
        assert r.status_code == 409 and "tiny" in r.json()["error"]["message"], r.text
        assert client.get(f"/v1/deployments/{dep['id']}", headers=admin).json()["status"] == "RUNNING"  # nothing changed
        back = {"deployment": "d", "upstream_model": "tiny"}
        assert client.put("/admin/models/tiny", json=back, headers=admin).status_code == 200
        assert client.delete(f"/v1/deployments/{dep['id']}", headers=admin).json()["status"] == "DELETING"
