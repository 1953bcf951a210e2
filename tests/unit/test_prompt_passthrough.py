"""The prompt a client sent (chat messages, a completion's prompt) reaches the deployment and the
trace store as the client wrote it: the gateway passes those bytes on rather than writing a long
agentic prompt out again, and whatever it does, the deployment and the trace see the prompt
that was validated."""

import json

import pytest
from fastapi.testclient import TestClient

from serve import json_codec
from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute
from traces.store import TraceStore


def _refuse_constant(name):
    raise ValueError(f"{name} is not strict JSON")


@pytest.fixture
def gateway(tmp_path, recording_upstream):
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=recording_upstream.url)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny-base")},
        traces_dir=str(tmp_path / "traces"),
    )
    with TestClient(create_app(cfg)) as client:
        yield client


def _sent_and_stored(gateway, recording_upstream, path: str, raw: bytes) -> tuple[dict, object]:
    r = gateway.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    gateway.app.state.parts.writer.flush()
    (stored,) = TraceStore(gateway.app.state.parts.writer.root).sql("SELECT gen_ai_input_messages FROM traces").to_pylist()
    (sent,) = recording_upstream.seen
    return json.loads(sent.body, parse_constant=_refuse_constant), json.loads(stored["gen_ai_input_messages"])


MESSAGES = [
    {"role": "system", "content": "Réponds en français, s'il te plaît."},
    {"role": "user", "content": [{"type": "text", "text": "grüß dich \u2014 \U0001f600"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    },
    {"role": "tool", "tool_call_id": "t1", "content": '{"ok": true}'},
]


@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped", "utf8"])
def test_chat_messages_reach_the_deployment_and_the_trace_as_sent(gateway, recording_upstream, ascii_only):
    raw = json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 2}, indent=1, ensure_ascii=ascii_only).encode()
    sent, stored = _sent_and_stored(gateway, recording_upstream, "/v1/chat/completions", raw)
    assert sent["messages"] == MESSAGES == stored
    assert sent["model"] == "tiny-base" and sent["logprobs"] is True  # the rest is still rewritten


def test_a_completion_prompt_reaches_the_deployment_and_the_trace_as_sent(gateway, recording_upstream):
    raw = b'{"prompt" : ["once upon a time"], "model": "tiny", "max_tokens": 2}'
    sent, stored = _sent_and_stored(gateway, recording_upstream, "/v1/completions", raw)
    assert sent["prompt"] == ["once upon a time"] == stored


def test_a_repeated_messages_key_means_the_one_that_was_validated(gateway, recording_upstream):
    """JSON lets a key repeat; the last one is the value everywhere: validated, sent, stored."""
    raw = (
        b'{"model": "tiny", "messages": [{"role": "user", "content": "first"}], '
        b'"max_tokens": 2, "messages": [{"role": "user", "content": "second"}]}'
    )
    sent, stored = _sent_and_stored(gateway, recording_upstream, "/v1/chat/completions", raw)
    assert sent["messages"] == [{"role": "user", "content": "second"}] == stored
    bad_last = (
        b'{"model": "tiny", "messages": [{"role": "user", "content": "ok"}], "messages": [{"role": "wizard", "content": "x"}]}'
    )
    r = gateway.post("/v1/chat/completions", content=bad_last, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")
    assert len(recording_upstream.seen) == 1  # the refused one never went upstream


def test_a_prompt_that_is_not_strict_json_goes_on_as_strict_json(gateway, recording_upstream):
    """NaN is read (as json reads it) but never passed on as the client wrote it."""
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi", "weight": NaN}], "max_tokens": 2}'
    sent, stored = _sent_and_stored(gateway, recording_upstream, "/v1/chat/completions", raw)
    assert sent["messages"] == [{"role": "user", "content": "hi", "weight": None}]
    assert stored[0]["content"] == "hi"


@pytest.mark.parametrize(
    "raw, key, want",
    [
        (b'{"messages": [1, {"a": "\\u00e9"}], "x": 2}', "messages", b'[1, {"a": "\\u00e9"}]'),
        (b'{"prompt": "p", "prompt": "q"}', "prompt", b'"q"'),
        (b'{"messages": [1]}', "prompt", None),
        (b"[1, 2]", "messages", None),
        (b'{"messages": [Infinity]}', "messages", None),
        (b'{"": 1, "messages": [1]}', "", None),  # a route with no prompt to keep (schemathesis found a 500)
    ],
)
def test_decode_request_keeps_the_prompts_own_bytes(raw, key, want):
    value, prompt = json_codec.decode_request(raw, key)
    assert value == json.loads(raw)
    assert prompt == want
    if prompt is not None:
        assert json.loads(prompt) == value[key]
