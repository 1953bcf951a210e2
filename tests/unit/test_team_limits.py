"""A team's serverless limits (gateway.limits.<team>: rpm, tpm, max_concurrent) and budget
periods: exact across gateway replicas sharing Redis, answered as OpenAI answers them (429
rate_limit_exceeded, Retry-After, x-ratelimit-* headers), and never another team's business."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from serve.admission import Admission
from serve.config import Budget, GatewayConfig, Price, TeamLimits
from serve.errors import APIError
from serve.shared_state import SharedState
from tests.unit.conftest import seeded_gateway

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}


@pytest.fixture(params=["local", "redis"])
def states(request, tmp_path):
    """Two replicas' shared state: one Redis for both, or (local) one process's own."""
    if request.param == "local":
        state = SharedState(None)
        yield state, state
        return
    from tests.conftest import RedisServer

    server = RedisServer(tmp_path).start()
    yield SharedState(server.url, replica="a"), SharedState(server.url, replica="b")
    server.stop()


def _replicas(cfg: GatewayConfig, states) -> list[Admission]:
    """Two gateway replicas over a shared Redis; without Redis, one replica (a process's own books)."""
    if states[0] is states[1]:
        return [Admission(cfg, states[0])] * 2
    return [Admission(cfg, s) for s in states]


def _outcomes(calls) -> list:
    def run(call):
        try:
            return call()
        except APIError as err:
            return err

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_of_three_times_the_rpm_sent_at_once_through_two_replicas_exactly_the_limit_passes(states):
    cfg = GatewayConfig(limits={"red": TeamLimits(rpm=10)})
    replicas = _replicas(cfg, states)
    got = _outcomes([lambda r=replicas[i % 2]: r.rate_limit("red", (10, 100)) for i in range(30)])
    passed = [g for g in got if isinstance(g, dict)]
    refused = [g for g in got if isinstance(g, APIError)]
    assert len(passed) == 10 and len(refused) == 20
    assert all(e.status == 429 and e.code == "rate_limit_exceeded" and e.type == "requests" for e in refused)
    assert all(1 <= int(e.headers["Retry-After"]) <= 60 for e in refused)
    assert sorted(int(h["x-ratelimit-remaining-requests"]) for h in passed)[0] == 0
    assert {h["x-ratelimit-limit-requests"] for h in passed} == {"10"}
    assert replicas[1].rate_limit("blue", (10, 100)) == {}  # another team: no limit, no headers


def test_tpm_counts_the_prompt_and_max_tokens_at_admission(states):
    replicas = _replicas(GatewayConfig(limits={"red": TeamLimits(tpm=1000)}), states)
    first = replicas[0].rate_limit("red", (100, 500))
    assert first["x-ratelimit-remaining-tokens"] == "400" and first["x-ratelimit-limit-tokens"] == "1000"
    with pytest.raises(APIError) as refused:
        replicas[1].rate_limit("red", (100, 500))  # 1200 > 1000
    assert refused.value.type == "tokens" and "TPM" in refused.value.message
    assert replicas[1].rate_limit("red", (100, 300))["x-ratelimit-remaining-tokens"] == "0"


def test_max_concurrent_counts_requests_in_flight_and_frees_a_slot_when_one_ends(states):
    cfg = GatewayConfig(limits={"red": TeamLimits(max_concurrent=2)})
    a, b = _replicas(cfg, states)

    async def go():
        one = await a.admit("d1", "red", "tiny", BODY)
        two = await b.admit("d1", "red", "tiny", BODY)
        with pytest.raises(APIError) as refused:
            await a.admit("d1", "red", "tiny", BODY)
        assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
        await b.admit("d1", "blue", "tiny", BODY)  # another team is not held back
        a.release(one, "tiny", None)
        three = await b.admit("d1", "red", "tiny", BODY)
        for done in (two, three):
            a.release(done, "tiny", None)

    asyncio.run(go())


def test_a_daily_budget_counts_todays_spend_and_starts_afresh_the_next_day(states, monkeypatch):
    import serve.config

    cfg = GatewayConfig(budgets={"red": Budget(tokens=250, period="day")}, prices={"tiny": Price(input_per_mtok=1)})
    adm = Admission(cfg, states[0])
    day = [1_800_000_000.0]  # 2027-01-15 08:00 UTC
    monkeypatch.setattr(serve.config.time, "time", lambda: day[0])

    async def go():
        spent = await adm.admit("d1", "red", "tiny", BODY)
        adm.release(spent, "tiny", {"prompt_tokens": 20, "completion_tokens": 100})
        assert adm.usage("red")["spent_tokens"] == 120 and adm.usage("red")["period"] == "day"
        with pytest.raises(APIError) as refused:
            await adm.admit("d1", "red", "tiny", {**BODY, "max_tokens": 200})  # 120 + ~215 > 250
        assert refused.value.code == "insufficient_quota"
        day[0] += 86_400
        assert adm.usage("red")["spent_tokens"] == 0
        adm.release(await adm.admit("d1", "red", "tiny", {**BODY, "max_tokens": 200}), "tiny", None)

    asyncio.run(go())


def test_a_rate_limited_request_gets_the_openai_error_shape_and_headers(tmp_path):
    with seeded_gateway(tmp_path, limits={"red": TeamLimits(rpm=2)}) as (client, keys):
        auth = {"Authorization": f"Bearer {keys['red']}"}
        answers = [client.post("/v1/chat/completions", headers=auth, json=BODY) for _ in range(3)]
        assert [a.status_code == 429 for a in answers] == [False, False, True]  # the first two reach no engine here
        refused = answers[2]
        assert refused.json()["error"]["code"] == "rate_limit_exceeded" and refused.json()["error"]["type"] == "requests"
        assert int(refused.headers["retry-after"]) >= 1 and refused.headers["x-ratelimit-remaining-requests"] == "0"
        blue = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {keys['blue']}"}, json=BODY)
        assert blue.status_code != 429


def test_a_request_leaves_the_window_after_it_and_takes_its_tokens_with_it(states):
    """The window slides: once the first requests have left it, their requests and tokens no
    longer count (waited for as a condition, not a time)."""
    import time

    from serve.rate_window import RateWindow

    window = RateWindow(states[0], "fw:test-rate", window_s=0.5)
    assert window.admit("red", 40, 2, 100).admitted and window.admit("red", 40, 2, 100).admitted
    refused = window.admit("red", 1, 2, 100)
    assert not refused.admitted and (refused.requests, refused.tokens) == (2, 80) and 0 < refused.wait_s <= 0.5
    for _ in range(200):
        again = window.admit("red", 30, 2, 100)
        if again.admitted:
            break
        time.sleep(0.05)
    assert again.admitted and again.tokens in (70, 30)  # one or both of the first two have left
    assert window.admit("blue", 100, 2, 100).admitted  # another team's window is its own
