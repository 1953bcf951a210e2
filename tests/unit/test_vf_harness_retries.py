"""The loop's in-process verifiers harness sends a turn again while the gateway or a deployment
is unavailable for now or its connection failed (each try under the turn's idempotency key),
ends the rollout when verifiers' interception server says so, and holds back none of its
rollouts' turns."""

import asyncio
import socket

import httpx
import pytest
from aiohttp import web
from openai import APIConnectionError, AsyncOpenAI

from envs.vf_harness import TRIES, complete, shared_http

ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
}


def turn(statuses: list[int | type[httpx.TransportError]]) -> tuple[object, int]:
    """One turn against an endpoint answering ``statuses`` in order (a status, or a transport
    error raised), then 200: what the harness got and how many requests were tried."""
    sent = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) <= len(statuses):
            status = statuses[len(sent) - 1]
            if not isinstance(status, int):
                raise status("as httpx raises it", request=request)
            return httpx.Response(status, json={"error": {"message": f"HTTP {status}"}}, headers={"Retry-After": "0"})
        return httpx.Response(200, json=ANSWER)

    async def run():
        http = httpx.AsyncClient(transport=httpx.MockTransport(endpoint))
        client = AsyncOpenAI(base_url="http://gateway/v1", api_key="k", max_retries=0, http_client=http)
        try:
            return await complete(client, model="tiny", messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()

    resp = asyncio.run(run())
    keys = {r.headers.get("Idempotency-Key") for r in sent}
    assert len(keys) == 1 and None not in keys  # every try of the turn under its one key
    return resp, len(sent)


def test_a_turn_refused_for_now_is_sent_again_until_it_is_answered():
    for statuses in ([503], [429, 502], [500, 503, 504]):
        resp, sent = turn(statuses)
        assert resp is not None and resp.choices[0].message.content == "ok", statuses
        assert sent == len(statuses) + 1


def test_the_interception_servers_end_of_rollout_is_not_retried():
    for status in (409, 400):
        assert turn([status]) == (None, 1)


def test_a_turn_still_refused_after_the_last_try_ends_the_rollout():
    assert turn([503] * TRIES) == (None, TRIES)


def test_a_turn_whose_connection_never_opened_is_sent_again():
    # a connect timeout: the server's event loop was too busy to take the connection in time
    resp, sent = turn([httpx.ConnectTimeout, httpx.ConnectError])
    assert resp is not None and resp.choices[0].message.content == "ok" and sent == 3


@pytest.mark.parametrize("failure", [httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError])
def test_a_turn_that_may_have_reached_the_server_is_sent_again_under_its_key(failure):
    """The interception server commits one turn per Idempotency-Key: a try of a turn it has
    already taken is answered with that turn, not taken twice."""
    resp, sent = turn([failure, failure])
    assert resp is not None and resp.choices[0].message.content == "ok" and sent == 3
    with pytest.raises(APIConnectionError):
        turn([failure] * TRIES)


def test_each_turn_has_a_key_of_its_own():
    keys = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        return httpx.Response(200, json=ANSWER)

    async def run():
        client = AsyncOpenAI(
            base_url="http://gateway/v1",
            api_key="k",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(endpoint)),
        )
        for _ in range(3):
            await complete(client, model="tiny", messages=[{"role": "user", "content": "hi"}])

    asyncio.run(run())
    assert len(set(keys)) == 3


def test_the_rollouts_of_one_loop_share_a_client_that_holds_none_of_their_turns_back():
    """150 rollouts' turns are all at the server at once (httpx's default pool would let 100 in)
    over one client; another event loop gets a client of its own."""
    rollouts = 150

    async def run() -> tuple[int, httpx.AsyncClient]:
        arrived, all_in = [0], asyncio.Event()

        async def answer(request: web.Request) -> web.Response:
            arrived[0] += 1
            if arrived[0] == rollouts:
                all_in.set()
            await all_in.wait()  # answered only once every turn is in
            return web.json_response(ANSWER)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = socket.create_server(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        await web.SockSite(runner, sock).start()
        try:
            clients = [
                AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, http_client=shared_http())
                for _ in range(rollouts)
            ]
            turns = [complete(c, model="tiny", messages=[{"role": "user", "content": "hi"}]) for c in clients]
            answered = await asyncio.wait_for(asyncio.gather(*turns), 60)
            return sum(a is not None for a in answered), shared_http()
        finally:
            await runner.cleanup()

    answered, first = asyncio.run(run())
    assert answered == rollouts
    assert asyncio.run(_loops_client()) is not first


async def _loops_client() -> httpx.AsyncClient:
    return shared_http()
