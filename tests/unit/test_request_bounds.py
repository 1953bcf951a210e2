"""One request must not stall the gateway: tools are bounded before any schema is read, new
schemas and large bodies are checked off the event loop, and hostile shapes are 400s."""

import threading

import pytest

from serve.tools import definitions
from tests.unit.test_gateway_errors import CHAT, assert_openai_error, client  # noqa: F401 (fixture)


def tool(i: int, params: dict | None = None) -> dict:
    return {
        "type": "function",
        "function": {"name": f"t{i}", "parameters": params or {"type": "object", "properties": {"q": {"type": "string"}}}},
    }


def nested(depth: int) -> bytes:
    """A chat request whose one tool's schema nests objects ``depth`` deep (as text: json cannot
    write it)."""
    schema = '{"type": "object", "properties": {"x": ' * depth + '{"type": "object"}' + "}}" * depth
    return (
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
        b'"function": {"name": "f", "parameters": ' + schema.encode() + b"}}]}"
    )


def test_more_tools_than_allowed_is_400_before_any_schema_is_read(client, monkeypatch):  # noqa: F811
    monkeypatch.setattr(definitions, "_checked_tools", lambda *a: pytest.fail("a schema was checked"))
    err = assert_openai_error(
        client.post("/v1/chat/completions", json={**CHAT, "tools": [tool(i) for i in range(129)]}), 400, "tools"
    )
    assert err["code"] == "invalid_tools" and "128" in err["message"]


def test_tools_over_the_byte_bound_are_400(client):  # noqa: F811
    big = {"type": "object", "properties": {f"p{j}": {"type": "string", "description": "x" * 1000} for j in range(600)}}
    err = assert_openai_error(client.post("/v1/chat/completions", json={**CHAT, "tools": [tool(0, big)]}), 400, "tools")
    assert "bytes" in err["message"]


@pytest.mark.parametrize("depth", [40, 500, 5000])
def test_a_deeply_nested_tool_schema_is_400_not_500(client, depth):  # noqa: F811
    r = client.post("/v1/chat/completions", content=nested(depth))
    # past ~500 levels the body itself is refused as too deep, before its tools are looked at
    err = assert_openai_error(r, 400, "tools" if depth < 500 else None)
    assert "deep" in err["message"]


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "function", "function": "t0"},
        {"type": "function", "function": {"name": ["t0"]}},
        {"type": "function", "function": None},
        ["t0"],
        7,
    ],
)
def test_a_malformed_tool_choice_is_400_not_500(client, choice):  # noqa: F811
    assert_openai_error(
        client.post("/v1/chat/completions", json={**CHAT, "tools": [tool(0)], "tool_choice": choice}), 400, "tool_choice"
    )


@pytest.mark.parametrize("depth", [2000, 200_000])
def test_deeply_nested_json_is_400_on_every_json_route(client, depth):  # noqa: F811
    deep = b"[" * depth + b"]" * depth
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "metadata": ' + deep + b"}"
    for path in ("/v1/chat/completions", "/v1/completions", "/inference/v1/generate"):
        err = assert_openai_error(client.post(path, content=body), 400)
        assert "deep" in err["message"] or "JSON" in err["message"]


def test_a_list_of_tools_checked_once_is_remembered(client, monkeypatch):  # noqa: F811
    calls = []
    real = definitions._checked_tools
    monkeypatch.setattr(definitions, "_checked_tools", lambda *a: calls.append(1) or real(*a))
    tools = [tool(i, {"type": "object", "properties": {"n": {"type": "integer", "minimum": i}}}) for i in range(3)]
    for _ in range(3):  # the deployment is down (503), but the tools were checked first
        assert client.post("/v1/chat/completions", json={**CHAT, "tools": tools}).status_code == 503
    assert calls == [1]


class Gate:
    """Wraps a function so that it blocks until released; says whether it has returned."""

    def __init__(self, fn):
        self.fn, self.entered, self.release, self.returned = fn, threading.Event(), threading.Event(), False

    def __call__(self, *args):
        self.entered.set()
        self.release.wait(20)
        try:
            return self.fn(*args)
        finally:
            self.returned = True


@pytest.mark.parametrize("what", ["new tools", "a large body"])
def test_the_event_loop_answers_others_while_a_heavy_request_is_checked(client, monkeypatch, what):  # noqa: F811
    import serve.api.completions

    if what == "new tools":
        gate = Gate(definitions._checked_tools)
        monkeypatch.setattr(definitions, "_checked_tools", gate)
        body = {**CHAT, "tools": [tool(i) for i in range(50)] + [tool(99, {"type": "object", "title": "unique"})]}
    else:
        gate = Gate(serve.api.completions._validated)
        monkeypatch.setattr(serve.api.completions, "_validated", gate)
        body = {**CHAT, "messages": [{"role": "user", "content": "x" * 400_000}]}
    heavy = threading.Thread(target=client.post, args=("/v1/chat/completions",), kwargs={"json": body})
    heavy.start()
    try:
        assert gate.entered.wait(20)
        assert client.get("/health").status_code == 200
        assert not gate.returned, "/health waited for the heavy request's check: it ran on the event loop"
    finally:
        gate.release.set()
        heavy.join(30)


def test_a_large_body_read_in_slices_means_what_one_read_means():
    """Decoded a message at a time and validated a slice at a time (so no single call holds the
    GIL long): the same body, the same prompt bytes, the same 400 at the same place."""
    import json

    from serve.api.completions import _validated
    from serve.errors import APIError

    many = {**CHAT, "messages": [{"role": "user", "content": f"m{i} é \\ud83d\\ude00"} for i in range(1000)]}
    raw = json.dumps(many).encode()
    assert _validated(raw, "chat", True) == _validated(raw, "chat")
    repeated = raw[:-1] + b', "messages": [{"role": "user", "content": "the last one counts"}]}'
    assert _validated(repeated, "chat", True) == _validated(repeated, "chat")
    assert _validated(repeated, "chat", True)[0]["messages"][0]["content"] == "the last one counts"
    ids = json.dumps({"model": "tiny", "prompt": list(range(5000))}).encode()  # numbers: one call
    assert _validated(ids, "text_completion", True) == _validated(ids, "text_completion")
    nan = raw[:-1] + b', "x_weight": NaN}'  # msgspec refuses it: the one-call way, json's fallback
    assert _validated(nan, "chat", True)[0]["messages"] == many["messages"]
    bad = json.loads(raw)
    bad["messages"][700]["role"] = "robot"
    for in_slices in (False, True):
        with pytest.raises(APIError) as refused:
            _validated(json.dumps(bad).encode(), "chat", in_slices)
        assert refused.value.status == 400 and refused.value.param == "messages.700.role"


def test_one_teams_heavy_work_takes_turns_and_another_team_does_not_wait():
    import asyncio

    from serve.team_turns import TeamTurns

    turns, release, order = TeamTurns(), threading.Event(), []

    def heavy(name: str) -> str:
        order.append(f"{name} started")
        if name == "red 1":
            release.wait(20)
        order.append(f"{name} done")
        return name

    async def go():
        first = asyncio.create_task(turns.run("red", heavy, "red 1"))
        second = asyncio.create_task(turns.run("red", heavy, "red 2"))
        while "red 1 started" not in order:
            await asyncio.sleep(0.01)
        assert await turns.run("blue", heavy, "blue") == "blue"  # while red's first still runs
        assert "red 2 started" not in order, "red's second heavy request ran beside its first"
        release.set()
        return await first, await second

    assert asyncio.run(go()) == ("red 1", "red 2")
    assert order.index("red 1 done") < order.index("red 2 started")


def test_the_map_of_teams_stays_bounded():
    import asyncio

    from serve.team_turns import TeamTurns

    turns = TeamTurns(max_teams=3)
    for i in range(10):
        asyncio.run(turns.run(f"team-{i}", int, "1"))
    assert len(turns._turns) == 3


def test_refused_heavy_work_makes_the_teams_next_heavy_work_wait(monkeypatch):
    """A team's heavy work of about the last second, when it ends in a 4xx, is paid for: its next
    heavy job waits 1/share - 1 times as long (3x at the default 0.25). Another team never
    waits for it, a 5xx (the gateway's fault) costs nothing, and old work has decayed away."""
    import asyncio

    from serve import team_turns
    from serve.errors import APIError
    from serve.team_turns import TeamTurns

    clock, waits = [100.0], []
    monkeypatch.setattr(team_turns.time, "monotonic", lambda: clock[0])

    async def sleep(seconds):
        waits.append(round(seconds, 6))
        clock[0] += seconds

    monkeypatch.setattr(team_turns.asyncio, "sleep", sleep)

    def work(seconds: float, status: int | None = None) -> str:
        clock[0] += seconds
        if status:
            raise APIError(status, "refused")
        return "done"

    async def go(turns: TeamTurns) -> None:
        async def run(team, seconds, status=None):
            try:
                return await turns.run(team, work, seconds, status)
            except APIError as exc:
                return exc.status

        assert await run("red", 0.08) == "done"  # a 20 MB body read and checked
        assert await run("red", 0.02, 400) == 400  # then refused: over the context
        assert waits == []
        assert await run("blue", 0.01) == "done" and waits == []  # another team does not wait
        assert await run("red", 0.01) == "done"
        assert waits == [0.29]  # (0.08 + 0.02) x 3 from the refusal; blue's 0.01 has passed since
        assert await run("red", 0.05, 503) == 503 and await run("red", 0.01) == "done"
        assert waits == [0.29]  # a 5xx is the gateway's: no wait
        clock[0] += 20  # what red did before has decayed away
        assert await run("red", 0.05, 400) == 400 and await run("red", 0.0) == "done"
        assert waits[1:] == [pytest.approx(0.15, abs=1e-3)]

    asyncio.run(go(TeamTurns(share=0.25)))
