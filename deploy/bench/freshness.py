"""How soon a response's trace row can be queried by SQL, under steady load.

    .venv/bin/flywheel up -p sim && .venv/bin/python -m deploy.bench.freshness [--rate 100 --seconds 20]

Open-loop unary requests through the gateway at a fixed rate; a reader polls the store (a new
``TraceStore`` per look, as `flywheel sql` and `/v1/traces/query` open one) for the trace ids
that came back. Freshness of a row = the time it was first seen by SQL minus the time its
response arrived. Prints p50 / p99 / max and how many rows were never seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import deque

from deploy.bench import pct
from deploy.bench.raw_client import RawConnection, connect, post_bytes
from deploy.stack.config import load_config
from traces.store import TraceStore


async def load(gateway: str, rate: float, seconds: float, answered: dict[str, float]) -> int:
    """Unary requests at ``rate`` for ``seconds``, open loop (a request that finds no free
    connection opens one), over raw keep-alive connections: httpx's pool stalled this bench
    itself near 1,000 requests a second. Returns the errors."""
    url = f"{gateway}/v1/chat/completions"
    request = post_bytes(url, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    idle, tally = deque(), {"errors": 0, "pending": 0}

    def on_answer(conn: RawConnection, status: int, headers: dict[str, str], body: bytes) -> None:
        tally["pending"] -= 1
        if status == 200 and "x-trace-id" in headers:
            answered[headers["x-trace-id"]] = time.monotonic()
        else:
            tally["errors"] += 1
        if status:
            idle.append(conn)

    idle.extend([await connect(url, on_answer) for _ in range(int(rate // 5) or 1)])
    n, start = int(rate * seconds), time.monotonic()
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = idle.popleft() if idle else await connect(url, on_answer)
        tally["pending"] += 1
        conn.send(request)
    deadline = time.monotonic() + 120
    while tally["pending"] > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for conn in idle:
        conn.transport.close()
    return tally["errors"] + tally["pending"]


def watch(root, answered: dict[str, float], seen: dict[str, float], stop: threading.Event) -> None:
    while not stop.is_set():
        ids = TraceStore(root).sql("SELECT trace_id FROM traces WHERE time_received > now() - INTERVAL 10 MINUTE")
        now = time.monotonic()
        for tid in ids.column("trace_id").to_pylist():
            if tid in answered and tid not in seen:
                seen[tid] = now
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="sim")
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config key=value, as for up")
    ap.add_argument("--grace", type=float, default=10, help="seconds to keep looking after the load")
    args = ap.parse_args()
    cfg = load_config(args.profile, args.overrides)
    gw = cfg.resolved_gateway()
    answered, seen, stop = {}, {}, threading.Event()
    reader = threading.Thread(target=watch, args=(cfg.traces_path, answered, seen, stop), daemon=True)
    reader.start()
    errors = asyncio.run(load(gw.url, args.rate, args.seconds, answered))
    deadline = time.monotonic() + args.grace
    while len(seen) < len(answered) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    reader.join()
    lag = sorted(seen[t] - answered[t] for t in seen)
    print(
        json.dumps(
            {
                "rate": args.rate,
                "seconds": args.seconds,
                "answered": len(answered),
                "errors": errors,
                "never_seen": len(answered) - len(seen),
                "freshness_s": {
                    "p50": round(pct(lag, 0.5), 3),
                    "p99": round(pct(lag, 0.99), 3),
                    "max": round(lag[-1], 3) if lag else None,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
