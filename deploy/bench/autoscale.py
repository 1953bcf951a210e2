"""Autoscaling against static provisioning on `sim`: one traffic plan, replayed against three
arms, each on a fresh stack of its own: a deployment fixed at max replicas, one fixed at the
fewest a fixed deployment can have (1), and one autoscaled (min 0, max). Per arm it prints SLO
attainment (the share of requests with TTFT under ``--slo-ms``), TTFT p50/p90, failed requests
and replica-seconds (the deployment's own billing counter: ready and draining replicas, from
RUNNING to the delete).

    .venv/bin/python -m deploy.bench.autoscale [--slo-ms 500] [--out deploy/bench/results/DATE/autoscale]

Traffic: closed-loop clients (each sends its next request when its last one ends), as many
active as the plan says at each moment: quiet, a ramp to a burst, a plateau, quiet, silence, a
burst from zero. Each request is one streamed chat turn with a long prompt, the agentic shape
(a long prompt, a short answer), scaled down to the tiny model's 2,048-token context.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from deploy.stack.config import load_config
from deploy.stack.launcher import down, up

# (phase, seconds, active clients at its start, at its end)
PLAN = [
    ("quiet", 20, 1, 1),
    ("ramp", 20, 1, 12),
    ("plateau", 30, 12, 12),
    ("quiet", 20, 1, 1),
    ("silence", 40, 0, 0),
    ("burst from zero", 20, 12, 12),
]
PORTS = ["gateway.port=25000", "frontend.port=25100", "worker.system_port_base=25200", "worker.nixl_port_base=25700"]


def active_at(t: float) -> int:
    start = 0.0
    for _, seconds, first, last in PLAN:
        if t < start + seconds:
            return round(first + (last - first) * (t - start) / seconds)
        start += seconds
    return 0


class Clients:
    """``most`` closed-loop clients; client i runs while ``active_at(now) > i``."""

    def __init__(self, url: str, key: str, model: str, most: int, prompt_words: int, max_tokens: int):
        self.url, self.key, self.model, self.most = url, key, model, most
        self.body = {
            "model": model,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "messages": [{"role": "user", "content": " ".join(["context"] * prompt_words)}],
        }
        self.results: list[tuple[float, float | None, bool]] = []  # (sent at, ttft s, ok)
        self.replicas: list[tuple[float, int, int]] = []  # (at, ready, active clients)

    def run(self) -> None:
        self.t0 = time.monotonic()
        length = sum(p[1] for p in PLAN)
        threads = [threading.Thread(target=self._client, args=(i, length)) for i in range(self.most)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _client(self, i: int, length: float) -> None:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=300) as c:
            while (now := time.monotonic() - self.t0) < length:
                if active_at(now) <= i:
                    time.sleep(0.1)
                    continue
                ttft, ok = None, False
                try:
                    prompt = f"{i} {now:.3f} " + self.body["messages"][0]["content"]  # no two share a cache
                    body = {**self.body, "messages": [{"role": "user", "content": prompt}]}
                    with c.stream("POST", "/v1/chat/completions", json=body) as r:
                        for line in r.iter_lines():
                            if ttft is None and line.startswith("data: {") and '"content"' in line:
                                ttft = time.monotonic() - self.t0 - now
                        ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.results.append((now, ttft, ok))


def arm(name: str, replicas, autoscale: dict | None, args) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"flywheel-autoscale-{name}-"))
    sets = [f"home={home}", *PORTS, f"worker.speedup_ratio={args.speedup}", "worker.count=1", "dedicated.poll_s=0.5"]
    cfg = load_config("sim", sets, environ={})
    up(cfg)
    url, key = cfg.resolved_gateway().url, cfg.admin_key()
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            body = {"model": cfg.worker.served_model_name, "name": "bench", "replicas": replicas}
            dep = c.post("/v1/deployments", json=body | ({"autoscale": autoscale} if autoscale else {})).json()
            while c.get(f"/v1/deployments/{dep['id']}").json()["status"] != "RUNNING":
                time.sleep(0.2)
            clients = Clients(url, key, dep["served_model"], args.clients, args.prompt_words, args.max_tokens)
            stop = threading.Event()

            def watch():
                while not stop.is_set():
                    d = c.get(f"/v1/deployments/{dep['id']}").json()
                    at = time.monotonic() - clients.t0
                    clients.replicas.append((at, d["replicas"]["ready"], active_at(at)))
                    time.sleep(1)

            watcher = threading.Thread(target=watch)
            clients.t0 = time.monotonic()
            watcher.start()
            clients.run()
            stop.set()
            watcher.join()
            c.delete(f"/v1/deployments/{dep['id']}")
            billed = c.get(f"/v1/deployments/{dep['id']}").json()
    finally:
        down(cfg)
    ttfts = sorted(t for _, t, ok in clients.results if ok and t is not None)
    ok = [r for r in clients.results if r[2]]
    result = {
        "arm": name,
        "requests": len(clients.results),
        "failed": len(clients.results) - len(ok),
        "p50": statistics.quantiles(ttfts, n=100)[49] * 1000 if len(ttfts) > 1 else None,
        "p90": statistics.quantiles(ttfts, n=100)[89] * 1000 if len(ttfts) > 1 else None,
        "replica_s": billed.get("replica_seconds", 0.0),
        "timeline": clients.replicas,
        "ttft_ms": [None if t is None or not good else round(t * 1000, 1) for _, t, good in clients.results],
    }
    return result | {"slo": attained(result, args.slo_ms)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slo-ms", type=float, default=200.0, help="TTFT target")
    ap.add_argument("--max", type=int, default=3, help="max replicas (the fixed-max arm's count)")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--prompt-words", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--speedup", type=float, default=1.0, help="the mocker's speedup ratio")
    ap.add_argument("--target-concurrency", type=float, default=4.0)
    ap.add_argument("--out", default=None, help="write the table and the timeline (JSON) here")
    args = ap.parse_args()
    knobs = {
        "target_concurrency": args.target_concurrency,
        "scale_up_window_s": 2,
        "scale_down_delay_s": 10,
        "scale_to_zero_after_s": 20,
        "cold_start_timeout_s": 120,
    }
    arms = [
        arm("fixed at max", args.max, None, args),
        arm("fixed at 1", 1, None, args),
        arm("autoscaled", {"min": 0, "max": args.max}, knobs, args),
    ]
    lines = [
        f"sim, one plan ({', '.join(p[0] for p in PLAN)}; {sum(p[1] for p in PLAN)} s, up to {args.clients} clients), "
        f"TTFT SLO {args.slo_ms:.0f} ms, prompt {args.prompt_words} words, {args.max_tokens} tokens, "
        f"mocker speedup {args.speedup}",
        f"autoscaled: min 0, max {args.max}, {json.dumps(knobs)}",
        f"{'arm':<14}{'requests':>9}{'failed':>7}{'SLO met':>9}{'TTFT p50':>10}{'p90':>9}{'replica-s':>11}",
    ]
    for a in arms:
        p50 = f"{a['p50']:.0f}" if a["p50"] is not None else "-"
        p90 = f"{a['p90']:.0f}" if a["p90"] is not None else "-"
        lines.append(f"{a['arm']:<14}{a['requests']:>9}{a['failed']:>7}{a['slo']:>9.3f}{p50:>10}{p90:>9}{a['replica_s']:>11.1f}")
    targets = (150, 200, 300, 500)
    lines.append(
        "SLO attainment at other targets, same requests: "
        + "; ".join(f"{a['arm']} " + " ".join(f"{ms}ms {attained(a, ms):.3f}" for ms in targets) for a in arms)
    )
    top, auto = arms[0], arms[2]
    lines.append(
        f"autoscaled / fixed at max: SLO attainment {auto['slo'] / max(top['slo'], 1e-9):.2f}x (goal >= 0.95), "
        f"replica-seconds {auto['replica_s'] / max(top['replica_s'], 1e-9):.2f}x (goal <= 0.6)"
    )
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
        out.with_suffix(".json").write_text(json.dumps({a["arm"]: {k: a[k] for k in ("timeline", "ttft_ms")} for a in arms}))
        plot(arms, out.with_suffix(".png"))


def attained(arm: dict, slo_ms: float) -> float:
    """The share of the arm's requests answered with a first token within ``slo_ms``."""
    return sum(t is not None and t <= slo_ms for t in arm["ttft_ms"]) / max(1, len(arm["ttft_ms"]))


def plot(arms: list[dict], path: Path) -> None:
    """Ready replicas of each arm, and the plan's active clients, over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for a in arms:
        ax.step([t for t, _, _ in a["timeline"]], [r for _, r, _ in a["timeline"]], where="post", label=f"{a['arm']}: replicas")
    load = arms[-1]["timeline"]
    clients = ax.twinx()
    clients.plot([t for t, _, _ in load], [n for _, _, n in load], color="grey", linestyle=":", label="active clients")
    ax.set_xlabel("seconds")
    ax.set_ylabel("ready replicas")
    clients.set_ylabel("active clients")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
