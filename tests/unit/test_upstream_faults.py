"""A deployment that breaks its stream's protocol: the client gets an error event, and the
breaker, the metrics and the trace all count it as the deployment's failure (not a client
that left)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from serve.app import create_app
from serve.config import BreakerConfig, Deployment, GatewayConfig, ModelRoute
from tests.recording_upstream import RecordingUpstream
from traces.store import TraceStore

GOOD = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "model": "tiny",
    "choices": [{"index": 0, "delta": {"content": "hel"}, "finish_reason": None}],
}


class _Malformed(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.write(f'data: {json.dumps(GOOD)}\n\ndata: {{"choices": [tru\n\n'.encode())
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Malformed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _metric(text: str, name: str, **labels) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_a_malformed_stream_event_is_the_deployments_failure_everywhere(upstream, tmp_path):
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=upstream)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        breaker=BreakerConfig(min_requests=1, error_rate=0.5, open_s=60),
        traces_dir=str(tmp_path / "traces"),
    )
    with TestClient(create_app(cfg)) as client:
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ) as r:
            events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert events[0]["choices"][0]["delta"]["content"] == "hel"  # what came before is relayed
        assert "malformed" in events[-1]["error"]["message"] and events[-1]["error"]["type"] == "server_error"
        metrics = client.get("/metrics").text
        assert _metric(metrics, "flywheel_stream_errors_total", model="tiny") == 1
        assert _metric(metrics, "flywheel_breaker_state", deployment="d") == 2  # open: 1 failure in 1
        assert client.app.state.parts.writer.flush() == 0
    rows = TraceStore(tmp_path / "traces").sql("SELECT error, response_content FROM traces").to_pylist()
    assert len(rows) == 1 and "malformed" in rows[0]["error"] and rows[0]["response_content"] == "hel"


@pytest.fixture(params=[404, 503])
def gone_and_serving(request):
    gone, serving = RecordingUpstream(), RecordingUpstream()
    gone.lose_the_model(request.param)
    yield gone.url, serving.url
    gone.stop()
    serving.stop()


def test_a_deployment_answering_model_not_found_is_unavailable_for_now_not_a_404(gone_and_serving, tmp_path):
    """The gateway asked for the model by its served name: the deployment has no worker for it
    right now (404), or says itself it is not ready (503). The next deployment serves the
    request; with none, a retryable 503 (not a 502)."""
    gone, serves = gone_and_serving
    cfg = GatewayConfig(
        deployments=[Deployment(name="gone", url=gone), Deployment(name="serves", url=serves)],
        models={
            "tiny": ModelRoute(deployment="gone", fallbacks=["serves"], upstream_model="tiny"),
            "alone": ModelRoute(deployment="gone", upstream_model="tiny"),
        },
        traces_dir=str(tmp_path / "traces"),
    )
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with TestClient(create_app(cfg)) as client:
        r = client.post("/v1/chat/completions", json={"model": "tiny", **ask})
        assert r.status_code == 200 and r.headers["x-deployment"] == "serves", r.text
        assert r.json()["choices"][0]["message"]["content"] == "ok"
        r = client.post("/v1/chat/completions", json={"model": "alone", **ask})
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "model_unavailable" and "'gone'" in err["message"]
        assert client.app.state.parts.writer.flush() == 0
    rows = TraceStore(tmp_path / "traces").sql("SELECT model, http_status FROM traces ORDER BY time_received").to_pylist()
    assert [(r["model"], r["http_status"]) for r in rows] == [("tiny", 200), ("alone", 503)], rows
