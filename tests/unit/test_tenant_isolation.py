"""With keys on, a team sees neither another team's figures nor its adapters, nor where the
weights live; and no team can share, pin or move another team's session."""

import json

import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute
from serve.keys import KeyStore

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture
def gateway(tmp_path, recording_upstream):
    keys = KeyStore(tmp_path / "keys.json")
    _, red = keys.create("red")
    _, blue = keys.create("blue")
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=recording_upstream.url, model_path="/srv/weights/base")],
        models={
            "tiny": ModelRoute(deployment="d", upstream_model="tiny"),
            "blue-sft": ModelRoute(deployment="d", upstream_model="blue-sft", lora_path="/srv/ckpt/blue-sft", teams=["blue"]),
        },
        traces_dir=str(tmp_path / "traces"),
        keys_file=str(tmp_path / "keys.json"),
        admin_key="adm",
        require_api_key=True,
    )
    with TestClient(create_app(cfg)) as client:
        yield (
            client,
            {
                "red": {"Authorization": f"Bearer {red}"},
                "blue": {"Authorization": f"Bearer {blue}"},
                "admin": {"Authorization": "Bearer adm"},
            },
        )


def test_metrics_and_health_details_need_the_admin_key(gateway):
    client, h = gateway
    assert client.post("/v1/chat/completions", json={"model": "tiny", **CHAT}, headers=h["red"]).status_code == 200
    for who in (None, "red"):
        r = client.get("/metrics", headers=h.get(who, {}))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/health", headers=h.get(who, {})).json() == {"status": "ok"}
    metrics = client.get("/metrics", headers=h["admin"])
    assert metrics.status_code == 200 and 'team="red"' in metrics.text
    assert "breakers" in client.get("/health", headers=h["admin"]).json()


def test_models_need_a_key_show_no_paths_and_hide_other_teams_adapters(gateway):
    client, h = gateway
    assert client.get("/v1/models").status_code == 401
    red = {m["id"]: m for m in client.get("/v1/models", headers=h["red"]).json()["data"]}
    assert set(red) == {"tiny"} and red["tiny"]["root"] == "tiny"
    blue = {m["id"]: m for m in client.get("/v1/models", headers=h["blue"]).json()["data"]}
    assert set(blue) == {"tiny", "blue-sft"} and not any("/srv" in json.dumps(m) for m in blue.values())
    assert client.get("/v1/models/blue-sft", headers=h["red"]).status_code == 404
    r = client.post("/v1/chat/completions", json={"model": "blue-sft", **CHAT}, headers=h["red"])
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert client.post("/v1/chat/completions", json={"model": "blue-sft", **CHAT}, headers=h["blue"]).status_code == 200
    admin = {m["id"]: m for m in client.get("/v1/models", headers=h["admin"]).json()["data"]}
    assert admin["blue-sft"]["root"] == "/srv/ckpt/blue-sft"


def test_the_same_session_id_from_two_teams_is_two_sessions(gateway, recording_upstream):
    client, h = gateway
    for team in ("red", "blue"):
        assert (
            client.post(
                "/v1/chat/completions", json={"model": "tiny", **CHAT}, headers={**h[team], "X-Session-ID": "s-1"}
            ).status_code
            == 200
        )
    assert [s.headers["x-dynamo-session-id"] for s in recording_upstream.seen] == ["red/s-1", "blue/s-1"]


def test_a_batch_line_for_another_teams_adapter_is_refused_as_a_model_that_does_not_exist(gateway):
    """As in chat: red's line for blue's private alias is `model_not_found` at create, the same
    answer as for a name nobody has, so a batch cannot probe which aliases other teams hold."""
    client, h = gateway

    def batch_of(headers, model: str) -> dict:
        line = {"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": model, **CHAT}}
        upload = client.post(
            "/v1/files", headers=headers, data={"purpose": "batch"}, files={"file": ("in.jsonl", json.dumps(line).encode())}
        )
        created = client.post(
            "/v1/batches",
            headers=headers,
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        )
        return created.json()

    for model in ("blue-sft", "no-such-model"):
        refused = batch_of(h["red"], model)
        assert refused["status"] == "failed", refused
        assert [e["code"] for e in refused["errors"]["data"]] == ["model_not_found"]
    assert batch_of(h["blue"], "blue-sft")["status"] == "in_progress"
