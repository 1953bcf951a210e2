"""A caller looping on bad requests gets its refusals answered at a bounded pace: every request
is still answered (with the same 4xx), only the answers past the burst wait; another caller, the
admin and good requests never wait."""

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from serve import refusal_pace
from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute
from serve.keys import KeyStore
from serve.refusal_pace import RefusalPace


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(refusal_pace.time, "monotonic", lambda: now[0])
    return now


def test_refusals_past_the_burst_wait_their_turn_and_quiet_refills_it(clock):
    pace = RefusalPace(per_s=10, burst=3, max_wait_s=0.35)
    assert [pace.wait_s(1) for _ in range(3)] == [0, 0, 0]
    assert [round(pace.wait_s(1), 6) for _ in range(4)] == [0.1, 0.2, 0.3, 0.35]  # owed, up to the cap
    assert pace.wait_s(2) == 0  # another caller
    clock[0] += 0.5  # half a second: five tokens back, less the 3.5 owed
    assert [pace.wait_s(1) > 0 for _ in range(2)] == [False, True]
    clock[0] += 10  # a long quiet: the whole burst, no more
    assert [pace.wait_s(1) > 0 for _ in range(4)] == [False, False, False, True]


def test_the_map_of_callers_stays_bounded(clock):
    pace = RefusalPace(per_s=10, burst=3, max_callers=5)
    for caller in range(50):
        pace.wait_s(caller)
    assert len(pace._buckets) == 5


def test_a_team_looping_on_bad_requests_is_answered_every_time_at_the_pace(tmp_path, monkeypatch):
    waits, wait_s = [], RefusalPace.wait_s
    # the pace's clock stands still (its module's alone, not the event loop's): on a slow machine
    # the bucket refilled between the requests and the last refusal owed nothing (CI at 83e122e)
    monkeypatch.setattr(refusal_pace, "time", SimpleNamespace(monotonic=lambda: 1000.0))

    def recorded(self, caller):  # what each refusal would wait; the test does not sleep it
        if (w := wait_s(self, caller)) > 0:
            waits.append(w)
        return 0.0

    monkeypatch.setattr(RefusalPace, "wait_s", recorded)
    keys = KeyStore(tmp_path / "keys.json")
    red, blue = keys.create("red")[1], keys.create("blue")[1]
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url="http://127.0.0.1:9")],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
        keys_file=str(tmp_path / "keys.json"),
        require_api_key=True,
        admin_key="adm",
        refusals_per_s=5,
        refusal_burst=2,
    )
    bad = {"model": "tiny", "messages": "not a list"}
    with TestClient(create_app(cfg)) as client:

        def post(key, path="/v1/chat/completions", body=bad):
            return client.post(path, json=body, headers={"Authorization": f"Bearer {key}"}).status_code

        assert [post(red) for _ in range(6)] == [400] * 6  # every one answered, as before
        assert len(waits) == 4 and waits == sorted(waits)  # past the burst of 2, each later one longer
        assert post(blue) == 400 and post("adm") == 400 and len(waits) == 4  # another team, the admin
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {red}"}).status_code == 200
        assert len(waits) == 4  # a good request of red's waits for nothing
        assert post(red, "/v1/traces/query", {"sql": "DROP TABLE traces"}) == 400 and len(waits) == 5  # any route
