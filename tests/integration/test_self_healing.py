"""The stack keeps what it acknowledged and heals by itself: gateway restarts (clean and kill -9),
killed and stalled workers, a half-dead stack, a full or read-only spool disk, down/up again.
Real processes (Dynamo frontend + two mocker workers + gateway + the supervisor) on loopback."""

import json
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from deploy.stack.dynamo_graph import discovery_dir
from deploy.stack.launcher import down, status, up
from deploy.stack.processes import ProcessManager, group_pids
from deploy.stack.sockets import group_listening_ports
from deploy.stack.frontend_instances import registered_ports
from tests.integration.conftest import exposed_listeners, sim_stack_on, wait_until
from traces.store import TraceStore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def healing(tmp_path_factory):
    home = tmp_path_factory.mktemp("flywheel-healing")
    spool = home / "traces" / "_spool"
    spool.mkdir(parents=True)
    # the spool on a disk of its own, so a test can fill it or make it read-only
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(spool)], check=True)
    ports = ["gateway.port=21000", "frontend.port=21100", "worker.system_port_base=21200"]
    try:
        with sim_stack_on(home, *ports, "worker.speedup_ratio=1", "supervisor.poll_s=0.5") as cfg:
            yield cfg
    finally:
        subprocess.run(["umount", "-l", str(spool)], check=False)


def url(cfg) -> str:
    return f"http://127.0.0.1:{cfg.gateway.port}"


def chat(cfg, i: int, stream: bool, max_tokens: int = 8) -> tuple[int, str | None]:
    """One request; (status, trace id) where status 200 means the full response arrived."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"turn {i}"}], "max_tokens": max_tokens, "stream": stream}
    if not stream:
        r = httpx.post(f"{url(cfg)}/v1/chat/completions", json=body, timeout=60)
        return r.status_code, r.headers.get("x-trace-id")
    with httpx.stream("POST", f"{url(cfg)}/v1/chat/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
        ok = r.status_code == 200 and lines and lines[-1].strip() == "data: [DONE]"
        return (200 if ok else r.status_code or 599), r.headers.get("x-trace-id")


def gateway_serves(cfg) -> bool:
    return chat(cfg, -1, False)[0] == 200


def stored_ids(cfg, where: str = "error IS NULL") -> list[str]:
    return TraceStore(cfg.traces_path).sql(f"SELECT trace_id FROM traces WHERE {where}").column("trace_id").to_pylist()


def eventually_stored(cfg, acked: list[str], timeout_s: float = 30) -> list[str]:
    wait_until(lambda: set(acked) <= set(stored_ids(cfg)), timeout_s, "every acknowledged trace queryable")
    return stored_ids(cfg)


def worker_registered(cfg, i: int) -> bool:
    pid = ProcessManager(cfg.run_dir).pid(f"worker-{i}")
    listed = registered_ports(cfg.frontend_url) or set()
    return pid is not None and bool(group_listening_ports(pid) & listed)


def supervisor_saw_every_worker_routed(cfg) -> bool:
    return all(r["registered_at"] for r in status(cfg) if r["name"].startswith("worker-"))


def test_five_gateway_restarts_lose_nothing_and_store_nothing_twice(healing):
    pm = ProcessManager(healing.run_dir)
    acked = []
    for restart in range(5):
        for i in range(12):
            code, tid = chat(healing, restart * 100 + i, stream=i % 2 == 0)
            assert code == 200
            acked.append(tid)
        old = pm.pid("gateway")
        sig = signal.SIGTERM if restart % 2 == 0 else signal.SIGKILL
        os.kill(old, sig)
        # no command: the supervisor brings it back (a kill -9 within 30 s, as promised)
        wait_until(lambda: pm.pid("gateway") not in (None, old), 30, "a new gateway process")
        wait_until(lambda: gateway_serves(healing), 30, f"serving again after {sig.name}")
    rows = stored_ids(healing, "trace_id IN (" + ", ".join(f"'{t}'" for t in acked) + ")")
    assert len(rows) == len(set(rows)), "a trace stored twice"
    assert sorted(rows) == sorted(acked), f"{len(set(acked) - set(rows))} acknowledged traces missing"
    assert next(r for r in status(healing) if r["name"] == "gateway")["restarts"] >= 5


def test_streams_on_a_killed_worker_finish_on_the_other_and_the_worker_comes_back(healing):
    pm = ProcessManager(healing.run_dir)
    wait_until(lambda: worker_registered(healing, 0) and worker_registered(healing, 1), 60, "both workers")
    results: list[tuple[int, str | None]] = []
    # 16 streams: the router spreads them over both workers, so some run on the one killed
    threads = [threading.Thread(target=lambda i=i: results.append(chat(healing, 1000 + i, True, 400))) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # the streams are running (400 tokens at the mocker's real-time pace: ~2.5 s)
    victim = pm.pid("worker-0")
    os.killpg(victim, signal.SIGKILL)
    for t in threads:
        t.join(120)
    assert [code for code, _ in results] == [200] * 16, "a stream on the killed worker did not complete"
    migrated = (healing.run_dir / "frontend.log").read_text(errors="replace").count("migration retry scheduled")
    assert migrated >= 1, "no request was running on the killed worker"
    wait_until(
        lambda: pm.pid("worker-0") not in (None, victim) and worker_registered(healing, 0),
        30,
        "the killed worker registered again",
    )
    row = next(r for r in status(healing) if r["name"] == "worker-0")
    assert row["restarts"] >= 1 and row["last_exit"]


def test_a_worker_stalled_past_its_discovery_ttl_is_serving_again_within_60_s(healing):
    pm = ProcessManager(healing.run_dir)
    wait_until(lambda: worker_registered(healing, 1), 60, "worker-1 registered")
    stalled = pm.pid("worker-1")
    os.killpg(stalled, signal.SIGSTOP)
    time.sleep(15)  # past Dynamo's fixed 10 s file-discovery TTL: the frontend drops it for good
    try:
        os.killpg(stalled, signal.SIGCONT)
    except ProcessLookupError:  # the supervisor already replaced it
        pass
    wait_until(lambda: worker_registered(healing, 1), 60, "the stalled worker serving again")
    assert pm.pid("worker-1") != stalled
    row = next(r for r in status(healing) if r["name"] == "worker-1")
    assert "no longer registered" in row["last_exit"] or "gone" in row["last_exit"]


def test_every_worker_out_of_discovery_at_once_is_restarted_and_serves_again(healing):
    """A frontend that lists nobody is no reason to wait: the sole worker of a stack (here both at
    once) whose keep-alive lapsed is restarted like one that lapsed beside another."""
    pm = ProcessManager(healing.run_dir)
    wait_until(lambda: supervisor_saw_every_worker_routed(healing), 60, "the supervisor seeing both workers routed")
    before = [pm.pid("worker-0"), pm.pid("worker-1")]
    for entry in (discovery_dir(healing) / "v1" / "instances").iterdir():  # what the TTL lapse does
        entry.unlink()
    wait_until(lambda: registered_ports(healing.frontend_url) == set(), 30, "the frontend listing nobody")
    wait_until(lambda: worker_registered(healing, 0) and worker_registered(healing, 1), 60, "both registered again")
    assert None not in before and all(pm.pid(f"worker-{i}") != before[i] for i in (0, 1))
    wait_until(lambda: gateway_serves(healing), 30, "serving again")


def test_up_on_a_half_dead_stack_starts_only_what_is_missing(healing):
    pm = ProcessManager(healing.run_dir)
    pm.stop("supervisor")
    before = {n: pm.pid(n) for n in ("frontend", "worker-0", "worker-1")}
    os.kill(pm.pid("gateway"), signal.SIGKILL)
    wait_until(lambda: pm.pid("gateway") is None, 10, "the gateway gone")
    up(healing)
    assert {n: pm.pid(n) for n in before} == before, "up restarted a healthy component"
    assert pm.pid("gateway") is not None and pm.pid("supervisor") is not None
    assert gateway_serves(healing)


def _fill(path):
    """Fill the disk up: whatever room there is is taken."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while os.write(fd, b"\0" * 65536):
            pass
    except OSError:  # the disk is full
        pass
    finally:
        os.close(fd)


@contextmanager
def kept_full(path):
    """The disk full for the whole block: the mover frees a segment's pages a tenth of a second
    after its rows came (trace_flush_age_s), so it is filled again every millisecond."""
    stop = threading.Event()

    def keep() -> None:
        while not stop.is_set():
            _fill(path)
            stop.wait(0.001)

    _fill(path)
    filler = threading.Thread(target=keep, daemon=True)
    filler.start()
    try:
        yield
    finally:
        stop.set()
        filler.join()
        path.unlink()


def test_a_full_or_read_only_spool_fails_requests_cleanly_and_the_gateway_recovers(healing):
    spool = healing.traces_path / "_spool"
    acked = []
    for i in range(6):
        code, tid = chat(healing, 2000 + i, stream=i % 2 == 0)
        assert code == 200
        acked.append(tid)
    refused, kinds = [], set()
    with kept_full(spool / "filler"):
        # the open segment's last page may still take a record, and a converted segment frees
        # its pages: whatever succeeds is acknowledged and must be kept, whatever fails is refused
        for i in range(30):
            stream = i % 2 == 1
            body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "stream": stream}
            r = httpx.post(f"{url(healing)}/v1/chat/completions", json=body, timeout=60)
            if r.status_code == 200 and "data: [DONE]" in r.text or r.status_code == 200 and not stream:
                acked.append(r.headers["x-trace-id"])
                continue
            if stream:  # headers went out before the trace: the stream ends in an error event
                last = json.loads([line for line in r.text.splitlines() if line.startswith("data:")][-1][5:])
                err = last["error"]
            else:
                assert r.status_code == 503
                err = r.json()["error"]
            assert err["type"] == "server_error" and err["code"] == "trace_store_unavailable"
            assert set(err) >= {"message", "type", "param", "code"}
            refused.append(r.headers.get("x-trace-id"))
            kinds.add(stream)
            if len(refused) >= 6:
                break
    assert kinds == {True, False} and len(refused) >= 6, "a full spool disk did not refuse requests"
    for i in range(4):  # the disk has room again: so does the gateway, with no restart
        code, tid = chat(healing, 2100 + i, stream=i % 2 == 0)
        assert code == 200
        acked.append(tid)

    time.sleep(2)  # the mover closed its segment: nothing holds the disk open for writing
    subprocess.run(["mount", "-o", "remount,ro", str(spool)], check=True)
    try:
        code, _ = chat(healing, 2200, stream=False)
        assert code == 503
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(spool)], check=True)
    code, tid = chat(healing, 2201, stream=True)
    assert code == 200
    acked.append(tid)

    rows = eventually_stored(healing, acked)
    assert set(acked) <= set(rows) and not set(refused) & set(rows)


def test_the_sim_stack_listens_on_loopback_only(healing):
    listening, exposed = exposed_listeners(healing)
    assert listening == {"event-broker", "frontend", "worker-0", "worker-1", "gateway"}
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_down_then_up_then_traffic_keeps_every_earlier_trace(healing):
    before = set(stored_ids(healing))
    pm = ProcessManager(healing.run_dir)
    running = [pm.pid(p.stem) for p in healing.run_dir.glob("*.pid")]
    assert len(running) == 6 and None not in running  # broker, frontend, 2 workers, gateway, supervisor
    down(healing)
    assert not list(healing.run_dir.glob("*.pid"))
    assert not [pid for pid in running if group_pids(pid)], "down left a process running"
    up(healing)
    acked = []
    for i in range(10):
        code, tid = chat(healing, 3000 + i, stream=i % 2 == 0)
        assert code == 200
        acked.append(tid)
    rows = eventually_stored(healing, acked)
    assert before | set(acked) <= set(rows) and len(rows) == len(set(rows))
