"""The trace browser's list: newest first across days and pages exactly as one ORDER BY over
the whole store would give it, each filter keeping what it says, and rewards as the
``rewards`` view has them."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from serve.ui.queries import BadFilter, Reader, TraceFilters
from traces.feedback import write_feedback
from traces.store import TraceStore
from traces.writer import TraceWriter

T0 = datetime(2026, 11, 28, 22, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui-store")
    writer = TraceWriter(root, "seed")
    for i in range(40):  # 40 traces, one every 2 h 10 min: spread over four days
        writer.submit(
            {
                "trace_id": f"tr-{i:02d}",
                "team": "red" if i % 4 else "blue",
                "http_status": 200,
                "gen_ai_request_model": "tiny" if i % 3 else "other",
                "checkpoint_version": f"v{i % 5}",
                "gen_ai_conversation_id": f"s{i // 10}",
                "env_id": "math" if i % 2 else None,
                "time_received": T0 + timedelta(minutes=130 * i),
                "error": "upstream 503" if i % 7 == 0 else None,
                "response_tool_calls": json.dumps([{"function": {"name": "f", "arguments": "{}"}}]) if i % 6 == 0 else None,
                "gen_ai_input_messages": json.dumps(
                    [{"role": "user", "content": f"ask {i} 100% sure_x" if i == 13 else f"ask {i}"}]
                ),
                "response_content": f"answer {i}",
            }
        )
    writer.close()
    write_feedback(
        root,
        [
            {"trace_id": "tr-05", "team": "red", "name": "reward", "reward": 0.9},
            {"trace_id": "tr-06", "team": "red", "name": "reward", "reward": 0.1},
            {"trace_id": "tr-07", "team": "blue", "name": "reward", "reward": 0.9},  # not red's trace's team
            {"trace_id": "tr-09", "team": "admin", "name": "reward", "reward": 0.92},
        ],
    )
    write_feedback(root, [{"trace_id": "tr-06", "team": "red", "name": "reward", "reward": 0.95}])  # the latest counts
    return str(root)


def all_pages(reader: Reader, filters: TraceFilters, size: int) -> list[str]:
    ids, page = [], 0
    while True:
        rows, more = reader.traces(filters, page, size)
        ids += [r["trace_id"] for r in rows]
        if not more:
            return ids
        page += 1


@pytest.mark.parametrize("team", [None, "red"])
def test_pages_walk_the_store_newest_first_across_days(store, team):
    expected = [
        r["trace_id"]
        for r in TraceStore(store, team=team).sql("SELECT trace_id FROM traces ORDER BY time_received DESC").to_pylist()
    ]
    assert len({d for d in expected}) == (40 if team is None else 30)
    for size in (1, 3, 7, 50):
        assert all_pages(Reader(store, team, 30), TraceFilters(), size) == expected


@pytest.mark.parametrize(
    "filters, where",
    [
        (TraceFilters(model="other"), "gen_ai_request_model = 'other'"),
        (TraceFilters(checkpoint="v3"), "checkpoint_version = 'v3'"),
        (TraceFilters(session="s2"), "gen_ai_conversation_id = 's2'"),
        (TraceFilters(env="math"), "env_id = 'math'"),
        (TraceFilters(status="error"), "error IS NOT NULL"),
        (TraceFilters(status="ok", tools="1"), "error IS NULL AND response_tool_calls IS NOT NULL"),
        (
            TraceFilters(since="2026-11-30T01:00", until="2026-11-30T12:00"),
            "time_received BETWEEN '2026-11-30 01:00+00' AND '2026-11-30 12:00+00'",
        ),
        (TraceFilters(since="2026-11-30T03:00+02:00"), "time_received >= '2026-11-30 01:00+00'"),
        (TraceFilters(q="ANSWER 1"), "response_content ILIKE '%answer 1%'"),
        (TraceFilters(q="100% sure_x"), "trace_id = 'tr-13'"),
        (TraceFilters(q="1%"), "false"),  # % is text, not a wildcard (tr-13 says "100%")
    ],
)
def test_each_filter_keeps_exactly_what_it_says(store, filters, where):
    expected = [
        r["trace_id"]
        for r in TraceStore(store, team="red")
        .sql(f"SELECT trace_id FROM traces WHERE {where} ORDER BY time_received DESC")
        .to_pylist()
    ]
    assert all_pages(Reader(store, "red", 30), filters, 4) == expected


def test_rewards_follow_the_rewards_view(store):
    reader = Reader(store, None, 30)
    assert all_pages(reader, TraceFilters(reward_min="0.85"), 2) == ["tr-09", "tr-06", "tr-05"]
    rows = {r["trace_id"]: r["reward"] for r in reader.traces(TraceFilters(), 0, 40)[0]}
    assert (rows["tr-05"], rows["tr-06"], rows["tr-07"], rows["tr-09"]) == (0.9, 0.95, None, 0.92)
    assert all_pages(Reader(store, "red", 30), TraceFilters(reward_max="0.5"), 2) == []


def test_a_record_and_a_session(store):
    reader = Reader(store, "red", 30)
    assert reader.trace("tr-13")["response_content"] == "answer 13"
    assert reader.trace("tr-12") is None  # blue's
    assert [t["trace_id"] for t in reader.session("s1")] == [
        "tr-10",
        "tr-11",
        "tr-13",
        "tr-14",
        "tr-15",
        "tr-17",
        "tr-18",
        "tr-19",
    ]
    # the admin's one step and a team's two (ids and days first) give the same rows and columns
    everyone = Reader(store, None, 30).session("s1")
    assert [t["trace_id"] for t in everyone] == [f"tr-{i}" for i in range(10, 20)]
    assert [t for t in everyone if t["trace_id"] not in ("tr-12", "tr-16")] == reader.session("s1")
    assert reader.session("s-none") == [] and Reader(store, "blue", 30).session("s1")[0]["trace_id"] == "tr-12"


def test_unreadable_filters_say_which(store):
    for filters in (TraceFilters(since="soon"), TraceFilters(reward_min="x"), TraceFilters(status="bad")):
        with pytest.raises(BadFilter):
            Reader(store, "red", 30).traces(filters, 0, 10)
