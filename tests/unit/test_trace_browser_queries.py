"""The trace browser's list: newest first across days and pages exactly as one ORDER BY over
the whole store would give it, each filter keeping what it says, and rewards as the
``rewards`` view has them."""

import json
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pytest

from serve.ui.queries import BadFilter, Reader, Span, TraceFilters, spans
from traces.ids import id_days
from traces.feedback import write_feedback
from traces.store import TraceStore, newest_received, newest_that_may_match
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
            {"trace_id": "tr-05", "team": "red", "name": "format", "reward": 0.0},  # another reward's name
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


@pytest.mark.parametrize("team", [None, "red", "blue"])
def test_checkpoint_rewards_are_the_rewards_views_grouped_by_checkpoint(store, team):
    stats = Reader(store, team, 30).by_checkpoint()
    view = TraceStore(store, team=team).sql(
        "SELECT coalesce(t.checkpoint_version, 'base') AS version, avg(r.reward) AS mean_reward, count(r.reward) "
        "AS rewarded FROM rewards r JOIN traces t USING (trace_id) WHERE r.name = 'reward' GROUP BY ALL"
    )
    assert {v: (s["mean_reward"], s["rewarded"]) for v, s in stats.items() if s["rewarded"]} == {
        r["version"]: (r["mean_reward"], r["rewarded"]) for r in view.to_pylist()
    }
    served = TraceStore(store, team=team).sql("SELECT checkpoint_version, count(*) AS n FROM traces GROUP BY ALL")
    assert {v: s["traces"] for v, s in stats.items()} == {r["checkpoint_version"]: r["n"] for r in served.to_pylist()}
    # by hand: the latest of tr-06's two, blue's reward on red's tr-07 nowhere, the admin's on tr-09
    # in the admin's figures only (a team's feedback view holds its own posts)
    expected = {None: {"v0": 0.9, "v1": 0.95, "v4": 0.92}, "red": {"v0": 0.9, "v1": 0.95}, "blue": {}}[team]
    assert {v: s["mean_reward"] for v, s in stats.items() if s["rewarded"]} == expected


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
    # a team's turns are the admin's, less the other team's
    everyone = Reader(store, None, 30).session("s1")
    assert [t["trace_id"] for t in everyone] == [f"tr-{i}" for i in range(10, 20)]
    assert [t for t in everyone if t["trace_id"] not in ("tr-12", "tr-16")] == reader.session("s1")
    assert reader.session("s-none") == [] and Reader(store, "blue", 30).session("s1")[0]["trace_id"] == "tr-12"


def test_unreadable_filters_say_which(store):
    for filters in (TraceFilters(since="soon"), TraceFilters(reward_min="x"), TraceFilters(status="bad")):
        with pytest.raises(BadFilter):
            Reader(store, "red", 30).traces(filters, 0, 10)


END = datetime(2026, 12, 2, tzinfo=timezone.utc)  # the burst store's newest day ends here


def gateway_id(at: datetime, n: int) -> str:
    return f"tr-{int(at.timestamp() * 1000):012x}{n:020x}"


@pytest.fixture(scope="module")
def burst(tmp_path_factory):
    """Traces dense where a list's spans meet: many in the newest day's last minutes, one on a
    span's edge, one at midnight, two at one instant, a day with none (a gap), rows a day apart."""
    times = [END - timedelta(seconds=7 * i + 1) for i in range(200)]  # 23 minutes: across 15 min
    times += [END - timedelta(minutes=15), END - timedelta(minutes=45), END - timedelta(days=1)]  # edges
    times += [END - timedelta(hours=h, seconds=13) for h in range(1, 24, 2)]
    times += [END - timedelta(days=4, hours=h) for h in range(0, 24, 5)]  # a day with none between
    times += [END - timedelta(hours=5)] * 2
    root = tmp_path_factory.mktemp("ui-burst")
    writer = TraceWriter(root, "seed")
    for i, at in enumerate(times):
        writer.submit(
            {
                "trace_id": gateway_id(at, i),
                "team": "red" if i % 3 else "blue",
                "http_status": 200,
                "time_received": at,
                "checkpoint_version": "old" if at < END - timedelta(days=2) else "new",
                "response_content": f"answer {i}",
            }
        )
    # no time: in the partition of the day it was written, today's, newer than all the others
    untimed = {"trace_id": "untimed", "team": "red", "checkpoint_version": "old", "response_content": "answer"}
    writer.submit({**untimed, "http_status": 200})
    writer.submit({"trace_id": "imported-7", "team": "red", "http_status": 200, "time_received": END - timedelta(hours=30)})
    # made 40 s before midnight, received just after it: a day later than its id says
    late = gateway_id(END - timedelta(days=1, seconds=40), 999)
    after_midnight = END - timedelta(days=1) + timedelta(seconds=1)
    writer.submit({"trace_id": late, "team": "red", "http_status": 200, "time_received": after_midnight})
    writer.close()
    return str(root), late


@pytest.mark.parametrize("team", [None, "red"])
def test_pages_over_dense_minutes_and_day_edges_are_one_order_by(burst, team):
    root, _ = burst
    expected = ["untimed"] + [
        r["trace_id"]
        for r in TraceStore(root, team=team)
        .sql("SELECT trace_id FROM traces WHERE time_received IS NOT NULL ORDER BY time_received DESC, trace_id DESC")
        .to_pylist()
    ]
    assert len(expected) == (225 if team is None else 151)
    for size in (7, 50, 300):  # 7: 33 pages of the admin's 225 rows
        assert all_pages(Reader(root, team, 30), TraceFilters(), size) == expected
    # a filter on the newest day's last hour: the page starts at `until`, not at the day's end
    until = (END - timedelta(minutes=20)).isoformat()
    got = all_pages(Reader(root, team, 30), TraceFilters(since=(END - timedelta(hours=1)).isoformat(), until=until), 9)
    assert (
        got == [t for t in expected[1:] if END - timedelta(hours=1) <= _received(root, t) <= END - timedelta(minutes=20)] and got
    )


@pytest.mark.parametrize("team", [None, "red"])
def test_a_costly_filter_past_empty_spans_finds_every_match_in_order(burst, team):
    """Text and reward filters skip ahead to the cheap filters' next match: nothing is skipped."""
    root, _ = burst
    old = TraceStore(root, team=team).sql(
        "SELECT trace_id FROM traces WHERE checkpoint_version = 'old' AND time_received IS NOT NULL "
        "ORDER BY time_received DESC, trace_id DESC"
    )
    expected = ["untimed"] + [r["trace_id"] for r in old.to_pylist()]
    assert len(expected) == (6 if team is None else 4)
    for size in (1, 2, 10):
        assert all_pages(Reader(root, team, 30), TraceFilters(checkpoint="old", q="answer"), size) == expected
    # the same without the row that has no time (since leaves it out): the old rows are 215-219
    since = TraceFilters(checkpoint="old", q="answer 21", since="2026-11-01")
    assert all_pages(Reader(root, team, 30), since, 2) == expected[1:]
    assert all_pages(Reader(root, team, 30), TraceFilters(checkpoint="old", q="nowhere"), 2) == []


def _received(root: str, trace_id: str) -> datetime:
    got = TraceStore(root).sql("SELECT time_received FROM traces WHERE trace_id = $1", params=[trace_id])
    return got.to_pylist()[0]["time_received"]


def test_a_walk_starts_at_the_newest_time_its_day_holds(burst):
    root, _ = burst
    assert newest_received(Path(root), date(2026, 12, 1)) == END - timedelta(seconds=1)
    written = datetime.now(timezone.utc).date()  # the day the row without a time was written on
    assert newest_received(Path(root), written) is None and newest_received(Path(root), date(2020, 1, 1)) is None


def test_a_filter_on_a_checkpoint_starts_where_the_files_say_its_newest_row_may_be(burst, monkeypatch):
    root, _ = burst
    days = sorted((date.fromisoformat(p.name[5:]) for p in Path(root).glob("date=*")), reverse=True)
    older = [d for d in days if d < END.date()]  # all but the day the row without a time was written on
    assert newest_that_may_match(Path(root), older, {"checkpoint_version": "new"}) == (True, END - timedelta(seconds=1))
    # 'old' is last seen 4 days back, but imported-7 (30 h back) has no checkpoint: its file has no
    # statistics to rule it out, and the bound is an upper one
    assert newest_that_may_match(Path(root), older, {"checkpoint_version": "old"}) == (True, END - timedelta(hours=30))
    # the day written today holds an 'old' row without a time: not known
    assert newest_that_may_match(Path(root), days, {"checkpoint_version": "old"}) == (True, None)
    for team in (None, "red"):  # every row, in order, as one ORDER BY gives them
        # until: without the day of the row without a time, 'old' may be no newer than 30 h back,
        # and the walk starts at its newest row instead of an empty first span
        for checkpoint, since, until in (("new", "", ""), ("old", "", ""), ("old", "2026-11-01", ""), ("old", "", "2026-12-01")):
            expected = TraceStore(root, team=team).sql(
                "SELECT trace_id FROM traces WHERE checkpoint_version = $1 AND time_received >= $2::TIMESTAMPTZ "
                "AND time_received <= $3::TIMESTAMPTZ ORDER BY time_received DESC, trace_id DESC",
                params=[checkpoint, since or "2000-01-01", until or "3000-01-01"],
            )
            untimed = ["untimed"] if checkpoint == "old" and not since and not until else []
            got = all_pages(Reader(root, team, 30), TraceFilters(checkpoint=checkpoint, since=since, until=until), 7)
            assert got == untimed + [r["trace_id"] for r in expected.to_pylist()] and len(got) >= 3
    # a checkpoint no file of those days may hold: the page is empty, and no query was asked
    four_days_back = [date(2026, 11, 28), date(2026, 11, 27)]
    assert newest_that_may_match(Path(root), four_days_back, {"checkpoint_version": "gone"}) == (False, None)
    asked = []
    monkeypatch.setattr(Reader, "rows", lambda self, sql, params=None, limit=0: asked.append(sql))
    gone = TraceFilters(checkpoint="gone", since="2026-11-27", until="2026-11-28T23:59")
    assert Reader(root, "red", 30).traces(gone, 0, 10) == ([], False) and asked == []


def test_spans_cover_each_moment_once_newest_first():
    days = [date(2026, 12, 1), date(2026, 11, 30), date(2026, 11, 27), date(2026, 11, 26), date(2026, 11, 20)]
    got = list(spans(days, datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc)))
    assert got[0] == Span([days[0]], datetime(2026, 12, 1, 9, 15, tzinfo=timezone.utc), None)
    assert got[1] == Span([days[0]], datetime(2026, 12, 1, 8, 45, tzinfo=timezone.utc), got[0].lo)
    for a, b in zip(got, got[1:]):  # each span ends where the one before began, or a day before
        assert b.hi == a.lo or (a.lo is None and b.hi is None and b.days[0] < a.days[-1])
    assert [d for s in got if s.lo is None for d in s.days] == days  # each day's rest taken once
    assert got[-1].lo is None and len(got) < 12


def test_a_record_is_found_by_the_day_its_id_names_or_beyond_it(burst):
    root, late = burst
    some = gateway_id(END - timedelta(minutes=15), 200)
    assert id_days(some) == [date(2026, 12, 1)] and id_days(late) == [date(2026, 11, 30), date(2026, 12, 1)]
    assert id_days("imported-7") == id_days("tr-zzzzzzzzzzzz") == id_days("tr-ffffffffffff") == []
    for team in (None, "red"):
        reader = Reader(root, team, 30)
        assert reader.trace(some)["response_content"] == "answer 200"
        assert reader.trace(late)["trace_id"] == late  # received a day after its id's day
        assert reader.trace("imported-7")["trace_id"] == "imported-7"  # an id of another shape
        assert reader.trace(gateway_id(END - timedelta(hours=2), 5)) is None
    assert Reader(root, "red", 30).trace(gateway_id(END - timedelta(seconds=1), 0)) is None  # blue's


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    """A trace a minute for 400 minutes of one day, every fifth an error."""
    root = tmp_path_factory.mktemp("ui-sparse")
    writer = TraceWriter(root, "seed")
    start = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    for i in range(400):
        at = start + timedelta(minutes=i)
        writer.submit(
            {
                "trace_id": gateway_id(at, i),
                "team": "red",
                "http_status": 200,
                "time_received": at,
                "error": "upstream 503" if i % 5 == 0 else None,
            }
        )
    writer.close()
    return str(root)


def test_a_walk_that_has_seen_its_matches_rate_asks_a_span_long_enough_to_finish(sparse, monkeypatch):
    """Every span costs a query whatever its length: after 3 errors in the first 15 minutes, the
    48 still missing are asked in one span, not in the four doubling ones (30, 60, 120, 240 min)."""
    expected = TraceStore(sparse).sql(
        "SELECT trace_id FROM traces WHERE error IS NOT NULL ORDER BY time_received DESC, trace_id DESC"
    )
    expected = [r["trace_id"] for r in expected.to_pylist()]
    asked = []
    rows = Reader.rows
    monkeypatch.setattr(Reader, "rows", lambda self, sql, *a, **k: asked.append(sql) or rows(self, sql, *a, **k))
    page, more = Reader(sparse, "red", 30).traces(TraceFilters(status="error"), 0, 50)
    assert [r["trace_id"] for r in page] == expected[:50] and more
    assert sum(sql.startswith("SELECT trace_id, time_received, date FROM traces") for sql in asked) == 2  # spans
    assert all_pages(Reader(sparse, None, 30), TraceFilters(status="error"), 7) == expected  # 80, every page in order


def test_a_teams_sql_runs_sealed_while_the_pages_statements_read_the_files(store, monkeypatch):
    """A team's pages are our statements, read through DuckDB's own reader with the team bound;
    the console's are the user's, run where no file can be opened, even with the guard bypassed."""
    monkeypatch.setattr("traces.store.check_select", lambda *a, **k: None)
    escape = f"SELECT count(*) AS n FROM read_parquet('{store}/date=*/*/*.parquet') WHERE team = 'blue'"
    assert Reader(store, "red", 30).rows(escape)[0]["n"] == 10  # only our statements' text keeps blue out here
    with pytest.raises(duckdb.PermissionException):
        Reader(store, "red", 30).console(escape, 10)
