"""Latency the gateway adds, against calling the deployment directly, side by side.

    .venv/bin/flywheel up -p sim && .venv/bin/python -m deploy.bench.gateway [--rates 50,100,200,500]

Open-loop load at each fixed rate (requests are sent on schedule whether or not earlier ones
finished), streaming, with trace capture on (the gateway's normal path: durable spool, then
Parquet). Requests alternate between the gateway and the deployment's frontend, so both paths
see the same machine at the same moment. Reported: time to the first streamed token and to
the end, p50 / p99, and the difference (gateway minus direct).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time

import httpx

from deploy.bench import pct


async def one(client: httpx.AsyncClient, url: str, out: dict, key: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    t0 = time.perf_counter()
    first = None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out[key + "_errors"] += 1
                return
            async for line in r.aiter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.perf_counter() - t0
    except httpx.HTTPError:
        out[key + "_errors"] += 1
        return
    out[key + "_ttft"].append(first if first is not None else float("nan"))
    out[key + "_total"].append(time.perf_counter() - t0)


async def run_rate(gateway: str, direct: str, rate: float, seconds: float) -> dict:
    out = {k: [] for k in ("gw_ttft", "gw_total", "direct_ttft", "direct_total")}
    out.update(gw_errors=0, direct_errors=0)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
    # TCP_NODELAY: without it the client's small writes meet the server's delayed ACKs and the
    # direct path shows a ~40 ms artefact at moderate rates
    transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    async with httpx.AsyncClient(timeout=60, transport=transport) as client:
        tasks, n = [], int(rate * seconds)
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            url, key = (gateway, "gw") if i % 2 else (direct, "direct")
            tasks.append(asyncio.create_task(one(client, url, out, key)))
        achieved = n / (time.perf_counter() - start)
        await asyncio.gather(*tasks)
    row = {"rate": rate, "achieved_send_rate": round(achieved, 1), "errors": out["gw_errors"] + out["direct_errors"]}
    for metric in ("ttft", "total"):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            d, g = pct(out[f"direct_{metric}"], q) * 1000, pct(out[f"gw_{metric}"], q) * 1000
            row[f"{metric}_{name}_direct_ms"] = round(d, 2)
            row[f"{metric}_{name}_gateway_ms"] = round(g, 2)
            row[f"{metric}_{name}_added_ms"] = round(g - d, 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", default="http://127.0.0.1:8000")
    ap.add_argument("--direct", default="http://127.0.0.1:8100", help="the deployment's frontend")
    ap.add_argument("--rates", default="50,100,200,500")
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    rows = [asyncio.run(run_rate(args.gateway, args.direct, float(r), args.seconds))
            for r in args.rates.split(",")]
    print(json.dumps(rows, indent=2))
    print("\nrate  added TTFT p50 / p99 (ms)   added total p50 / p99 (ms)   errors")
    for r in rows:
        print(f"{r['rate']:>5.0f}  {r['ttft_p50_added_ms']:>8.2f} / {r['ttft_p99_added_ms']:<8.2f}"
              f"        {r['total_p50_added_ms']:>8.2f} / {r['total_p99_added_ms']:<8.2f}       {r['errors']}")


if __name__ == "__main__":
    main()
