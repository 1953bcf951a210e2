"""The gateway hands a client's X-Session-ID to the deployment as Dynamo's session id, so a
frontend with session affinity keeps the session on the worker that holds its KV cache."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute


class RecordingUpstream(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        RecordingUpstream.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "tiny",
                           "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
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
                        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
                        traces_dir=str(tmp_path / "traces"), admin_key="adm")
    RecordingUpstream.seen.clear()
    with TestClient(create_app(cfg)) as client:
        yield client
    server.shutdown()


def test_session_id_reaches_the_deployment_as_dynamo_session_id(gateway):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    assert gateway.post("/v1/completions", json=body, headers={"X-Session-ID": "agent-7"}).status_code == 200
    assert gateway.post("/v1/completions", json=body).status_code == 200
    with_session, without = RecordingUpstream.seen
    assert with_session["x-dynamo-session-id"] == "agent-7"
    assert "x-dynamo-session-id" not in without
