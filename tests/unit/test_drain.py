"""A worker being drained leaves discovery (its entries only: files on one host, etcd keys on
several), and may stop only once its own metrics say nothing is in flight, or the drain's timeout
has passed."""

import base64
import json
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import quote

import httpx
import pytest

from deploy.stack import drain
from deploy.stack.drain import Drains, leave_etcd_routing, leave_routing, worker_load
from deploy.stack.frontend_instances import routes_to
from tests.conftest import free_port

WORKER, OTHER = "fbbd4dfd8208bc3", "9020d75a8eb7a543"


def entry(endpoint: str, worker: str) -> str:
    return quote(f"dynamo/backend/{endpoint}/{worker}", safe="")


@pytest.fixture
def discovery(tmp_path):
    instances = tmp_path / "v1" / "instances"
    instances.mkdir(parents=True)
    for worker in (WORKER, OTHER):
        for endpoint in ("generate", f"worker_kv_query_source_{worker[:6]}"):
            (instances / entry(endpoint, worker)).write_text("{}")
    (tmp_path / "v1" / "mdc").mkdir()
    (tmp_path / "v1" / "mdc" / entry("generate", WORKER)).write_text("{}")
    return tmp_path


@contextmanager
def serving_get(body: Callable[[], bytes]):
    """A loopback server answering every GET with ``body()``; yields its URL."""

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            text = body()
            self.send_response(200)
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


@pytest.fixture
def worker_metrics():
    """A worker's system server: ``in_flight[0]`` generate requests in flight."""
    in_flight = [2]

    def metrics() -> bytes:
        return (
            "# TYPE dynamo_component_inflight_requests gauge\n"
            'dynamo_component_inflight_requests{dynamo_component="backend",dynamo_endpoint="worker_kv_query_source_x",'
            f'dynamo_namespace="dynamo",worker_id="{WORKER}"}} 7\n'
            'dynamo_component_inflight_requests{dynamo_component="backend",dynamo_endpoint="generate",'
            f'dynamo_namespace="dynamo",worker_id="{WORKER}"}} {in_flight[0]}\n'
        ).encode()

    with serving_get(metrics) as url:
        yield url, in_flight


def test_leaving_routing_removes_that_workers_instances_only(discovery):
    assert leave_routing(discovery, WORKER) == 2
    left = sorted(p.name for p in (discovery / "v1" / "instances").iterdir())
    assert left == sorted([entry("generate", OTHER), entry(f"worker_kv_query_source_{OTHER[:6]}", OTHER)])
    assert (discovery / "v1" / "mdc" / entry("generate", WORKER)).exists()  # the model stays listed
    assert leave_routing(discovery, WORKER) == 0  # again: nothing left to remove


def not_routed(worker_id: str) -> bool:
    return False


def test_a_drain_waits_for_the_generate_requests_in_flight(discovery, worker_metrics, monkeypatch):
    url, in_flight = worker_metrics
    assert worker_load(url) == (WORKER, 2)  # the generate endpoint's count, not the kv query's
    monkeypatch.setattr(drain, "IN_TRANSIT_GRACE_S", 0)
    monkeypatch.setattr(drain, "IDLE_S", 0)
    drains, leave = Drains(timeout_s=3600), partial(leave_routing, discovery)
    assert drains.step("worker-1", url, leave, not_routed) is False
    assert "worker-1" in drains and not list((discovery / "v1" / "instances").glob(f"*{WORKER}"))
    in_flight[0] = 1
    assert drains.step("worker-1", url, leave, not_routed) is False
    in_flight[0] = 0
    assert drains.step("worker-1", url, leave, not_routed) is True
    assert "worker-1" not in drains


@pytest.fixture
def frontend():
    """A Dynamo frontend's /health: ``listed`` holds the instance ids (decimal) it lists."""
    listed = [int(WORKER, 16), int(OTHER, 16)]

    def health() -> bytes:
        instances = [{"endpoint": "generate", "instance_id": i, "transport": {"tcp": "127.0.0.1:1/x"}} for i in listed]
        return json.dumps({"status": "healthy", "instances": instances}).encode()

    with serving_get(health) as url:
        yield url, listed


def test_a_drain_waits_until_the_frontend_no_longer_lists_the_worker_and_its_last_answer_left(
    discovery, worker_metrics, frontend, monkeypatch
):
    """The removal may reach a busy frontend late: a request it routes meanwhile must find the
    worker still running, and an answer counted done may still be on its way."""
    url, in_flight = worker_metrics
    frontend_url, listed = frontend
    monkeypatch.setattr(drain, "IN_TRANSIT_GRACE_S", 0.2)
    in_flight[0] = 0
    drains, leave, routed = Drains(timeout_s=3600), partial(leave_routing, discovery), partial(routes_to, frontend_url)
    assert routes_to(frontend_url, WORKER) is True and routes_to("http://127.0.0.1:9", WORKER) is None
    assert drains.step("worker-1", url, leave, routed) is False  # idle, but still listed
    time.sleep(drain.IDLE_S)
    assert drains.step("worker-1", url, leave, routed) is False
    listed.remove(int(WORKER, 16))
    assert drains.step("worker-1", url, leave, routed) is False  # let go of, but just now
    time.sleep(drain.IN_TRANSIT_GRACE_S)
    assert drains.step("worker-1", url, leave, routed) is True
    # an answer that ended a moment ago: idle for IDLE_S first
    in_flight[0] = 1
    assert drains.step("worker-2", url, leave, routed) is False
    in_flight[0] = 0
    time.sleep(drain.IN_TRANSIT_GRACE_S)
    assert drains.step("worker-2", url, leave, routed) is False
    time.sleep(drain.IDLE_S)
    assert drains.step("worker-2", url, leave, routed) is True


def test_a_drain_ends_at_its_timeout_or_when_the_worker_stops_answering(discovery, worker_metrics):
    url, _ = worker_metrics
    leave = partial(leave_routing, discovery)
    drains = Drains(timeout_s=0)  # two requests stay in flight: the timeout ends it
    assert drains.step("worker-1", url, leave, not_routed) is True
    drains = Drains(timeout_s=3600)
    assert drains.step("worker-2", "http://127.0.0.1:9", leave, not_routed) is True  # nothing listens there


@pytest.fixture
def etcd(tmp_path):
    """A real etcd (Debian's etcd-server) on a free loopback port."""
    url = f"http://127.0.0.1:{free_port()}"
    argv = [shutil.which("etcd") or "etcd", "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", url]
    argv += ["--advertise-client-urls", url, "--listen-peer-urls", "http://127.0.0.1:0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "etcd did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()


def _put(url: str, key: str) -> None:
    body = {"key": base64.b64encode(key.encode()).decode(), "value": base64.b64encode(b"{}").decode()}
    httpx.post(f"{url}/v3/kv/put", json=body, timeout=5).raise_for_status()


def _keys(url: str) -> list[str]:
    body = {"key": base64.b64encode(b"v").decode(), "range_end": base64.b64encode(b"w").decode(), "keys_only": True}
    kvs = httpx.post(f"{url}/v3/kv/range", json=body, timeout=5).json().get("kvs", [])
    return sorted(base64.b64decode(kv["key"]).decode() for kv in kvs)


def test_on_etcd_leaving_routing_deletes_that_workers_instance_keys_only(etcd):
    for worker in (WORKER, OTHER):
        for endpoint in ("generate", f"worker_kv_query_source_{worker[:6]}"):
            _put(etcd, f"v1/instances/flywheel-local/backend/{endpoint}/{worker}")
    _put(etcd, f"v1/mdc/flywheel-local/backend/generate/{WORKER}")
    assert leave_etcd_routing(etcd, WORKER) == 2
    assert _keys(etcd) == sorted(
        [
            f"v1/instances/flywheel-local/backend/generate/{OTHER}",
            f"v1/instances/flywheel-local/backend/worker_kv_query_source_{OTHER[:6]}/{OTHER}",
            f"v1/mdc/flywheel-local/backend/generate/{WORKER}",  # the model stays listed
        ]
    )
    assert leave_etcd_routing(etcd, WORKER) == 0
    assert leave_etcd_routing("http://127.0.0.1:9", WORKER) == 0  # unreachable: it stays, the drain goes on
