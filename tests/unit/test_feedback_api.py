"""Rewards posted to /v1/feedback are durable, team-scoped and join to traces in SQL."""

from traces.store import TraceStore


def post(client, key, body):
    return client.post("/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"})


def test_single_and_batch_feedback_join_to_traces_in_sql(setup, tmp_path):
    client, keys = setup
    r = post(client, keys["red"], {"trace_id": "tr-0", "reward": 1.0, "comment": "correct"})
    assert r.status_code == 200 and r.json()["data"][0]["trace_id"] == "tr-0"
    r = post(
        client,
        keys["red"],
        {
            "feedback": [
                {"trace_id": "tr-1", "reward": 0.0},
                {"trace_id": "tr-1", "name": "format", "score": 0.5},
                {"trace_id": "tr-0", "reward": 0.75},
            ]
        },
    )
    assert r.status_code == 200 and len(r.json()["data"]) == 3
    rows = (
        TraceStore(tmp_path / "traces")
        .sql("SELECT t.trace_id, r.name, r.reward, r.score, r.comment FROM traces t JOIN rewards r USING (trace_id) ORDER BY ALL")
        .to_pylist()
    )
    assert rows == [  # the latest reward for tr-0 wins; its comment is kept from the first post
        {"trace_id": "tr-0", "name": "reward", "reward": 0.75, "score": None, "comment": "correct"},
        {"trace_id": "tr-1", "name": "format", "reward": None, "score": 0.5, "comment": None},
        {"trace_id": "tr-1", "name": "reward", "reward": 0.0, "score": None, "comment": None},
    ]


def test_feedback_from_one_team_never_touches_another_teams_traces(setup, tmp_path):
    client, keys = setup
    assert post(client, keys["blue"], {"trace_id": "tr-0", "reward": -5}).status_code == 200  # a red trace
    assert post(client, keys["blue"], {"trace_id": "tr-5", "reward": 1}).status_code == 200  # its own
    store = TraceStore(tmp_path / "traces")
    assert store.sql("SELECT trace_id, reward FROM rewards ORDER BY ALL").to_pylist() == [{"trace_id": "tr-5", "reward": 1.0}]
    r = client.post(
        "/v1/traces/query", json={"sql": "SELECT count(*) FROM feedback"}, headers={"Authorization": f"Bearer {keys['red']}"}
    )
    assert r.json()["rows"] == [[0]]


def test_bad_feedback_gets_a_400_naming_the_field(setup):
    client, keys = setup
    for body, param in [
        ({"reward": 1}, "trace_id"),
        ({"trace_id": "tr-0"}, None),
        ({"trace_id": "tr-0", "reward": "high"}, "reward"),
        ({"feedback": []}, "feedback"),
    ]:
        r = post(client, keys["red"], body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param


def test_an_item_that_mentions_feedback_is_one_item_and_nan_is_no_reward(setup):
    client, keys = setup
    red = {"Authorization": f"Bearer {keys['red']}"}
    r = client.post("/v1/feedback", json={"trace_id": "tr-0", "comment": 'the "feedback" was good'}, headers=red)
    assert r.status_code == 200 and len(r.json()["data"]) == 1, r.text
    for bad in (
        b'{"trace_id": "tr-0", "reward": NaN}',
        b'{"trace_id": "tr-0", "score": Infinity}',
        b'{"feedback": [{"trace_id": "tr-0", "reward": -Infinity}]}',
        b"[1]",
        b"{",
        b"[" * 5000,
    ):
        r = client.post("/v1/feedback", content=bad, headers=red)
        assert r.status_code == 400 and r.json()["error"]["message"], (bad[:40], r.text)
    r = client.post("/v1/traces/query", json={"sql": "SELECT reward FROM feedback"}, headers=red)
    assert r.status_code == 200 and r.json()["rows"] == [[None]]
