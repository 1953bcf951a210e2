"""The loop's in-process verifiers harness sends a turn again while the gateway or a deployment
is unavailable for now, and ends the rollout when verifiers' interception server says so."""

import asyncio

import httpx
import pytest
from openai import APIConnectionError, AsyncOpenAI

from envs.vf_harness import TRIES, complete

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

    return asyncio.run(run()), len(sent)


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
def test_a_turn_that_may_have_reached_the_server_is_not_sent_twice(failure):
    with pytest.raises(APIConnectionError):
        turn([failure])
