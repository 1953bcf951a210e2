"""Bad requests get OpenAI-shaped 4xx from the gateway before anything reaches a deployment."""

import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute


@pytest.fixture
def client(tmp_path):
    # Port 9 (discard) on loopback: nothing listens, so forwarding fails fast.
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url="http://127.0.0.1:9")],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        admin_key="adm",
    )
    with TestClient(create_app(cfg)) as c:
        yield c


def assert_openai_error(r, status, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    return err


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def test_unknown_model_is_404_model_not_found(client):
    err = assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}), 404, "model")
    assert err["code"] == "model_not_found" and "gpt-9" in err["message"]


def test_malformed_json_is_400(client):
    err = assert_openai_error(client.post("/v1/chat/completions", content=b'{"model": "tiny",'), 400)
    assert "JSON" in err["message"]
    assert_openai_error(client.post("/v1/completions", content=b"[1, 2]"), 400)


def test_missing_or_invalid_fields_name_the_parameter(client):
    err = assert_openai_error(client.post("/v1/chat/completions", json={"model": "tiny"}), 400, "messages")
    assert "messages" in err["message"]
    assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "messages": []}), 400, "messages")
    assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "temperature": 7}), 400, "temperature")
    assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "n": 3}), 400, "n")
    assert_openai_error(client.post("/v1/completions", json={"model": "tiny"}), 400, "prompt")


def test_unreachable_deployment_is_503_and_still_traced(client, tmp_path):
    err = assert_openai_error(client.post("/v1/chat/completions", json=CHAT), 503)
    assert err["type"] == "server_error" and "unreachable" in err["message"]
    writer = client.app.state.parts.writer
    assert writer.flush() == 0
    from traces.store import TraceStore

    rows = TraceStore(tmp_path / "traces").sql("SELECT http_status, error FROM traces").to_pylist()
    assert rows == [{"http_status": 503, "error": err["message"]}]


def test_unknown_route_and_admin_auth_are_openai_shaped(client):
    assert_openai_error(client.get("/v1/nope"), 404)
    assert_openai_error(client.get("/admin/models"), 401)
    r = client.put(
        "/admin/models/tiny", headers={"Authorization": "Bearer adm"}, json={"deployment": "nope", "upstream_model": "x"}
    )
    assert_openai_error(r, 400, "deployment")
    for bad in (
        {"deployment": 5, "upstream_model": "x"},
        {"upstream_model": "x"},
        {"deployment": "d", "upstream_model": "x", "unknown": 1},
    ):
        r = client.put("/admin/models/tiny", headers={"Authorization": "Bearer adm"}, json=bad)
        assert r.status_code == 400 and r.json()["error"]["param"], (bad, r.text)
    r = client.put(
        "/admin/models/tiny2",
        headers={"Authorization": "Bearer adm"},
        json={"deployment": "d", "upstream_model": "tiny-lora", "checkpoint_version": "v2"},
    )
    assert r.status_code == 200
    assert {m["id"]: m["checkpoint_version"] for m in client.get("/v1/models").json()["data"]} == {"tiny": "base", "tiny2": "v2"}


def test_a_body_over_the_limit_is_413_before_it_is_read(tmp_path):
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url="http://127.0.0.1:9")],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        admin_key="adm",
        max_body_bytes=1000,
    )
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
    with TestClient(create_app(cfg)) as c:
        err = assert_openai_error(c.post("/v1/chat/completions", json=big), 413)
        assert err["code"] == "request_too_large"

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}]}'

        assert_openai_error(c.post("/v1/chat/completions", content=chunks()), 413)
        for path in ("/v1/feedback", "/v1/traces/query", "/admin/models/tiny"):
            method = c.put if path.startswith("/admin") else c.post
            assert method(path, content=b"x" * 2000, headers={"Authorization": "Bearer adm"}).status_code == 413
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 503  # small bodies go through


@pytest.mark.parametrize("stop", [[1, 2], 5, ["a", "b", "c", "d", "e"], [None]])
def test_a_stop_that_is_not_up_to_four_strings_is_400(client, stop):
    assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "stop": stop}), 400, "stop")
    assert_openai_error(client.post("/v1/completions", json={"model": "tiny", "prompt": "a", "stop": stop}), 400, "stop")


@pytest.mark.parametrize("name", ["a/../../b", "..", "/etc", "a//b", "x y"])
def test_an_adapter_name_that_looks_like_a_path_is_400(client, name):
    for path, body in (
        ("/load_lora_adapter", {"lora_name": name, "lora_path": "/tmp"}),
        ("/unload_lora_adapter", {"lora_name": name}),
    ):
        r = client.post(path, json=body, headers={"Authorization": "Bearer adm"})
        assert_openai_error(r, 400, "lora_name")


def test_what_cannot_fit_the_context_is_400_context_length_exceeded_with_both_numbers(tmp_path):
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url="http://127.0.0.1:9", max_model_len=2048)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
    )
    with TestClient(create_app(cfg)) as c:
        err = assert_openai_error(c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**9}), 400, "max_tokens")
        assert err["code"] == "context_length_exceeded" and "2048" in err["message"] and str(10**9) in err["message"]
        err = assert_openai_error(
            c.post("/v1/completions", json={"model": "tiny", "prompt": list(range(2000)), "max_tokens": 100}), 400, "prompt"
        )
        assert "2048" in err["message"] and "2100" in err["message"]
        err = assert_openai_error(
            c.post(
                "/inference/v1/generate",
                json={"model": "tiny", "token_ids": list(range(2040)), "sampling_params": {"max_tokens": 16}},
            ),
            400,
            "prompt",
        )
        assert err["code"] == "context_length_exceeded"
        assert c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 100}).status_code == 503  # fits: sent


def test_a_text_prompt_longer_than_the_context_is_400_with_both_numbers(tmp_path):
    """Counted with the deployment's own tokenizer, only when its bytes could overflow (the
    mocker engine answered such prompts with a bare 500)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"word": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "model").mkdir()
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url="http://127.0.0.1:9", max_model_len=2048, model_path=str(tmp_path / "model"))],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
    )
    with TestClient(create_app(cfg)) as c:
        long = [
            {"role": "system", "content": "word " * 1000},
            {"role": "user", "content": [{"type": "text", "text": "word " * 2000}]},
        ]
        err = assert_openai_error(
            c.post("/v1/chat/completions", json={"model": "tiny", "messages": long, "max_tokens": 16}), 400, "messages"
        )
        assert err["code"] == "context_length_exceeded"
        assert "2048" in err["message"] and "at least 3016" in err["message"]
        err = assert_openai_error(c.post("/v1/completions", json={"model": "tiny", "prompt": "word " * 2048}), 400, "prompt")
        assert "2049" in err["message"]
        # 2,500 bytes could overflow but are 500 tokens: they fit and are sent (nothing listens: 503)
        fits = {"model": "tiny", "messages": [{"role": "user", "content": "word " * 500}], "max_tokens": 16}
        assert c.post("/v1/chat/completions", json=fits).status_code == 503
