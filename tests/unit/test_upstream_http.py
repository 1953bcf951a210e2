"""The gateway's upstream client: a stream relayed through its quick-ACK connections arrives
whole, and httpx still uses the backend it was given."""

import asyncio

import httpx

from serve.upstream_http import QuickAckBackend, upstream_client


def test_a_stream_written_in_small_pieces_arrives_whole_through_the_quick_ack_client():
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await reader.readuntil(b"\r\n\r\n")
        # headers, then each event on its own, as an SSE server without TCP_NODELAY writes them
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in (b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"):
            await writer.drain()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main() -> list[str]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = upstream_client(httpx.Timeout(10), httpx.Limits(max_connections=4))
        assert isinstance(client._transport._pool._network_backend, QuickAckBackend)
        try:
            async with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json={}) as r:
                return [line async for line in r.aiter_lines() if line]
        finally:
            await client.aclose()
            server.close()

    assert asyncio.run(main()) == ["data: one", "data: two", "data: [DONE]"]


def test_a_connection_reset_right_after_connect_is_the_transports_error_not_ours():
    import httpcore
    import pytest

    from serve.upstream_http import _QuickAckStream

    class ResetAfterConnect(httpcore.AsyncNetworkStream):
        """What anyio's stream does once the peer reset it: its extras fail, its reads raise."""

        def get_extra_info(self, info):
            raise AttributeError("'NoneType' object has no attribute 'getpeername'")

        async def read(self, max_bytes, timeout=None):
            raise httpcore.ReadError("connection reset by peer")

    stream = _QuickAckStream(ResetAfterConnect())  # no AttributeError here (it was a 500)
    with pytest.raises(httpcore.ReadError):  # httpx maps it, and the gateway fails over
        asyncio.run(stream.read(1024))
