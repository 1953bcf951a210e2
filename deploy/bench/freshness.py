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

import httpx

from deploy.bench import pct
from deploy.stack.config import load_config
from traces.store import TraceStore


class _Caller(asyncio.Protocol):
    """One keep-alive connection to the gateway, one request on it at a time, its answer read as
    raw bytes (status, ``x-trace-id``, ``content-length``). httpx's pool cannot offer 1,000
    requests a second from one core: its connection assignment grows with the requests waiting."""

    def __init__(self, idle: deque, answered: dict[str, float], tally: dict) -> None:
        self.idle, self.answered, self.tally, self.buffer, self.need = idle, answered, tally, b"", None
        self.busy = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def call(self, request: bytes) -> None:
        self.busy = True
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.need is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(": ", 1) for line in head[1:])
            self.status, self.trace_id = head[0].split(" ")[1], fields.get("x-trace-id")
            self.need = end + 4 + int(fields.get("content-length", 0))
        if len(self.buffer) < self.need:
            return
        if self.status == "200" and self.trace_id:
            self.answered[self.trace_id] = time.monotonic()
        else:
            self.tally["errors"] += 1
        self.tally["pending"] -= 1
        self.buffer, self.need, self.busy = self.buffer[self.need :], None, False
        self.idle.append(self)

    def connection_lost(self, exc) -> None:
        if self in self.idle:
            self.idle.remove(self)
        if self.busy:  # closed with a request on it
            self.busy = False
            self.tally["errors"] += 1
            self.tally["pending"] -= 1


async def load(gateway: str, rate: float, seconds: float, answered: dict[str, float]) -> int:
    """Unary requests at ``rate`` for ``seconds`` (open loop: one waiting for a free connection
    gets a new one); the errors."""
    url = httpx.URL(gateway)
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {url.host}:{url.port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    loop, idle, tally = asyncio.get_running_loop(), deque(), {"errors": 0, "pending": 0}

    async def connect() -> _Caller:
        _, caller = await loop.create_connection(lambda: _Caller(idle, answered, tally), url.host, url.port)
        return caller

    idle.extend([await connect() for _ in range(int(rate // 5) or 1)])
    n, start = int(rate * seconds), time.monotonic()
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        caller = idle.popleft() if idle else await connect()
        tally["pending"] += 1
        caller.call(request)
    deadline = time.monotonic() + 120
    while tally["pending"] > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for caller in idle:
        caller.transport.close()
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
