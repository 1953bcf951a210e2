"""A team's batch files are bounded (quota, expiry), and a revoked key's batches stop."""

import io
import json
import time

from fastapi.testclient import TestClient

from serve.app import create_app
from serve.config import BatchConfig, Deployment, GatewayConfig, ModelRoute
from serve.keys import KeyStore
from traces.batch_store import FileStore


def gateway(tmp_path, url, **batch):
    keys = KeyStore(tmp_path / "keys.json")
    (red_rec, red), (_, blue) = keys.create("red"), keys.create("blue")
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=url)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        keys_file=str(tmp_path / "keys.json"),
        admin_key="adm",
        require_api_key=True,
        batch=BatchConfig(poll_s=0.05, **batch),
    )
    return (
        TestClient(create_app(cfg)),
        keys,
        red_rec,
        {"red": {"Authorization": f"Bearer {red}"}, "blue": {"Authorization": f"Bearer {blue}"}},
    )


def lines(n: int) -> bytes:
    return "\n".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": f"line {i}"}]},
            }
        )
        for i in range(n)
    ).encode()


def upload(client, headers, data: bytes):
    return client.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(data))}, data={"purpose": "batch"}, headers=headers)


def test_a_team_cannot_store_more_than_its_quota(tmp_path, recording_upstream):
    client, _, _, h = gateway(tmp_path, recording_upstream.url, max_team_bytes=3000)
    with client:
        assert upload(client, h["red"], lines(10)).status_code == 200
        r = upload(client, h["red"], lines(10))
        assert r.status_code == 413 and r.json()["error"]["code"] == "quota_exceeded", r.text
        assert upload(client, h["blue"], lines(10)).status_code == 200  # another team's quota is its own
        files = client.get("/v1/files", headers=h["red"]).json()["data"]
        assert client.delete(f"/v1/files/{files[0]['id']}", headers=h["red"]).status_code == 200
        assert upload(client, h["red"], lines(10)).status_code == 200


def test_files_expire(tmp_path):
    store = FileStore(tmp_path, ttl_s=60)
    meta = store.put("red", "a.jsonl", "batch", b"{}")
    assert meta["expires_at"] == meta["created_at"] + 60
    assert store.expire(now=meta["created_at"] + 59) == [] and store.get(meta["id"]) is not None
    assert store.expire(now=meta["created_at"] + 60) == [meta["id"]] and store.get(meta["id"]) is None


def test_revoking_a_key_stops_the_batches_it_created(tmp_path, recording_upstream):
    n = 200
    recording_upstream.hold(b"line")  # no line is answered until released
    client, keys, red_rec, h = gateway(tmp_path, recording_upstream.url, concurrency=2)
    with client:
        f = upload(client, h["red"], lines(n)).json()
        batch = client.post(
            "/v1/batches",
            headers=h["red"],
            json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        ).json()
        deadline = time.monotonic() + 30
        while not recording_upstream.seen:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        keys.revoke(red_rec.id)
        recording_upstream.release.set()
        deadline = time.monotonic() + 60
        while (status := client.get(f"/v1/batches/{batch['id']}", headers={"Authorization": "Bearer adm"}).json())[
            "status"
        ] != "cancelled":
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
    assert len(recording_upstream.seen) < n and status["request_counts"]["completed"] < n
