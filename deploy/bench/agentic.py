"""The agentic workload against a running deployment: per-run latency, throughput and prefix reuse.

    flywheel up -p sim && python -m deploy.bench.agentic --concurrency 16 --out bench-out/run
    python -m deploy.bench.agentic --mooncake trace.jsonl --scale 0.05 --out bench-out/trace

Sessions (growing prompts over a long history) and cold arrivals are served by ``--concurrency``
simulated users, each taking the next job when its last one ends; a Mooncake trace is replayed
open-loop at its timestamps. Everything is streamed from the Dynamo frontend's completions API
with token-id prompts. Reported: TTFT and ITL p50/p90/p99, tokens/s per user (each request's
output over its duration), output tokens/s in total, queue wait (Little's law over the waiting
requests sampled from the frontend's and workers' metrics), and prefix reuse (the engines'
``cached_tokens``) as a fraction of the ideal (``workload.ideal_cached`` over the send order).
Writes ``<out>.json`` and ``<out>.png``; the studies (``deploy.bench.studies``) call ``run``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from deploy.bench import pct
from deploy.bench.workload import Job, Request, SessionShape, ideal_cached, mooncake_plan, session_plan

WAITING_GAUGES = ("dynamo_frontend_queued_requests", "vllm:num_requests_waiting")


@dataclass
class Target:
    """Where requests go: the Dynamo frontend (its own session header), or gateway replicas (taken
    in turn, request by request, with a key; sessions as clients send them, ``X-Session-ID``)."""

    urls: list[str]
    headers: dict[str, str] = field(default_factory=dict)
    session_header: str = "x-dynamo-session-id"
    sent: int = 0

    def next_url(self) -> str:
        self.sent += 1
        return self.urls[(self.sent - 1) % len(self.urls)]


async def send(client: httpx.AsyncClient, target: Target, model: str, req: Request, out: list[dict]) -> None:
    body = {
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "nvext": {"extra_fields": ["worker_id"]},
    }
    headers = {**target.headers, **({target.session_header: req.session} if req.session else {})}
    url = target.next_url()
    rec = {
        "sent": time.perf_counter(),
        "prompt": len(req.prompt),
        "prompt_ids": req.prompt,
        "session": req.session,
        "tokens": [],
        "cached": 0,
        "worker": None,
        "error": None,
        "text": "",
    }
    out.append(rec)
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    rec["tokens"].append(time.perf_counter())
                    rec["text"] += chunk["choices"][0]["text"]
                if chunk.get("nvext", {}).get("worker_id"):
                    rec["worker"] = chunk["nvext"]["worker_id"].get("decode_worker_id")
                if chunk.get("usage"):
                    rec["cached"] = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                    rec["completion_tokens"] = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["done"] = time.perf_counter()


async def sample_waiting(urls: list[str], samples: list[float], stop: asyncio.Event) -> None:
    """Requests waiting anywhere (router queue + engine queues), every 100 ms."""
    async with httpx.AsyncClient(timeout=2) as client:
        while not stop.is_set():
            total = 0.0
            for u in urls:
                try:
                    text = (await client.get(f"{u}/metrics")).text
                except httpx.HTTPError:
                    continue
                for line in text.splitlines():
                    if line.startswith(WAITING_GAUGES):
                        total += float(line.rsplit(" ", 1)[1])
            samples.append(total)
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except asyncio.TimeoutError:
                pass


async def drive(
    target: Target, model: str, jobs: list[Job], concurrency: int, metrics_urls: list[str]
) -> tuple[list[dict], float, list[float]]:
    out: list[dict] = []
    waiting: list[float] = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency + 64, max_keepalive_connections=concurrency + 64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        sampler = asyncio.create_task(sample_waiting(metrics_urls, waiting, stop))
        t0 = time.perf_counter()
        if all(j.requests[0].at_s is not None for j in jobs):  # trace replay: open loop

            async def at(req: Request):
                await asyncio.sleep(max(0.0, t0 + req.at_s - time.perf_counter()))
                await send(client, target, model, req, out)

            await asyncio.gather(*(at(j.requests[0]) for j in jobs))
        else:
            queue = list(reversed(jobs))

            async def user():
                while queue:
                    for req in queue.pop().requests:
                        await send(client, target, model, req, out)

            await asyncio.gather(*(user() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        stop.set()
        await sampler
    return out, wall, waiting


def summarize(records: list[dict], wall: float, waiting: list[float], block: int) -> dict:
    ok = [r for r in records if r["error"] is None and r["tokens"]]
    ordered = sorted(records, key=lambda r: r["sent"])
    ideal = dict(zip(map(id, ordered), ideal_cached([r["prompt_ids"] for r in ordered], block)))
    ttft = [r["tokens"][0] - r["sent"] for r in ok]
    session_ttft = [r["tokens"][0] - r["sent"] for r in ok if r["session"]]  # turns, without cold arrivals
    itl = [b - a for r in ok for a, b in zip(r["tokens"], r["tokens"][1:])]
    per_user = [len(r["tokens"]) / (r["done"] - r["sent"]) for r in ok]
    out_tokens = sum(r.get("completion_tokens", len(r["tokens"])) for r in ok)
    ideal_total = sum(ideal[id(r)] for r in ok)
    mean_waiting = statistics.fmean(waiting) if waiting else 0.0
    workers = {r["worker"] for r in ok}
    session_workers: dict[str, set] = {}
    for r in ok:
        if r["session"]:
            session_workers.setdefault(r["session"], set()).add(r["worker"])
    ms = lambda xs, q: round(pct(xs, q) * 1000, 2)  # noqa: E731
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "wall_s": round(wall, 2),
        "ttft_ms": {"p50": ms(ttft, 0.5), "p90": ms(ttft, 0.9), "p99": ms(ttft, 0.99)},
        "session_ttft_ms": {"p50": ms(session_ttft, 0.5), "p90": ms(session_ttft, 0.9), "p99": ms(session_ttft, 0.99)},
        "itl_ms": {"p50": ms(itl, 0.5), "p90": ms(itl, 0.9), "p99": ms(itl, 0.99)},
        "tokens_per_s_per_user": {"p10": round(pct(per_user, 0.1), 1), "p50": round(pct(per_user, 0.5), 1)},
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "queue_wait_ms": round(mean_waiting / (len(ok) / wall) * 1000, 1) if ok else None,
        "mean_waiting_requests": round(mean_waiting, 2),
        "prefix_reuse_of_ideal": round(sum(r["cached"] for r in ok) / ideal_total, 3) if ideal_total else None,
        "cached_tokens": sum(r["cached"] for r in ok),
        "ideal_cached_tokens": ideal_total,
        "prompt_tokens": sum(r["prompt"] for r in ok),
        "workers_used": len(workers),
        "sessions_on_one_worker": round(sum(len(w) == 1 for w in session_workers.values()) / len(session_workers), 3)
        if session_workers
        else None,
        "_ttft": ttft,
        "_itl": itl,
    }


def run(
    url: str | Target,
    jobs: list[Job],
    concurrency: int,
    model: str = "tiny",
    block: int = 32,
    metrics_urls: list[str] | None = None,
) -> dict:
    """``url``: the Dynamo frontend, or a :class:`Target` (gateway replicas)."""
    target = url if isinstance(url, Target) else Target([url])
    records, wall, waiting = asyncio.run(drive(target, model, jobs, concurrency, metrics_urls or target.urls[:1]))
    result = summarize(records, wall, waiting, block)
    result["texts"] = {hash(tuple(r["prompt_ids"])): r["text"] for r in records if r["error"] is None}
    if result["errors"]:
        first = next(r["error"] for r in records if r["error"] is not None or not r["tokens"])
        result["first_error"] = first
    return result


def public(result: dict) -> dict:
    return {k: v for k, v in result.items() if not k.startswith("_") and k != "texts"}


def plot(results: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        for ax, key in ((a, "_ttft"), (b, "_itl")):
            xs = sorted(x * 1000 for x in r[key])
            if xs:
                ax.plot(xs, [i / len(xs) for i in range(len(xs))], label=name)
    a.set(xlabel="TTFT (ms)", ylabel="fraction of requests", xscale="log", title="time to first token")
    b.set(xlabel="ITL (ms)", ylabel="fraction of tokens", xscale="log", title="inter-token latency")
    a.legend(), b.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8100", help="the Dynamo frontend")
    p.add_argument(
        "--metrics-url",
        action="append",
        default=None,
        help="where to sample waiting requests (frontend, workers' system ports); repeatable",
    )
    p.add_argument("--model", default="tiny")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--block", type=int, default=32, help="the engines' KV block, for the ideal reuse")
    p.add_argument("--mooncake", type=Path, help="replay this Mooncake-style trace instead of sessions")
    p.add_argument("--scale", type=float, default=1.0, help="trace lengths x this")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace arrival times x this")
    p.add_argument("--limit", type=int, help="first N trace rows only")
    for name, f in SessionShape.model_fields.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(f.default), default=f.default, help=f.description)
    p.add_argument("--out", type=Path, default=Path("bench-out/agentic"))
    a = p.parse_args(argv)
    if a.mooncake:
        jobs = mooncake_plan(a.mooncake, scale=a.scale, time_scale=a.time_scale, limit=a.limit)
    else:
        jobs = session_plan(SessionShape(**{k: getattr(a, k) for k in SessionShape.model_fields}))
    result = run(a.url, jobs, a.concurrency, a.model, a.block, a.metrics_url)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(public(result), indent=2))
    plot({"run": result}, a.out.with_suffix(".png"), f"agentic workload, concurrency {a.concurrency}")
    print(json.dumps(public(result), indent=2))


if __name__ == "__main__":
    main()
