"""The prompt a client sent (chat messages, a completion's prompt) reaches the deployment and the
trace store as the client wrote it: the gateway passes those bytes on rather than writing a long
agentic prompt out again, and whatever it does, the deployment and the trace see the prompt
that was validated."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from serve import json_codec
from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute
from traces.store import TraceStore

CHAT = {"id": "c1", "object": "chat.completion", "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
TEXT = {"id": "c2", "object": "text_completion", "model": "tiny",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _refuse_constant(name):
    raise ValueError(f"{name} is not strict JSON")


class RecordingUpstream(BaseHTTPRequestHandler):
    seen: list[bytes] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        RecordingUpstream.seen.append(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps(CHAT if self.path.endswith("chat/completions") else TEXT).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingUpstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = GatewayConfig(deployments=[Deployment(name="d", url=f"http://127.0.0.1:{server.server_port}")],
                        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny-base")},
                        traces_dir=str(tmp_path / "traces"))
    RecordingUpstream.seen.clear()
    with TestClient(create_app(cfg)) as client:
        yield client
    server.shutdown()


def _sent_and_stored(gateway, path: str, raw: bytes) -> tuple[dict, object]:
    r = gateway.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    gateway.app.state.writer.flush()
    (stored,) = TraceStore(gateway.app.state.writer.root).sql(
        "SELECT gen_ai_input_messages FROM traces").to_pylist()
    (sent,) = RecordingUpstream.seen
    upstream = json.loads(sent, parse_constant=_refuse_constant)
    return upstream, json.loads(stored["gen_ai_input_messages"])


MESSAGES = [{"role": "system", "content": "Réponds en français, s'il te plaît."},
            {"role": "user", "content": [{"type": "text", "text": "grüß dich \u2014 \U0001f600"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "{\"ok\": true}"}]


@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped", "utf8"])
def test_chat_messages_reach_the_deployment_and_the_trace_as_sent(gateway, ascii_only):
    raw = json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 2}, indent=1,
                     ensure_ascii=ascii_only).encode()
    upstream, stored = _sent_and_stored(gateway, "/v1/chat/completions", raw)
    assert upstream["messages"] == MESSAGES == stored
    assert upstream["model"] == "tiny-base" and upstream["logprobs"] is True  # the rest is still rewritten


def test_a_completion_prompt_reaches_the_deployment_and_the_trace_as_sent(gateway):
    raw = b'{"prompt" : ["once upon a time"], "model": "tiny", "max_tokens": 2}'
    upstream, stored = _sent_and_stored(gateway, "/v1/completions", raw)
    assert upstream["prompt"] == ["once upon a time"] == stored


def test_a_repeated_messages_key_means_the_one_that_was_validated(gateway):
    """JSON lets a key repeat; the last one is the value everywhere: validated, sent, stored."""
    raw = (b'{"model": "tiny", "messages": [{"role": "user", "content": "first"}], '
           b'"max_tokens": 2, "messages": [{"role": "user", "content": "second"}]}')
    upstream, stored = _sent_and_stored(gateway, "/v1/chat/completions", raw)
    assert upstream["messages"] == [{"role": "user", "content": "second"}] == stored
    bad_last = (b'{"model": "tiny", "messages": [{"role": "user", "content": "ok"}], '
                b'"messages": [{"role": "wizard", "content": "x"}]}')
    r = gateway.post("/v1/chat/completions", content=bad_last, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")
    assert len(RecordingUpstream.seen) == 1  # the refused one never went upstream


def test_a_prompt_that_is_not_strict_json_goes_on_as_strict_json(gateway):
    """NaN is read (as json reads it) but never passed on as the client wrote it."""
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi", "weight": NaN}], "max_tokens": 2}'
    upstream, stored = _sent_and_stored(gateway, "/v1/chat/completions", raw)
    assert upstream["messages"] == [{"role": "user", "content": "hi", "weight": None}]
    assert stored[0]["content"] == "hi"


@pytest.mark.parametrize("raw, key, want", [
    (b'{"messages": [1, {"a": "\\u00e9"}], "x": 2}', "messages", b'[1, {"a": "\\u00e9"}]'),
    (b'{"prompt": "p", "prompt": "q"}', "prompt", b'"q"'),
    (b'{"messages": [1]}', "prompt", None),
    (b'[1, 2]', "messages", None),
    (b'{"messages": [Infinity]}', "messages", None),
    (b'{"": 1, "messages": [1]}', "", None),  # a route with no prompt to keep (schemathesis found a 500)
])
def test_decode_request_keeps_the_prompts_own_bytes(raw, key, want):
    value, prompt = json_codec.decode_request(raw, key)
    assert value == json.loads(raw)
    assert prompt == want
    if prompt is not None:
        assert json.loads(prompt) == value[key]
