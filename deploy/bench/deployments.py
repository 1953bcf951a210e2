"""What a dedicated deployment's lifecycle costs, side by side in one run on the running stack:
a bare worker's start (the reference), create -> first token, scale-up -> the new replica
ready, scale-down and delete drain times, and the requests that failed during each.

    .venv/bin/flywheel up -p sim && .venv/bin/python -m deploy.bench.deployments -p sim [--rate 10]

Traffic: chat requests to the deployment's ``served_model`` at ``--rate`` a second from the moment
it first answers until it is deleted (a non-200 is a failure, counted in the phase it was sent
in). The reference is one more worker of the same engine started the way `up` starts one (until
healthy and listed by its frontend), in a graph of its own that is stopped afterwards.
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

BODY = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": 8}


def bare_worker_start(cfg) -> float:
    """Seconds for a graph of one worker, started as `up` starts one, until it is listed."""
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
        return timings[comps[-1].name]
    finally:
        pm = ProcessManager(cfg.run_dir)
        for comp in reversed(comps):
            pm.stop(comp.name)


class Traffic(threading.Thread):
    def __init__(self, url: str, headers: dict, model: str, rate: float):
        super().__init__(daemon=True)
        self.url, self.headers, self.model, self.rate = url, headers, model, rate
        self.phase, self.sent, self.failed = "created", {}, {}
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=60) as c:
            while not self.stop.is_set():
                t, phase = time.monotonic(), self.phase
                try:
                    ok = (
                        c.post(
                            f"{self.url}/v1/chat/completions", json={**BODY, "model": self.model}, headers=self.headers
                        ).status_code
                        == 200
                    )
                except httpx.HTTPError:
                    ok = False
                self.sent[phase] = self.sent.get(phase, 0) + 1
                self.failed[phase] = self.failed.get(phase, 0) + (not ok)
                time.sleep(max(0.0, 1 / self.rate - (time.monotonic() - t)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--profile", default="sim")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--model", default=None, help="what to deploy (default: the profile's served model)")
    args = ap.parse_args()
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

    rows = [("bare worker start (reference)", bare_worker_start(cfg), None)]
    created = c.post(
        "/v1/deployments",
        json={"model": args.model or cfg.worker.served_model_name, "name": "bench", "replicas": 1, "team": "bench"},
    )
    if created.status_code != 202:
        raise SystemExit(f"create refused: {created.status_code} {created.text}")
    d = created.json()
    model = d["served_model"]
    first = lambda: c.post("/v1/chat/completions", json={**BODY, "model": model}).status_code == 200  # noqa: E731
    traffic = Traffic(url, headers, model, args.rate)
    try:
        rows.append(("create -> first token", until(first, "first token"), "created"))
        traffic.start()
        traffic.phase = "scale-up"
        c.post(f"/v1/deployments/{d['id']}/scale", json={"replicas": 2})
        rows.append(("scale 1 -> 2 -> new replica ready", until(ready(d["id"], 2), "scale-up"), "scale-up"))
        time.sleep(2)
        traffic.phase = "scale-down"
        c.post(f"/v1/deployments/{d['id']}/scale", json={"replicas": 1})
        rows.append(("scale 2 -> 1 drained and stopped", until(ready(d["id"], 1), "scale-down"), "scale-down"))
        time.sleep(2)
        traffic.phase = "delete"
        c.delete(f"/v1/deployments/{d['id']}")
        rows.append(
            ("delete drained and gone", until(lambda: c.get(f"/v1/deployments/{d['id']}").status_code == 404, "delete"), "delete")
        )
    finally:
        traffic.stop.set()
        if c.get(f"/v1/deployments/{d['id']}").status_code == 200:
            c.delete(f"/v1/deployments/{d['id']}")
    print(f"\n{args.profile}: dedicated deployment lifecycle, traffic {args.rate:g} req/s")
    print(f"{'phase':38} {'seconds':>8} {'sent':>6} {'failed':>7}")
    for name, seconds, phase in rows:
        sent = traffic.sent.get(phase, 0) if phase else "-"
        failed = traffic.failed.get(phase, 0) if phase else "-"
        print(f"{name:38} {seconds:8.2f} {sent!s:>6} {failed!s:>7}")
    ref, create = rows[0][1], rows[1][1]
    print(f"create -> first token / bare worker start: {create / ref:.2f}x")


if __name__ == "__main__":
    main()
