"""A client reaches Dynamo's nvext only through what it may set: nothing that picks a worker,
replaces the measured prompt or reports on other teams; and no team's prompts share
prefix-cache KV (or its cached_tokens) with another's."""

import json

import pytest

from serve.keys import KeyStore
from tests.unit.test_session_forwarding import gateway  # noqa: F401 (fixture)

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.parametrize(
    "field, value",
    [
        ("backend_instance_id", 7),
        ("decode_worker_id", 7),
        ("prefill_worker_id", 7),
        ("dp_rank", 0),
        ("prefill_dp_rank", 0),
        ("token_data", [1, 2, 3]),
        ("use_raw_prompt", True),
        ("annotations", ["query_instance_id:"]),
        ("agent_hints", {"priority": 100}),
        ("cache_salt", "theirs"),
        ("metadata_upload", {"url": "file:///tmp/x"}),
        ("routing_constraints", {"required_taints": ["a"]}),
        ("router", {"ttft_target": 1}),
        ("request_timestamp_ms", 1.0),
    ],
)
def test_fields_that_steer_the_engine_or_leak_are_refused_and_never_sent(gateway, recording_upstream, field, value):  # noqa: F811
    r = gateway.post("/v1/chat/completions", json={**CHAT, "nvext": {field: value}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"nvext.{field}" and "greed_sampling" in r.json()["error"]["message"]
    assert recording_upstream.seen == []


@pytest.mark.parametrize(
    "nvext, param",
    [
        ({"extra_fields": ["worker_id"]}, "nvext.extra_fields"),
        ({"extra_fields": ["timing"]}, "nvext.extra_fields"),
        ({"extra_fields": "completion_token_ids"}, "nvext.extra_fields"),
        ({"greed_sampling": "yes"}, "nvext.greed_sampling"),
        ({"max_thinking_tokens": -1}, "nvext.max_thinking_tokens"),
        ([1], "nvext"),
    ],
)
def test_malformed_or_internal_nvext_is_400(gateway, nvext, param):  # noqa: F811
    r = gateway.post("/v1/chat/completions", json={**CHAT, "nvext": nvext})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_allowed_fields_pass_and_the_reply_shows_only_what_was_asked(gateway, recording_upstream):  # noqa: F811
    recording_upstream.extra["nvext"] = {
        "completion_token_ids": [5],
        "worker_id": {"decode_worker_id": 9},
        "timing": {"kv_hit_rate": 0.9},
        "engine_data": {"x": 1},
        "routed_experts": [1],
        "token_ids": [1],
    }
    r = gateway.post(
        "/v1/chat/completions",
        json={**CHAT, "nvext": {"greed_sampling": True, "max_thinking_tokens": 8, "extra_fields": ["completion_token_ids"]}},
    )
    assert r.status_code == 200, r.text
    assert r.json()["nvext"] == {"completion_token_ids": [5]}
    sent = json.loads(recording_upstream.seen[0].body)["nvext"]
    assert sent["greed_sampling"] is True and sent["max_thinking_tokens"] == 8
    assert "nvext" not in gateway.post("/v1/chat/completions", json=CHAT).json()


def test_each_team_gets_its_own_prefix_cache_salt(tmp_path, recording_upstream):
    from fastapi.testclient import TestClient
    from serve.app import create_app
    from serve.config import Deployment, GatewayConfig, ModelRoute

    keys = KeyStore(tmp_path / "keys.json")
    _, red = keys.create("red")
    _, blue = keys.create("blue")
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=recording_upstream.url)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        keys_file=str(tmp_path / "keys.json"),
        require_api_key=True,
    )
    with TestClient(create_app(cfg)) as client:
        for key, body in (
            (red, CHAT),
            (blue, CHAT),
            (red, {**CHAT, "cache_salt": "mine"}),
            (blue, {**CHAT, "cache_salt": "mine"}),
        ):
            assert client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    salts = [json.loads(s.body).get("cache_salt") for s in recording_upstream.seen]
    assert salts == ["red", "blue", "red:mine", "blue:mine"]


def test_the_admin_key_may_see_which_worker_served_it(gateway, recording_upstream):  # noqa: F811
    recording_upstream.extra["nvext"] = {"worker_id": {"decode_worker_id": 9}, "engine_data": {"x": 1}}
    body = {**CHAT, "nvext": {"extra_fields": ["worker_id"]}}
    r = gateway.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer adm"})
    assert r.status_code == 200 and r.json()["nvext"] == {"worker_id": {"decode_worker_id": 9}}, r.text
    assert gateway.post("/v1/chat/completions", json=body).status_code == 400  # anonymous
