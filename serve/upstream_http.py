"""The gateway's HTTP client to its deployments, acknowledging what they send at once.

Dynamo's frontend does not set TCP_NODELAY on the connections it accepts, so a stream's first
token, written right after its response headers, waits (Nagle) until those headers are
acknowledged; on a busy keep-alive connection Linux delays that ACK by up to 40 ms. Measured on
the sim profile with batch lines in flight: ~45 ms instead of ~8 ms to first token for a third
to a half of interactive requests. So after each read the client sets TCP_QUICKACK (the kernel
clears it again, hence every read): the pending ACK goes out at once and the token follows.
"""

from __future__ import annotations

import socket
import typing

import httpcore
import httpx

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only; elsewhere nothing changes


class _QuickAckStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream):
        self._inner = inner
        self._sock = inner.get_extra_info("socket") if _QUICKACK is not None else None

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._inner.read(max_bytes, timeout)
        if self._sock is not None and data:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:  # closed under us: the next read says so
                pass
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, ssl_context, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        return await self._inner.start_tls(ssl_context, server_hostname, timeout)  # TLS: as it is

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class QuickAckBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend):
        self._inner = inner

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options=None) -> httpcore.AsyncNetworkStream:
        return _QuickAckStream(await self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options=None) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def upstream_client(timeout: httpx.Timeout, limits: httpx.Limits) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(limits=limits)
    # httpx takes no network backend, so its pool's is wrapped (httpcore's documented extension
    # point; the test of this module fails if httpx stops having it)
    pool = transport._pool
    pool._network_backend = QuickAckBackend(pool._network_backend)
    return httpx.AsyncClient(timeout=timeout, transport=transport)
