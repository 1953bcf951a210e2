"""A gateway stopped mid-batch (SIGTERM, as `flywheel down` stops it) and started again answers
every line exactly once: lines answered before the stop are not sent to the deployment again."""

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import httpx

from serve.config import BatchConfig, Deployment, GatewayConfig, ModelRoute
from tests.conftest import free_port, healthy

N = 40
ADMIN = {"Authorization": "Bearer adm"}


def start_gateway(tmp_path, upstream_url: str, port: int) -> subprocess.Popen:
    cfg = GatewayConfig(
        port=port,
        deployments=[Deployment(name="d", url=upstream_url)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        admin_key="adm",
        instance="gw-1",
        batch=BatchConfig(poll_s=0.05, concurrency=4, chunk_lines=64),
    )
    path = tmp_path / "gateway.json"
    path.write_text(cfg.model_dump_json())
    proc = subprocess.Popen([sys.executable, "-m", "serve", "--config", str(path)])
    wait_for(lambda: proc.poll() is None and healthy(port), 60)
    return proc


def wait_for(check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def lines() -> bytes:
    return "\n".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": f"line-{i:03d}."}]},
            }
        )
        for i in range(N)
    ).encode()


def sent(upstream) -> Counter:
    return Counter(json.loads(s.body)["messages"][0]["content"] for s in upstream.seen)


def test_lines_answered_before_sigterm_are_not_run_again_after_the_restart(tmp_path, recording_upstream):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    recording_upstream.hold(b"line-010.")  # lines 0-9 are answered; 10 and the lines beside it wait
    gateway = start_gateway(tmp_path, recording_upstream.url, port)
    try:
        f = httpx.post(f"{base}/v1/files", files={"file": ("in.jsonl", lines())}, data={"purpose": "batch"}, headers=ADMIN).json()
        batch = httpx.post(
            f"{base}/v1/batches",
            headers=ADMIN,
            json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        ).json()
        wait_for(lambda: len(recording_upstream.seen) >= 13)  # 0-9 answered, three more in flight
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
        recording_upstream.release.set()
        before = sent(recording_upstream)
        assert all(before[f"line-{i:03d}."] == 1 for i in range(10)), before
        gateway = start_gateway(tmp_path, recording_upstream.url, port)

        def status():
            return httpx.get(f"{base}/v1/batches/{batch['id']}", headers=ADMIN).json()

        wait_for(lambda: status()["status"] == "completed")
        out = [
            json.loads(x)
            for x in httpx.get(f"{base}/v1/files/{status()['output_file_id']}/content", headers=ADMIN).text.splitlines()
        ]
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(30)
    assert sorted(o["custom_id"] for o in out) == sorted(f"c{i}" for i in range(N))
    after = sent(recording_upstream)
    assert {m: n for m, n in after.items() if m <= "line-009."} == {f"line-{i:03d}.": 1 for i in range(10)}, (
        "a line answered before the stop ran again"
    )
    assert set(after) == {f"line-{i:03d}." for i in range(N)}


def test_chunks_cancelled_at_shutdown_keep_what_they_answered(tmp_path, recording_upstream):
    """What the event loop does to every task left at shutdown (cancel it), done to the
    scheduler's chunks in process: the answered lines are kept, and a new process of the same
    instance takes the chunk over instead of running its lines again."""
    import asyncio

    from fastapi.testclient import TestClient

    from serve.app import create_app

    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url=recording_upstream.url)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        admin_key="adm",
        instance="gw-1",
        batch=BatchConfig(poll_s=0.05, concurrency=4, chunk_lines=64),
    )

    async def cancel_chunks(runner):
        tasks = list(runner.chunk_tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    recording_upstream.hold(b"line-010.")
    with TestClient(create_app(cfg)) as client:
        f = client.post("/v1/files", files={"file": ("in.jsonl", lines())}, data={"purpose": "batch"}, headers=ADMIN).json()
        batch = client.post(
            "/v1/batches",
            headers=ADMIN,
            json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        ).json()
        wait_for(lambda: len(recording_upstream.seen) >= 13)
        runner = client.app.state.parts.batch_runner
        runner.cancelled.add(batch["id"])  # nothing new starts on this replica
        client.portal.call(cancel_chunks, runner)
    recording_upstream.release.set()
    with TestClient(create_app(cfg)) as client:
        wait_for(lambda: client.get(f"/v1/batches/{batch['id']}", headers=ADMIN).json()["status"] == "completed")
    after = sent(recording_upstream)
    assert {m: n for m, n in after.items() if m <= "line-009."} == {f"line-{i:03d}.": 1 for i in range(10)}, (
        "a line answered before the stop ran again"
    )
