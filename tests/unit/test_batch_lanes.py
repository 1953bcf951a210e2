"""Batch lines give way to interactive traffic: while a model serves interactive requests, a
replica runs at most ``busy_concurrency`` of its batch lines, and one replica's interactive
traffic reaches every replica through Redis. A real HTTP upstream counts the batch lines it
holds at once; the gateway runs its real batch scheduler."""

import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.batch.lanes import InteractiveSignal
from serve.config import BatchConfig, Deployment, GatewayConfig, ModelRoute
from serve.keys import KeyStore
from serve.shared_state import SharedState

UNARY = {
    "id": "c1",
    "object": "chat.completion",
    "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class Counting(BaseHTTPRequestHandler):
    """Holds each request ``server.hold_s`` and records the most batch lines it held at once."""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        is_batch = body["messages"][0]["content"].startswith("line ")
        srv = self.server
        if is_batch:
            with srv.lock:
                srv.batch_now += 1
                srv.batch_max = max(srv.batch_max, srv.batch_now)
        try:
            time.sleep(srv.hold_s)
            out = json.dumps(UNARY).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        finally:
            if is_batch:
                with srv.lock:
                    srv.batch_now -= 1

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    server.daemon_threads, server.lock, server.hold_s = True, threading.Lock(), 0.3
    server.batch_now = server.batch_max = 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _gateway(tmp_path, upstream, hold_s: float) -> tuple[GatewayConfig, str]:
    keys = KeyStore(tmp_path / "keys.json")
    _, key = keys.create("red")
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=f"http://127.0.0.1:{upstream.server_port}")],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        keys_file=str(tmp_path / "keys.json"),
        batch=BatchConfig(concurrency=4, busy_concurrency=1, interactive_hold_s=hold_s, poll_s=0.05),
    )
    return cfg, key


def _run_batch(client: TestClient, key: str, n: int) -> dict:
    lines = "\n".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": f"line {i}"}]},
            }
        )
        for i in range(n)
    )
    auth = {"Authorization": f"Bearer {key}"}
    f = client.post(
        "/v1/files", headers=auth, data={"purpose": "batch"}, files={"file": ("in.jsonl", io.BytesIO(lines.encode()))}
    ).json()
    batch = client.post(
        "/v1/batches",
        headers=auth,
        json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    ).json()
    deadline = time.monotonic() + 60
    while batch["status"] not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
        batch = client.get(f"/v1/batches/{batch['id']}", headers=auth).json()
    return batch


def test_batch_lines_run_one_at_a_time_while_the_model_serves_interactive_requests(tmp_path, upstream):
    cfg, key = _gateway(tmp_path, upstream, hold_s=600)  # the hold outlasts the batch
    with TestClient(create_app(cfg)) as client:
        r = client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        batch = _run_batch(client, key, 8)
    assert batch["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert upstream.batch_max == 1


def test_without_interactive_traffic_batch_lines_use_the_full_concurrency(tmp_path, upstream):
    cfg, key = _gateway(tmp_path, upstream, hold_s=600)
    with TestClient(create_app(cfg)) as client:
        batch = _run_batch(client, key, 8)
    assert batch["request_counts"]["completed"] == 8
    assert 1 < upstream.batch_max <= 4  # each line is held 0.3 s, so the lanes overlap


def test_one_replicas_interactive_traffic_slows_every_replicas_batch_lines(redis_server):
    here = InteractiveSignal(SharedState(redis_server.url), hold_s=600)
    there = InteractiveSignal(SharedState(redis_server.url), hold_s=600)
    there.sync({"tiny", "other"})
    assert not there.busy("tiny")
    here.seen("tiny")
    here.sync(set())  # publishes its mark
    there.sync({"tiny", "other"})
    assert there.busy("tiny") and not there.busy("other")


def test_a_mark_ends_with_its_hold_on_every_replica(redis_server):
    here = InteractiveSignal(SharedState(redis_server.url), hold_s=0.2)
    there = InteractiveSignal(SharedState(redis_server.url), hold_s=0.2)
    here.seen("tiny")
    here.sync(set())
    there.sync({"tiny"})
    assert there.busy("tiny")
    deadline = time.monotonic() + 10
    while here.busy("tiny") or there.busy("tiny"):
        assert time.monotonic() < deadline, "the hold never ended"
        time.sleep(0.05)
        here.sync({"tiny"})
        there.sync({"tiny"})


def test_without_redis_a_replica_goes_by_its_own_traffic():
    signal = InteractiveSignal(SharedState(None), hold_s=600)
    signal.sync({"tiny"})
    assert not signal.busy("tiny")
    signal.seen("tiny")
    signal.sync({"tiny"})
    assert signal.busy("tiny")


def test_a_batch_still_runs_when_sharing_interactive_marks_fails(tmp_path, upstream, monkeypatch):
    import redis

    def refuse(self, models):
        raise redis.ResponseError("NOSCRIPT No matching script")  # an error SharedState passes on

    monkeypatch.setattr(InteractiveSignal, "sync", refuse)
    cfg, key = _gateway(tmp_path, upstream, hold_s=600)
    with TestClient(create_app(cfg)) as client:
        batch = _run_batch(client, key, 4)
    assert batch["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
