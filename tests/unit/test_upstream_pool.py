"""The forwarder's upstream client against real sockets: what a deployment sends arrives whole
and in order, connections are kept alive and replaced when the server closed them, and each
way of failing is the error the forwarder turns into its outcome."""

import asyncio

import pytest

from serve.upstream_pool import BrokenResponse, Unreachable, UpstreamPool, UpstreamTimeout

EVENTS = (b"data: one\n\n", b"data: two\r\n\r\n", b"data: [DONE]\n\n")


async def _serve(handler):
    """A TCP server on loopback; returns (base URL, server, the number of connections made)."""
    connections = []

    async def on_connect(reader, writer):
        connections.append(writer)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", server, connections


async def _read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return head + await reader.readexactly(length)


def _body_of(handler, pool: UpstreamPool) -> bytes:
    """What ``pool`` reads of one response from a server that answers with ``handler``."""

    async def main():
        url, server, _ = await _serve(handler)
        try:
            response = await pool.post(url, "/v1/chat/completions", b"{}")
            return await response.read()
        finally:
            await pool.aclose()
            server.close()

    return asyncio.run(main())


async def _chunked_stream(reader, writer, requests: int = 1):
    for _ in range(requests):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in EVENTS:  # each event in its own write, split mid-line as a slow server would
            for piece in (event[:4], event[4:]):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def test_a_stream_in_small_pieces_arrives_as_whole_lines_over_one_kept_alive_connection():
    async def main():
        url, server, connections = await _serve(lambda r, w: _chunked_stream(r, w, requests=2))
        pool = UpstreamPool()
        try:
            seen = []
            for _ in range(2):
                response = await pool.post(url, "/v1/chat/completions", b'{"a": 1}')
                assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
                seen.append([line async for group in response.line_groups() for line in group if line])
                response.close()
            return seen, len(connections)
        finally:
            await pool.aclose()
            server.close()

    seen, n_connections = asyncio.run(main())
    assert seen == [[b"data: one", b"data: two", b"data: [DONE]"]] * 2
    assert n_connections == 1


def test_a_body_that_ends_with_the_connection_is_read_to_its_end():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b'HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{"ok": ')
        await writer.drain()
        writer.write(b"true}")
        await writer.drain()

    assert _body_of(handler, UpstreamPool()) == b'{"ok": true}'


def test_an_idle_connection_the_server_closed_is_replaced_without_an_error():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        # then close the kept-alive connection, as a frontend's idle timeout does

    async def main():
        url, server, connections = await _serve(handler)
        pool = UpstreamPool()
        try:
            bodies = []
            for _ in range(3):
                response = await pool.post(url, "/v1/completions", b"{}")
                bodies.append(await response.read())
                response.close()
                await asyncio.sleep(0.05)
            return bodies, len(connections)
        finally:
            await pool.aclose()
            server.close()

    bodies, n_connections = asyncio.run(main())
    assert bodies == [b"ok"] * 3 and n_connections == 3


def test_nobody_listening_is_unreachable():
    async def main():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        await UpstreamPool().post(f"http://127.0.0.1:{port}", "/v1/completions", b"{}")

    with pytest.raises(Unreachable):
        asyncio.run(main())


def test_a_stream_cut_before_its_end_is_a_broken_response_not_an_ending():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(EVENTS[0]), EVENTS[0]))
        await writer.drain()  # and the connection closes: no terminating chunk

    async def main():
        url, server, _ = await _serve(handler)
        pool = UpstreamPool()
        lines = []
        try:
            response = await pool.post(url, "/v1/chat/completions", b"{}")
            async for group in response.line_groups():
                lines.extend(group)
        finally:
            assert [line for line in lines if line] == [b"data: one"]
            await pool.aclose()
            server.close()

    with pytest.raises(BrokenResponse):
        asyncio.run(main())


def test_a_deployment_that_goes_quiet_times_out():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    with pytest.raises(UpstreamTimeout):
        _body_of(handler, UpstreamPool(read_timeout=0.3))


def test_a_response_that_is_not_http_is_broken():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    with pytest.raises(BrokenResponse):
        _body_of(handler, UpstreamPool())
