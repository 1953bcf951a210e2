"""The gateway hands a client's X-Session-ID to the deployment as Dynamo's session id, so a
frontend with session affinity keeps the session on the worker that holds its KV cache."""

import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute


@pytest.fixture
def gateway(tmp_path, recording_upstream):
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=recording_upstream.url)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        admin_key="adm",
    )
    with TestClient(create_app(cfg)) as client:
        yield client


def test_session_id_reaches_the_deployment_as_dynamo_session_id(gateway, recording_upstream):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    assert gateway.post("/v1/completions", json=body, headers={"X-Session-ID": "agent-7"}).status_code == 200
    assert gateway.post("/v1/completions", json=body).status_code == 200
    with_session, without = recording_upstream.seen
    assert with_session.headers["x-dynamo-session-id"] == "default/agent-7"  # within its team
    assert "x-dynamo-session-id" not in without.headers


def test_a_session_pinned_to_a_dead_worker_is_served_unpinned(gateway, recording_upstream):
    recording_upstream.pin_to_a_dead_worker()
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    r = gateway.post("/v1/completions", json=body, headers={"X-Session-ID": "agent-7"})
    assert r.status_code == 200, r.text
    pinned, unpinned = recording_upstream.seen
    assert pinned.headers["x-dynamo-session-id"] == "default/agent-7" and "x-dynamo-session-id" not in unpinned.headers
    assert pinned.body == unpinned.body


def test_unloading_an_adapter_the_deployment_does_not_have_is_a_404(gateway, recording_upstream):  # noqa: F811
    r = gateway.post("/unload_lora_adapter", json={"lora_name": "never-loaded"}, headers={"Authorization": "Bearer adm"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert recording_upstream.seen == []  # no worker was asked to unload it
