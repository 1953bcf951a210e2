"""How soon a response's trace row can be queried by SQL, under steady load.

    .venv/bin/flywheel up -p sim && .venv/bin/python -m deploy.bench.freshness [--rate 100 --seconds 20]

Open-loop unary requests through the gateway at a fixed rate; a reader in a process of its own
(as a data team's client is; beside the load generator it waited for the GIL) polls the store (a
new ``TraceStore`` per look, as `flywheel sql` and `/v1/traces/query` open one) for the trace ids
that came back. Freshness of a row = the time the first look that saw it took its snapshot of the
store (the row was queryable by then) minus the time its response arrived; ``seen_by_query_s`` also
counts that look's own time, until its answer was in hand (the reader's latency, which grows with
the files a look opens). Prints p50 / p99 / max of both, the looks' durations, and how many rows
were never seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from datetime import datetime, timezone

from deploy.bench import pct
from deploy.bench.raw_client import RawConnection, open_loop, post_bytes
from deploy.stack.config import load_config
from traces.store import TraceStore


async def load(gateway: str, rate: float, seconds: float, answered: dict[str, float]) -> int:
    """Unary requests at ``rate`` for ``seconds``, open loop, over raw keep-alive connections:
    httpx's pool stalled this bench itself near 1,000 requests a second. Returns the errors."""
    url = f"{gateway}/v1/chat/completions"
    request = post_bytes(url, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    errors = 0

    def on_answer(conn: RawConnection, status: int, headers: dict[str, str], body: bytes) -> None:
        nonlocal errors
        if status == 200 and "x-trace-id" in headers:
            answered[headers["x-trace-id"]] = time.monotonic()
        elif status:  # a lost one is counted by open_loop
            errors += 1

    unanswered = await open_loop(url, request, rate, seconds, on_answer)
    return errors + unanswered


def watch(root, since: datetime, ready, stop, results) -> None:
    """Look every 0.05 s for the rows received since ``since``, ``ready`` set after the first look
    (a new process's first one takes seconds: the load waits for it), until ``stop``; then put on
    ``results`` when each was first seen, id -> (the look's snapshot, its answer; monotonic
    seconds, one clock for every process), and how long each look took."""
    seen, looks = {}, []
    while not stop.is_set():
        snapshot = time.monotonic()  # a new store lists its files when made
        ids = TraceStore(root).sql("SELECT trace_id FROM traces WHERE time_received >= $1", params=[since])
        now = time.monotonic()
        looks.append(now - snapshot)
        ready.set()
        for tid in ids.column("trace_id").to_pylist():
            seen.setdefault(tid, (snapshot, now))
        time.sleep(0.05)
    results.put((seen, looks))


def spread(values: list[float]) -> dict:
    return {
        "p50": round(pct(values, 0.5), 3),
        "p99": round(pct(values, 0.99), 3),
        "max": round(max(values), 3) if values else None,
    }


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
    spawn = multiprocessing.get_context("spawn")
    answered, ready, stop, results = {}, spawn.Event(), spawn.Event(), spawn.Queue()
    since = datetime.now(timezone.utc)
    reader = spawn.Process(target=watch, args=(cfg.traces_path, since, ready, stop, results), daemon=True)
    reader.start()
    if not ready.wait(timeout=60):
        raise SystemExit("the reader could not query the store within 60 s")
    errors = asyncio.run(load(gw.url, args.rate, args.seconds, answered))
    time.sleep(args.grace)  # the reader sees what it can meanwhile; only answered ids count
    stop.set()
    seen, looks = results.get(timeout=60)
    reader.join()
    seen = {tid: at for tid, at in seen.items() if tid in answered}
    print(
        json.dumps(
            {
                "rate": args.rate,
                "seconds": args.seconds,
                "answered": len(answered),
                "errors": errors,
                "never_seen": len(answered) - len(seen),
                "freshness_s": spread([seen[t][0] - answered[t] for t in seen]),
                "seen_by_query_s": spread([seen[t][1] - answered[t] for t in seen]),
                "look_s": spread(looks),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
