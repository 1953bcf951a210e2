"""The benchmarks' load over raw HTTP/1.1 keep-alive connections: a request is bytes written
once, an answer is read by its framing only (``content-length`` or chunked). From one core,
httpx offered ~275 streamed requests a second before it saturated itself, and its pool stalled
near 1,000 unary requests a second (its connection assignment grows with the requests waiting);
this costs a small part of what the servers it measures spend."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable

import httpx

# (the connection, the status (0: the connection was lost first), lower-case headers, the body
# as it came: a chunked one with its chunk framing)
OnAnswer = Callable[["RawConnection", int, dict[str, str], bytes], None]


def post_bytes(url: str, body: dict) -> bytes:
    """A JSON POST to ``url`` as it goes on the wire."""
    parts, payload = httpx.URL(url), json.dumps(body).encode()
    head = (
        f"POST {parts.raw_path.decode()} HTTP/1.1\r\nhost: {parts.host}:{parts.port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


class RawConnection(asyncio.Protocol):
    """One request at a time; ``on_answer`` hears each answer, or that the connection was lost
    with a request on it. ``closed`` is done once the connection is."""

    def __init__(self, on_answer: OnAnswer) -> None:
        self.on_answer, self.buffer, self.busy = on_answer, b"", False
        self.head: tuple[int, dict[str, str], int] | None = None  # status, headers, where the body starts
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, request: bytes) -> None:
        self.busy = True
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines[1:])}
            self.head = int(lines[0].split(" ")[1]), headers, end + 4
        status, headers, start = self.head
        if "content-length" in headers:
            end = start + int(headers["content-length"])
            if len(self.buffer) < end:
                return
        elif self.buffer.endswith(b"\r\n0\r\n\r\n"):  # chunked: the last chunk (no trailers here)
            end = len(self.buffer)
        else:
            return
        body, self.buffer, self.head, self.busy = self.buffer[start:end], self.buffer[end:], None, False
        self.on_answer(self, status, headers, body)

    def connection_lost(self, exc) -> None:
        if self.busy:
            self.busy = False
            self.on_answer(self, 0, {}, b"")
        if not self.closed.done():
            self.closed.set_result(None)


async def connect(url: str, on_answer: OnAnswer) -> RawConnection:
    parts = httpx.URL(url)
    _, conn = await asyncio.get_running_loop().create_connection(lambda: RawConnection(on_answer), parts.host, parts.port)
    return conn


async def open_loop(url: str, request: bytes, rate: float, seconds: float, on_answer: OnAnswer, wait_s: float = 120) -> int:
    """``request`` sent at ``rate`` a second for ``seconds``, open loop: on schedule whether or not
    earlier ones were answered (one that finds no idle connection opens another). ``on_answer``
    hears each answer. Returns how many were never answered (their connection lost, or still
    unanswered ``wait_s`` after the last was sent)."""
    idle: deque[RawConnection] = deque()
    tally = {"pending": 0, "lost": 0}

    def answered(conn: RawConnection, status: int, headers: dict[str, str], body: bytes) -> None:
        tally["pending"] -= 1
        if status:
            idle.append(conn)
        else:
            tally["lost"] += 1
        on_answer(conn, status, headers, body)

    idle.extend([await connect(url, answered) for _ in range(int(rate // 5) or 1)])
    n, start = int(rate * seconds), time.monotonic()
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = idle.popleft() if idle else await connect(url, answered)
        tally["pending"] += 1
        conn.send(request)
    deadline = time.monotonic() + wait_s
    while tally["pending"] > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for conn in idle:
        conn.transport.close()
    return tally["lost"] + tally["pending"]
