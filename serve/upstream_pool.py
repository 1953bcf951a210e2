"""The forwarder's HTTP/1.1 client to its deployments: keep-alive connections as asyncio
protocols, responses parsed by httptools (llhttp, the parser uvicorn serves the gateway with).

Why not httpx here: profiled on the sim profile at 50 streams/s, httpx's ``send`` (its pool's
anyio locks, URL parsing, the response's decoders) took about a quarter of the gateway's
event-loop time, the largest share of the latency the gateway added. Here a request is one
``write`` and a response is the parser fed from ``data_received``. httpx stays the client of the
admin routes (``serve.upstream_http``), where speed does not matter.

Quick ACKs, as in :mod:`serve.upstream_http`: TCP_QUICKACK after every read, or the kernel's
delayed ACK holds a first token back ~40 ms.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from urllib.parse import urlsplit

import httptools

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only
_HIGH_WATER = 1 << 20  # a client reading slower than its deployment writes: stop reading here


class UpstreamError(Exception):
    """The deployment could not be talked to, or broke off: the forwarder's outcome says which."""


class Unreachable(UpstreamError):
    """No connection (refused, reset before any answer, DNS): nothing reached the deployment."""


class UpstreamTimeout(UpstreamError):
    """The deployment sent nothing for the read timeout."""


class BrokenResponse(UpstreamError):
    """The connection ended, or the HTTP framing was wrong, in the middle of a response."""


class _Expired(Exception):
    """A wait's timer fired (see :func:`_within`)."""


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


async def _within(fut: asyncio.Future, timeout: float | None) -> bool:
    """Wait for ``fut``; False once ``timeout`` passed first. One timer: ``asyncio.wait_for``
    adds a future, a callback and their cleanup to every wait, and this one runs for every
    piece of a stream."""
    if timeout is None:
        await fut
        return True
    handle = fut.get_loop().call_later(timeout, _expire, fut)
    try:
        await fut
    except _Expired:
        return False
    finally:
        handle.cancel()
    return True


class UpstreamResponse:
    """One response: ``status`` and ``headers`` on arrival, then the body as it comes."""

    def __init__(self, conn: _Connection, read_timeout: float | None):
        self._conn, self._timeout = conn, read_timeout
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None
        self.complete = False  # the whole body has arrived
        self.started = False  # some of the response has arrived
        self.until_close = False  # no length, not chunked: the body ends with the connection
        self.headers_done: asyncio.Future = conn.loop.create_future()

    # -- fed by the connection ------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._conn.paused:
            self._conn.paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self.complete:
            return
        self._error = error
        if not self.headers_done.done():
            self.headers_done.set_exception(error)
        self._wake()

    # -- read by the forwarder ------------------------------------------------------------------

    async def chunk(self) -> bytes:
        """The next piece of the body; b"" once it is all read. Raises :class:`UpstreamError`."""
        while not self._chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = self._conn.loop.create_future()
            try:
                if not await _within(self._waiter, self._timeout):
                    raise UpstreamTimeout(f"no data from the deployment for {self._timeout:g} s")
            finally:
                self._waiter = None
        # everything that has arrived: pieces that came in one loop turn are answered together
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered -= len(data)
        if self._conn.paused and self._buffered <= _HIGH_WATER // 2 and not self._conn.closed:
            self._conn.paused = False
            self._conn.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        parts = []
        while piece := await self.chunk():
            parts.append(piece)
        return b"".join(parts)

    async def line_groups(self):
        """The body's lines, without their line ends (an SSE stream's fields), in groups: the
        whole lines of all that had arrived by each read, so they can be answered at once."""
        rest = b""
        while piece := await self.chunk():
            rest += piece
            if b"\n" not in piece:
                continue
            *whole, rest = rest.split(b"\n")
            yield [line[:-1] if line.endswith(b"\r") else line for line in whole]
        if rest:
            yield [rest]

    def close(self) -> None:
        """Done with it: a connection whose response was read whole goes back to the pool."""
        self._conn.release(self)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool, key: tuple[str, int]):
        self.pool, self.key = pool, key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.paused = False
        self.response: UpstreamResponse | None = None
        self._sock = None
        self._parser = httptools.HttpResponseParser(self)
        self._keep_alive = False
        self._length_known = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock if _QUICKACK is not None else None

    def data_received(self, data: bytes) -> None:
        if self._sock is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:  # closed under us: connection_lost follows
                pass
        r = self.response
        if r is None:  # bytes nobody asked for: this connection cannot be trusted again
            self.transport.close()
            return
        r.started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            r._fail(BrokenResponse(f"the deployment sent invalid HTTP: {exc}"))
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.pool.forget(self)
        r = self.response
        if r is None or r.complete:
            return
        if r.until_close and r.headers_done.done():
            r._finish()
        elif not r.started:
            r._fail(Unreachable(f"the deployment closed the connection before answering ({exc or 'EOF'})"))
        else:
            r._fail(BrokenResponse(f"the deployment closed the connection mid-response ({exc or 'EOF'})"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.decode("latin-1").lower()
        self.response.headers[name] = value.decode("latin-1")
        if name == "content-length" or (name == "transfer-encoding" and b"chunked" in value.lower()):
            self._length_known = True

    def on_headers_complete(self) -> None:
        r = self.response
        r.status = self._parser.get_status_code()
        r.until_close = not self._length_known
        self._keep_alive = self._parser.should_keep_alive()
        r.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.response._feed(body)

    def on_message_complete(self) -> None:
        self.response._finish()

    # used by the pool and the response
    def send(self, head: bytes, body: bytes, read_timeout: float | None) -> UpstreamResponse:
        self._parser = httptools.HttpResponseParser(self)
        self._length_known = False
        self.response = UpstreamResponse(self, read_timeout)
        self.transport.writelines((head, body))  # not head + body: a long prompt is not copied
        return self.response

    def release(self, response: UpstreamResponse) -> None:
        if self.response is not response:
            return
        self.response = None
        if response.complete and self._keep_alive and not self.closed:
            self.pool.put_back(self)
        elif not self.closed:
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections per deployment address. ``post`` returns once the response's
    headers are in; a connection the server closed while idle is replaced, once, by a new one."""

    def __init__(self, connect_timeout: float = 5.0, read_timeout: float | None = 600.0, max_idle: int = 256):
        self.connect_timeout, self.read_timeout, self.max_idle = connect_timeout, read_timeout, max_idle
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._addresses: dict[str, tuple[str, int, str]] = {}

    def _address(self, base_url: str) -> tuple[str, int, str]:
        if (addr := self._addresses.get(base_url)) is None:
            u = urlsplit(base_url)
            if u.scheme != "http" or not u.hostname:
                raise ValueError(f"deployment URL {base_url!r}: only http://host[:port] is supported")
            port = u.port or 80
            addr = self._addresses[base_url] = (u.hostname, port, f"{u.hostname}:{port}" + u.path.rstrip("/"))
        return addr

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Connection(self, key), *key), self.connect_timeout)
        except asyncio.TimeoutError:
            raise Unreachable(f"no connection to {key[0]}:{key[1]} within {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise Unreachable(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return conn

    async def post(
        self, base_url: str, path: str, body: bytes, headers: dict[str, str] | None = None, headers_timeout: float | None = None
    ) -> UpstreamResponse:
        """The response, once its headers are in: within ``headers_timeout`` of sending (the read
        timeout when None), else :class:`UpstreamTimeout`."""
        host, port, authority = self._address(base_url)
        wait = self.read_timeout if headers_timeout is None else headers_timeout
        prefix = authority[len(f"{host}:{port}") :]
        head = (
            f"POST {prefix}{path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()) + "\r\n"
        ).encode("latin-1")
        key = (host, port)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn, head, body, wait)
            except Unreachable:  # closed by the server while it was idle: try the next one
                continue
        return await self._exchange(await self._connect(key), head, body, wait)

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes, wait: float | None) -> UpstreamResponse:
        response = conn.send(head, body, self.read_timeout)
        try:
            answered = await _within(response.headers_done, wait)
        except BaseException:  # cancelled (the caller's own timeout) or failed: not reusable
            conn.transport.close()
            raise
        if not answered:
            conn.transport.close()
            raise UpstreamTimeout(f"no answer from the deployment within {wait:g} s")
        return response

    def put_back(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.transport.close()

    def forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.transport.close()
        self._idle.clear()
