"""The gateway's HTTP client to its deployments, acknowledging what they send at once.

Measured on the sim profile with batch lines in flight: a fifth to a half of interactive
streams got their first token ~40 ms late (a distinct mode at 44-57 ms against 7-15 ms; the
trace's ``ttft_ms`` put it upstream, after admission). 40 ms is Linux's minimum delayed ACK: the
deployment's first token, written after its response headers, waited for the headers' ACK
(Nagle on the frontend's side), which the gateway's kernel, on a busy keep-alive connection,
delays. Setting TCP_QUICKACK after each read (the kernel clears it again, hence every read)
sends the pending ACK at once; with it the 40 ms mode is gone from the same measurement.
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
        self._sock = None
        if _QUICKACK is not None:
            try:
                self._sock = inner.get_extra_info("socket")
            except (AttributeError, OSError):  # reset right after connect (anyio then fails on its
                pass  # peer name): the first read or write says so

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

    async def start_tls(
        self, ssl_context, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.start_tls(ssl_context, server_hostname, timeout)  # TLS: as it is

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class QuickAckBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend):
        self._inner = inner

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None, socket_options=None
    ) -> httpcore.AsyncNetworkStream:
        return _QuickAckStream(await self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options=None
    ) -> httpcore.AsyncNetworkStream:
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
