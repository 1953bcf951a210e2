"""How often a client meets the server closing the idle connection it is about to reuse.

httpx keeps an idle connection 5 s (its default ``keepalive_expiry``, and so the openai SDK's);
uvicorn closes one after 5 s idle (its default ``timeout_keep_alive``, which the gateway ran
with until it got ``gateway.keep_alive_s``, 75 s). A request sent on a connection in the last moments of both is
written to a socket the server is closing. Each round: ``--clients`` clients each send a request,
idle 4.90-5.00 s, and send another on the same connection; the failures are counted for each
``--keep-alive`` of the server, side by side in one run. Nothing here is the gateway: a bare ASGI
app that answers 200, so only the two timers meet.

    .venv/bin/python -m deploy.bench.keepalive --keep-alive 5 75
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import threading
import time

import httpx
import uvicorn

IDLE_S = (4.90, 5.00)  # the last 100 ms before httpx lets the connection go


async def _ok(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _serve(keep_alive_s: int) -> tuple[uvicorn.Server, threading.Thread, int]:
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_ok, log_level="error", timeout_keep_alive=keep_alive_s))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, sock.getsockname()[1]


async def _reuse(port: int) -> str | None:
    """None when the second request on one connection was answered, else the error's name."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        await client.post("/", content=b"x")
        await asyncio.sleep(random.uniform(*IDLE_S))
        try:
            await client.post("/", content=b"x")
            return None
        except httpx.HTTPError as exc:
            return type(exc).__name__


async def _rounds(port: int, clients: int, rounds: int) -> list[str | None]:
    out: list[str | None] = []
    for _ in range(rounds):
        out += await asyncio.gather(*(_reuse(port) for _ in range(clients)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep-alive", type=int, nargs="+", default=[5, 75], help="the server's idle keep-alive, seconds")
    ap.add_argument("--clients", type=int, default=100, help="connections reused at once, each round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for keep_alive_s in args.keep_alive:
        server, thread, port = _serve(keep_alive_s)
        got = asyncio.run(_rounds(port, args.clients, args.rounds))
        server.should_exit = True
        thread.join(timeout=10)
        failed = [g for g in got if g]
        print(
            f"server keep-alive {keep_alive_s:>3} s: {len(failed)} of {len(got)} requests on a connection idle "
            f"{IDLE_S[0]:.2f}-{IDLE_S[1]:.2f} s failed {sorted(set(failed)) or ''}",
            flush=True,
        )


if __name__ == "__main__":
    main()
