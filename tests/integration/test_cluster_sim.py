"""The stack across hosts (`-p cluster-sim`): five Linux network namespaces on one bridge, Dynamo
discovering over a real etcd, requests crossing hosts on its TCP request plane, two gateways
sharing Redis and one trace store. Up through the CLI as a user would; then hosts are killed
while traffic runs through both gateways, and everything sent is counted."""

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from deploy.stack import netns
from deploy.stack.launcher import components
from deploy.stack.processes import ProcessManager
from deploy.stack.sockets import group_listening_ports
from deploy.stack.frontend_instances import registered_ports
from tests.integration.conftest import hosts_cli, hosts_stack, off_host_listeners, own_hosts, wait_until
from traces.store import TraceStore

pytestmark = [pytest.mark.integration, pytest.mark.runs_last]

HOSTS = [
    *own_hosts("cluster-sim", "fwt", 1),
    "supervisor.poll_s=0.5",
    "gateway.trace_flush_age_s=5",  # a gateway host that dies leaves rows in its spool
]


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return hosts_cli("cluster-sim", home, HOSTS, *args)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with hosts_stack("cluster-sim", tmp_path_factory.mktemp("flywheel-cluster"), HOSTS) as cfg:
        yield cfg


def gateways(cfg) -> list[str]:
    return [f"http://{h.address}:{cfg.gateway.port}" for h in cfg.hosts.with_role("gateway")]


def host(cfg, name: str):
    return next(h for h in cfg.hosts.hosts if h.name == name)


def instances(cfg) -> int:
    return len(registered_ports(cfg.frontend_url) or ())


class Traffic:
    """Streams at a steady rate, alternating gateways, eight sessions in turn. A client whose
    connection to its gateway fails (refused, reset) retries once on the other one, as a client of
    a load balancer would. Each request ends as one kind: ok, retried (then ok), refused (an HTTP
    error), cut (the stream ended without its last event), lost (both connections failed)."""

    def __init__(self, cfg, rps: float = 8, max_tokens: int = 24):
        self.urls, self.period, self.max_tokens = gateways(cfg), 1 / rps, max_tokens
        self.kinds: Counter = Counter()
        self.acked: list[str] = []  # trace ids of complete answers
        self.acked_by: dict[str, list[str]] = {url: [] for url in self.urls}
        self.acked_at: dict[str, float] = {}  # trace id: when its answer completed (monotonic)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop = threading.Thread(target=self._run)

    def _stream(self, url: str, i: int) -> tuple[str, str | None]:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"session {i % 8}: turn {i}"}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        started = False
        try:
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": f"s{i % 8}"}, timeout=60
            ) as r:
                if r.status_code != 200:
                    r.read()
                    return "refused", f"{r.status_code} {r.text[:200]}"
                last = ""
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        started, last = True, line
                return ("ok", r.headers.get("x-trace-id")) if last.strip() == "data: [DONE]" else ("cut", last[:200])
        except httpx.TransportError as exc:
            return "lost", f"{type(exc).__name__} after {'some' if started else 'no'} tokens: {exc}"

    def _one(self, i: int) -> None:
        url = self.urls[i % 2]
        kind, detail = self._stream(url, i)
        if kind == "lost":
            url = self.urls[(i + 1) % 2]
            kind, detail = self._stream(url, i)
            kind = "retried" if kind == "ok" else kind
        self.kinds[kind] += 1
        if kind in ("ok", "retried"):
            self.acked_at[detail] = time.monotonic()
            self.acked.append(detail)
            self.acked_by[url].append(detail)
        else:
            self.errors.append(f"{kind}: {detail}")

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            t = threading.Thread(target=self._one, args=(i,))
            t.start()
            self._threads.append(t)
            i += 1
            time.sleep(self.period)
        for t in self._threads:
            t.join()

    def __enter__(self) -> "Traffic":
        self._loop.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._loop.join()

    def answered(self) -> int:
        return self.kinds["ok"] + self.kinds["retried"]

    def not_started_and_failed(self) -> list[str]:
        """Failures before the first token. A stream running on a worker that dies is moved by
        Dynamo's migration, except a session's: Dynamo retries it only on its pinned worker,
        which is dead, and cuts it (seen once in CI, under load); the acceptance allows those."""
        return [e for e in self.errors if not e.startswith("cut:")]

    def table(self, what: str) -> str:
        sent = len(self._threads)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items()))
        return f"{what}: sent {sent}, {kinds}" + (f"; first errors: {self.errors[:3]}" if self.errors else "")


def stored(cfg, trace_ids: list[str]) -> list[str]:
    quoted = ", ".join(f"'{t}'" for t in trace_ids)
    return (
        TraceStore(cfg.traces_path)
        .sql(f"SELECT trace_id FROM traces WHERE trace_id IN ({quoted})")
        .column("trace_id")
        .to_pylist()
    )


def test_up_places_each_component_on_its_host_listening_on_that_hosts_address_only(cluster):
    shown = json.loads(cli(cluster.home_path, "status", "--json").stdout)
    where = {r["name"]: r["host"] for r in shown}
    assert all(r["healthy"] for r in shown), [r for r in shown if not r["healthy"]]
    for comp in components(cluster):
        assert where[comp.name] == comp.host is not None
    listening, wrong = off_host_listeners(cluster)
    assert listening == {c.name for c in components(cluster)}, "a component listens on nothing"
    assert not wrong, f"listening beyond its host's address: {wrong}"
    # a process on a host has no route off this machine
    route = subprocess.run(
        [*netns.exec_prefix(cluster.hosts, host(cluster, "worker1")), "ip", "route"], capture_output=True, text=True
    )
    assert "default" not in route.stdout and route.stdout.strip()


def test_each_gateway_serves_and_either_one_finds_every_row(cluster):
    ids = {}
    for url in gateways(cluster):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": f"hello from {url}"}], "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        ids[url] = r.headers["x-trace-id"]
    sql = "SELECT trace_id FROM traces WHERE trace_id IN (" + ", ".join(f"'{t}'" for t in ids.values()) + ")"
    admin = {"Authorization": f"Bearer {cluster.admin_key()}"}

    def rows(url: str) -> int:
        r = httpx.post(f"{url}/v1/traces/query", json={"sql": sql}, headers=admin, timeout=30)
        assert r.status_code == 200, r.text
        return len(r.json()["rows"])

    for url in gateways(cluster):  # each gateway's query sees the row the other one wrote
        wait_until(lambda: rows(url) == 2, 60, f"both rows through {url}")


def test_a_worker_host_lost_fails_no_request_and_comes_back_by_itself(cluster):
    pm = ProcessManager(cluster.run_dir)
    wait_until(lambda: instances(cluster) == 2, 60, "both workers registered")
    lost = host(cluster, "worker1")
    with Traffic(cluster) as traffic:
        wait_until(lambda: traffic.answered() >= 40, 120, "traffic flowing")
        before = pm.pid("worker-0")
        dead = group_listening_ports(before)
        for pid in netns.pids(cluster.hosts, lost):  # the host dies: every process in it
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        gone_s = wait_until(
            lambda: not dead & (registered_ports(cluster.frontend_url) or dead), 60, "the dead worker out of routing"
        )
        wait_until(lambda: pm.pid("worker-0") not in (None, before) and instances(cluster) == 2, 120, "worker1 serving again")
        after = traffic.answered()
        wait_until(lambda: traffic.answered() >= after + 40, 120, "traffic after the host came back")
    print(
        f"\n{traffic.table('worker host lost')}; out of routing after {gone_s:.1f} s, "
        f"serving again {time.monotonic() - killed_at:.1f} s after the kill"
    )
    assert traffic.not_started_and_failed() == [] and traffic.answered() > 0, traffic.errors[:5]
    wait_until(lambda: len(stored(cluster, traffic.acked)) == len(traffic.acked), 60, "every answer's trace row")


def test_etcd_restarted_the_stack_keeps_serving_and_discovers_again(cluster):
    pm = ProcessManager(cluster.run_dir)
    wait_until(lambda: instances(cluster) == 2, 60, "both workers registered")
    with Traffic(cluster) as traffic:
        wait_until(lambda: traffic.answered() >= 20, 120, "traffic flowing")
        old = pm.pid("etcd")
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: pm.pid("etcd") not in (None, old), 30, "etcd restarted by the supervisor")
        # discovery works again: a worker started now registers (stopped gracefully: what it
        # streams finishes; a killed one is the worker-host test's)
        worker = pm.pid("worker-1")
        os.killpg(worker, signal.SIGTERM)
        wait_until(lambda: pm.pid("worker-1") not in (None, worker) and instances(cluster) == 2, 120, "a new registration")
        after = traffic.answered()
        wait_until(lambda: traffic.answered() >= after + 20, 120, "traffic after")
    print(f"\n{traffic.table('etcd restarted')}")
    assert traffic.kinds["ok"] == traffic.answered() > 0 and not traffic.errors, traffic.errors[:5]


def test_a_gateway_host_lost_loses_nothing_acknowledged(cluster):
    pm = ProcessManager(cluster.run_dir)
    lost = host(cluster, "gw2")
    lost_url = f"http://{lost.address}:{cluster.gateway.port}"

    def fresh_in_spool() -> bool:
        # an answer of gw2's acknowledged under 2 s ago and not in Parquet: its spool segment is
        # converted 5 s after it began (trace_flush_age_s), so a kill now still finds it there (a
        # kill at 20 answers once came 0.1 s after a conversion and found the spool empty)
        ids = list(traffic.acked_by[lost_url])
        only_spooled = set(ids) - set(stored(cluster, ids))
        return bool(only_spooled) and time.monotonic() - min(traffic.acked_at[t] for t in only_spooled) < 2

    with Traffic(cluster) as traffic:
        wait_until(lambda: traffic.answered() >= 20, 120, "traffic flowing")
        wait_until(fresh_in_spool, 60, "an answer of gw2's only in its spool")
        before = pm.pid("gateway-gw2")
        for pid in netns.pids(cluster.hosts, lost):
            os.kill(pid, signal.SIGKILL)
        by_lost = list(traffic.acked_by[lost_url])
        spooled = set(by_lost) - set(stored(cluster, by_lost))  # acknowledged, not yet in Parquet
        wait_until(lambda: traffic.kinds["retried"] >= 5, 60, "clients retrying on the other gateway")
        wait_until(lambda: pm.pid("gateway-gw2") not in (None, before), 60, "gw2's gateway restarted")
        after = traffic.kinds["ok"]
        wait_until(lambda: traffic.kinds["ok"] >= after + 20, 120, "both gateways answering again")
    print(f"\n{traffic.table('gateway host lost')}; {len(spooled)} of gw2's answers only in its spool when it died")
    assert not traffic.errors, traffic.errors[:5]
    assert spooled, "nothing was left in the lost gateway's spool: the kill came too late to test it"
    wait_until(lambda: len(stored(cluster, traffic.acked)) == len(traffic.acked), 60, "every acknowledged answer's row")
    assert len(set(stored(cluster, traffic.acked))) == len(stored(cluster, traffic.acked)), "a row stored twice"


def test_redis_lost_the_gateways_serve_on_their_local_share(cluster):
    pm = ProcessManager(cluster.run_dir)
    with Traffic(cluster) as traffic:
        wait_until(lambda: traffic.answered() >= 20, 120, "traffic flowing")
        old = pm.pid("redis")
        os.kill(old, signal.SIGKILL)
        after = traffic.answered()
        wait_until(lambda: traffic.answered() >= after + 30, 120, "traffic while Redis is gone")
        wait_until(lambda: pm.pid("redis") not in (None, old), 60, "Redis restarted on the control host")
    print(f"\n{traffic.table('redis lost')}")
    assert traffic.kinds["ok"] == traffic.answered() > 0 and not traffic.errors, traffic.errors[:5]


def test_a_worker_host_cut_off_for_30_s_fails_nothing_and_rejoins_once(cluster):
    pm = ProcessManager(cluster.run_dir)
    wait_until(lambda: instances(cluster) == 2, 120, "both workers registered")
    cut = host(cluster, "worker2")
    with Traffic(cluster) as traffic:
        wait_until(lambda: traffic.answered() >= 20, 120, "traffic flowing")
        netns.set_link(cluster.hosts, cut, up=False)
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 30:  # the partition lasts 30 s whatever the traffic does
                time.sleep(0.5)
        finally:
            netns.set_link(cluster.hosts, cut, up=True)
        wait_until(lambda: instances(cluster) == 2 and pm.pid("worker-1") is not None, 120, "worker2 serving again")
        after = traffic.answered()
        wait_until(lambda: traffic.answered() >= after + 40, 120, "traffic after healing")
    print(f"\n{traffic.table('worker host cut off 30 s')}; instances after healing: {instances(cluster)}")
    assert traffic.not_started_and_failed() == [] and traffic.answered() > 0, traffic.errors[:5]
    assert instances(cluster) == 2, "a worker registered twice after healing"
    wait_until(lambda: len(stored(cluster, traffic.acked)) == len(traffic.acked), 60, "every answer's trace row")
    rows = stored(cluster, traffic.acked)
    assert len(rows) == len(set(rows)), "a request answered (and stored) twice"


def _on_host(cluster, name: str) -> str | None:
    pid = ProcessManager(cluster.run_dir).pid(name)
    return next((h.name for h in cluster.hosts.hosts if pid in netns.pids(cluster.hosts, h)), None)


def _long_stream(url: str, key: str, model: str, out: list, started: threading.Event) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "a long one"}], "max_tokens": 1500, "ignore_eos": True}
    tokens, last = 0, ""
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={**body, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                tokens += 1
                started.set()
            last = line or last
    out.append((r.status_code, tokens > 1000, last.strip() == "data: [DONE]"))


def test_a_dedicated_deployment_spreads_over_the_worker_hosts_and_scales_down_without_cutting_a_stream(cluster):
    from serve.keys import KeyStore

    gw = gateways(cluster)[0]
    admin = {"Authorization": f"Bearer {cluster.admin_key()}"}
    _, key = KeyStore(cluster.resolved_gateway().keys_file).create("alpha")
    dep = httpx.post(
        f"{gw}/v1/deployments",
        json={"model": "tiny", "name": "spread", "replicas": 2, "team": "alpha"},
        headers=admin,
        timeout=30,
    )
    assert dep.status_code in (200, 201, 202), dep.text
    dep_id = dep.json()["id"]

    def seen() -> dict:
        return httpx.get(f"{gw}/v1/deployments/{dep_id}", headers=admin, timeout=30).json()

    wait_until(lambda: seen()["status"] == "RUNNING" and seen()["replicas"]["ready"] == 2, 120, "two replicas running")
    assert {_on_host(cluster, f"worker-{i}-{dep_id}") for i in (0, 1)} == {"worker1", "worker2"}
    done, started = [], [threading.Event() for _ in range(6)]
    streams = [threading.Thread(target=_long_stream, args=(gw, key, "alpha/spread", done, started[i])) for i in range(6)]
    for t, s in zip(streams, started):
        t.start()
        assert s.wait(30), "a long stream did not start"
    r = httpx.post(f"{gw}/v1/deployments/{dep_id}/scale", json={"replicas": 1}, headers=admin, timeout=30)
    assert r.status_code == 202, r.text
    wait_until(lambda: seen()["replicas"]["draining"] == 1, 30, "the replica scaled away draining")
    # the draining replica left routing (its etcd keys deleted): what is sent now goes to the other
    after = []
    for i in range(20):
        body = {"model": "alpha/spread", "messages": [{"role": "user", "content": f"after {i}"}], "max_tokens": 4}
        r = httpx.post(f"{gw}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert r.status_code == 200, r.text
        after.append(r.headers["x-trace-id"])
    quoted = ", ".join(f"'{t}'" for t in after)
    workers = f"SELECT DISTINCT worker_id FROM traces WHERE trace_id IN ({quoted})"
    wait_until(lambda: len(stored(cluster, after)) == 20, 60, "the rows of the requests sent while draining")
    assert len(TraceStore(cluster.traces_path).sql(workers).column("worker_id").to_pylist()) == 1, "sent to the draining replica"
    for t in streams:
        t.join(120)
    wait_until(lambda: seen()["status"] == "RUNNING" and seen()["replicas"]["ready"] == 1, 120, "one replica left")
    print(f"\ndedicated scale 2 -> 1 across hosts: {len(done)} long streams, {sum(d == (200, True, True) for d in done)} whole")
    assert done == [(200, True, True)] * 6, done
    httpx.delete(f"{gw}/v1/deployments/{dep_id}", headers=admin, timeout=30)
    wait_until(lambda: httpx.get(f"{gw}/v1/deployments/{dep_id}", headers=admin, timeout=30).status_code == 404, 60, "deleted")
