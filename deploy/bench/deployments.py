"""What a dedicated deployment's lifecycle costs, side by side in one run on the running stack:
a bare worker's start (the reference), create -> first token, scale-up -> the new replica
ready, scale-down and delete drain times, and the requests that failed during each.

    .venv/bin/flywheel up -p sim && .venv/bin/python -m deploy.bench.deployments -p sim [--rate 10]

Traffic: chat requests to the deployment's ``served_model`` at ``--rate`` a second from the moment
it first answers until the delete (a non-200 is a failure): those sent during each scale and the
2 s after it, and for the delete those in flight when it was asked. The reference is one more
worker of the same engine started the way `up` starts one (until healthy and listed by its
frontend), in a graph of its own that is stopped afterwards.
"""

from __future__ import annotations

import argparse
import threading
import time

import httpx

from deploy.stack.config import load_config
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.graphs import graph_config
from deploy.stack.launcher import start_components
from deploy.stack.processes import ProcessManager

BODY = {"messages": [{"role": "user", "content": "bench"}]}


def bare_start(cfg) -> tuple[float, float]:
    """Seconds for a graph of one worker, started as `up` starts one: the worker alone (from its
    start to listed by its frontend) and the whole graph (event broker, frontend, worker)."""
    ref = {
        "id": "dep-bench0000000",
        "model_path": str(cfg.model_path),
        "served_model": "bench/reference",
        "replicas": {"desired": 1},
    }
    g = graph_config(cfg, ref, cfg.resolved_gateway().pool.max_replicas)  # an index no deployment of a small pool takes
    comps = deployment_components(g)
    try:
        timings, _ = start_components(g, comps)
        return timings[comps[-1].name], sum(timings.values())
    finally:
        pm = ProcessManager(cfg.run_dir)
        for comp in reversed(comps):
            pm.stop(comp.name)


class Traffic(threading.Thread):
    """Requests at ``rate`` a second, each kept as (sent, done, ok) in monotonic seconds."""

    def __init__(self, url: str, headers: dict, model: str, rate: float):
        super().__init__(daemon=True)
        self.url, self.headers, self.model, self.rate = url, headers, model, rate
        self.done: list[tuple[float, float, bool]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        senders = []
        with httpx.Client(timeout=60) as c:
            while not self.stop.is_set():
                t = time.monotonic()
                senders.append(threading.Thread(target=self._one, args=(c,), daemon=True))
                senders[-1].start()
                time.sleep(max(0.0, 1 / self.rate - (time.monotonic() - t)))
            for sender in senders:  # the client stays open for what is still in flight
                sender.join()

    def _one(self, c: httpx.Client) -> None:
        t = time.monotonic()
        try:
            r = c.post(f"{self.url}/v1/chat/completions", json={**BODY, "model": self.model}, headers=self.headers)
            ok = r.status_code == 200
            if not ok:
                self.errors.append(f"{r.status_code} {r.text[:160]}")
        except httpx.HTTPError as exc:
            ok = False
            self.errors.append(repr(exc))
        self.done.append((t, time.monotonic(), ok))

    def sent_between(self, start: float, end: float) -> tuple[int, int]:
        got = [ok for sent, _, ok in self.done if start <= sent < end]
        return len(got), got.count(False)

    def in_flight_at(self, moment: float) -> tuple[int, int]:
        got = [ok for sent, done, ok in self.done if sent < moment < done]
        return len(got), got.count(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--profile", default="sim")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=512, help="per request (long enough to be in flight at a delete)")
    ap.add_argument("--model", default=None, help="what to deploy (default: the profile's served model)")
    args = ap.parse_args()
    BODY["max_tokens"] = args.max_tokens
    cfg = load_config(args.profile, args.overrides)
    url, headers = cfg.resolved_gateway().url, {"Authorization": f"Bearer {cfg.admin_key()}"}
    c = httpx.Client(base_url=url, headers=headers, timeout=30)

    def until(check, what: str, timeout_s: float = 900) -> float:
        t0 = time.monotonic()
        while not check():
            if time.monotonic() - t0 > timeout_s:
                raise SystemExit(f"{what}: not within {timeout_s:.0f} s")
            time.sleep(0.1)
        return time.monotonic() - t0

    def dep(dep_id: str) -> dict:
        return c.get(f"/v1/deployments/{dep_id}").json()

    def ready(dep_id: str, n: int):
        return lambda: (lambda d: d.get("status") == "RUNNING" and d["replicas"]["ready"] == n)(dep(dep_id))

    worker, graph = bare_start(cfg)
    rows = [("bare worker start (reference)", worker, None), ("bare graph start (frontend + worker)", graph, None)]
    body = {"model": args.model or cfg.worker.served_model_name, "name": "bench", "replicas": 1, "team": "bench"}
    created = c.post("/v1/deployments", json=body)
    if created.status_code != 202:
        raise SystemExit(f"create refused: {created.status_code} {created.text}")
    d = created.json()
    model = d["served_model"]
    first = lambda: c.post("/v1/chat/completions", json={**BODY, "model": model}).status_code == 200  # noqa: E731
    traffic = Traffic(url, headers, model, args.rate)
    try:
        rows.append(("create -> first token", until(first, "first token"), None))
        traffic.start()
        for n, what in ((2, "scale 1 -> 2: the new replica ready"), (1, "scale 2 -> 1: drained and stopped")):
            t0 = time.monotonic()
            c.post(f"/v1/deployments/{d['id']}/scale", json={"replicas": n})
            rows.append((what, until(ready(d["id"], n), what), None))
            time.sleep(2)  # traffic on what the scale left
            rows[-1] = (*rows[-1][:2], traffic.sent_between(t0, time.monotonic()))
        traffic.stop.set()  # a deleted deployment takes no new requests: count those it was serving
        deleted_at = time.monotonic()
        c.delete(f"/v1/deployments/{d['id']}")
        gone = until(lambda: c.get(f"/v1/deployments/{d['id']}").status_code == 404, "delete")
        traffic.join()
        rows.append(("delete: drained and gone", gone, traffic.in_flight_at(deleted_at)))
    finally:
        traffic.stop.set()
        if c.get(f"/v1/deployments/{d['id']}").status_code == 200:
            c.delete(f"/v1/deployments/{d['id']}")
    print(f"\n{args.profile}: dedicated deployment lifecycle, traffic {args.rate:g} req/s")
    print(f"{'phase':40} {'seconds':>8} {'requests':>9} {'failed':>7}")
    for name, seconds, counts in rows:
        sent, failed = counts if counts else ("-", "-")
        print(f"{name:40} {seconds:8.2f} {sent!s:>9} {failed!s:>7}")
    for error in traffic.errors[:5]:
        print("failed:", error)
    print("(requests: sent during a scale and the 2 s after it; for the delete, those in flight when it was asked)")
    create = rows[2][1]
    print(f"create -> first token / bare worker start: {create / worker:.2f}x, / bare graph start: {create / graph:.2f}x")


if __name__ == "__main__":
    main()
