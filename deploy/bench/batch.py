"""The Batch API on the sim profile: its throughput against the same requests sent directly,
and what a running batch does to interactive time to first token, side by side in one run.

    .venv/bin/flywheel up -p sim && .venv/bin/python -m deploy.bench.batch [--lines 10000]

1. Direct: the batch's requests sent as ordinary requests through the gateway, closed loop, at
   each of ``--concurrency``; the best lines/s is the reference.
2. Batch: the same lines as one batch (``flywheel batch``'s path), lines/s from submit to done.
3. Interactive probes: streaming requests at ``--probe-rate``, in ``--rounds`` pairs of
   ``--probe-s`` windows alternated (nothing else running, then a batch running; A B A B, since
   one window's p50 alone varies by 0.93-1.18x here); TTFT p50 / p99 pooled per condition, the
   ratio per round, and the lines/s the batch still gets while it gives way to them.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time

import httpx
from openai import OpenAI

from deploy.bench import pct
from deploy.bench.gateway import one
from serve.upstream_http import upstream_client


def _body(i: int, max_tokens: int) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": max_tokens}


async def direct(url: str, n: int, max_tokens: int, concurrency: int) -> float:
    """Lines/s for n requests sent by ``concurrency`` closed-loop clients."""
    todo = iter(range(n))
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as http:

        async def client():
            for i in todo:
                r = await http.post(f"{url}/v1/chat/completions", json=_body(i, max_tokens))
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return n / (time.perf_counter() - t0)


def submit(sdk: OpenAI, n: int, max_tokens: int):
    lines = "\n".join(
        json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": _body(i, max_tokens)})
        for i in range(n)
    )
    f = sdk.files.create(file=("bench.jsonl", io.BytesIO(lines.encode())), purpose="batch")
    return sdk.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


async def wait_done(sdk: OpenAI, batch_id: str):
    while True:
        b = await asyncio.to_thread(sdk.batches.retrieve, batch_id)
        if b.status in ("completed", "failed", "cancelled", "expired"):
            return b
        await asyncio.sleep(0.2)


async def probes(url: str, rate: float, seconds: float, out: dict) -> None:
    """Streaming requests at ``rate`` for ``seconds``; TTFTs appended to ``out["p_ttft"]``."""
    # the gateway's own client (quick ACKs): the kernel's 40 ms delayed-ACK mode is not the servers'
    async with upstream_client(httpx.Timeout(60), httpx.Limits(max_connections=200)) as http:
        tasks, start = [], time.perf_counter()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one(http, url, out, "p")))
        await asyncio.gather(*tasks)


def _summary(out: dict) -> dict:
    return {
        "ttft_p50_ms": round(pct(out["p_ttft"], 0.5) * 1000, 1),
        "ttft_p99_ms": round(pct(out["p_ttft"], 0.99) * 1000, 1),
        "n": len(out["p_ttft"]),
        "errors": out["p_errors"],
    }


async def interleaved(sdk: OpenAI, args) -> dict:
    """Probe windows alone and with a batch running, alternated (A B A B) so that drift in the
    machine falls on both; a fresh batch per B window, cancelled after it."""
    alone, with_batch = _new(), _new()
    rounds, during = [], []
    for _ in range(args.rounds):
        a = _new()
        await probes(args.url, args.probe_rate, args.probe_s, a)
        background = await asyncio.to_thread(submit, sdk, args.lines, args.max_tokens)
        await asyncio.sleep(1)  # the batch's lines are flowing
        before = (await asyncio.to_thread(sdk.batches.retrieve, background.id)).request_counts.completed
        b, t0 = _new(), time.perf_counter()
        await probes(args.url, args.probe_rate, args.probe_s, b)
        still = await asyncio.to_thread(sdk.batches.retrieve, background.id)
        # what the batch still gets while it gives way (serve/batch/lanes.py)
        during.append((still.request_counts.completed - before) / (time.perf_counter() - t0))
        if still.status != "in_progress":
            raise SystemExit("the background batch ended inside a probe window: raise --lines")
        await asyncio.to_thread(sdk.batches.cancel, background.id)
        await wait_done(sdk, background.id)
        rounds.append(round(pct(b["p_ttft"], 0.5) / pct(a["p_ttft"], 0.5), 3))
        for src, dst in ((a, alone), (b, with_batch)):
            dst["p_ttft"] += src["p_ttft"]
            dst["p_errors"] += src["p_errors"]
    report = {
        "interactive_alone": _summary(alone),
        "interactive_with_batch": _summary(with_batch),
        "interactive_ttft_p50_ratio_per_round": rounds,
        "batch_lines_per_s_during_probes": round(sum(during) / len(during), 1),
    }
    report["interactive_ttft_p50_ratio"] = round(
        report["interactive_with_batch"]["ttft_p50_ms"] / report["interactive_alone"]["ttft_p50_ms"], 3
    )
    return report


def _new() -> dict:
    return {"p_ttft": [], "p_total": [], "p_errors": 0}


async def main_async(args) -> dict:
    sdk = OpenAI(base_url=f"{args.url}/v1", api_key="bench", max_retries=3)
    report = {"lines": args.lines, "max_tokens": args.max_tokens, "direct_lines_per_s": {}}
    for c in args.concurrency:
        report["direct_lines_per_s"][c] = round(await direct(args.url, args.lines, args.max_tokens, c), 1)
    best = max(report["direct_lines_per_s"].values())
    # the direct requests were interactive traffic: let their hold pass (serve/batch/lanes.py), so
    # the batch is timed alone
    await asyncio.sleep(args.hold_s)
    t0 = time.perf_counter()
    batch = await asyncio.to_thread(submit, sdk, args.lines, args.max_tokens)
    done = await wait_done(sdk, batch.id)
    report["batch_lines_per_s"] = round(done.request_counts.completed / (time.perf_counter() - t0), 1)
    report["batch_fraction_of_direct"] = round(report["batch_lines_per_s"] / best, 3)
    report["batch_failed"] = done.request_counts.failed
    report.update(await interleaved(sdk, args))
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--lines", type=int, default=10_000)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[16, 32])
    p.add_argument("--probe-rate", type=float, default=5.0)
    p.add_argument("--probe-s", type=float, default=15.0, help="one probe window")
    p.add_argument("--hold-s", type=float, default=2.5, help="gateway.batch.interactive_hold_s, plus a margin")
    p.add_argument("--rounds", type=int, default=4, help="alone / with-batch window pairs")
    print(json.dumps(asyncio.run(main_async(p.parse_args())), indent=2))


if __name__ == "__main__":
    main()
