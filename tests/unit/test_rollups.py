"""The usage page and the checkpoints page add up each file's totals (``traces.rollups``)
rather than scan the store: the same rows as a GROUP BY of the views, for the admin and for each
team, over files of an older schema, across a compaction that replaces the files, and with the
rows written since the last look; a file already seen is not read again."""

from datetime import datetime, timedelta, timezone

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from serve.ui.queries import Reader
from traces import rollups
from traces.feedback import write_feedback
from traces.housekeeping import compact
from traces.schema import TRACE_SCHEMA
from traces.store import TraceStore
from traces.writer import TraceWriter

T0 = datetime(2026, 11, 30, 23, 0, tzinfo=timezone.utc)
TEAMS = [None, "red", "blue"]


def trace_id(i: int) -> str:  # as the gateway makes them: led by their millisecond
    return f"tr-{int((T0 + timedelta(minutes=9 * i)).timestamp() * 1000):012x}{i:020x}"


def record(i: int) -> dict:
    return {
        "trace_id": trace_id(i),
        "team": ["red", "blue", None][i % 3],
        "http_status": 200,
        "gen_ai_request_model": "tiny" if i % 4 else "other",
        "checkpoint_version": f"v{i % 3}" if i % 5 else None,
        "gen_ai_usage_input_tokens": 10 + i,
        "gen_ai_usage_output_tokens": 2 * i,
        "gen_ai_usage_cache_read_input_tokens": i % 7,
        "time_received": T0 + timedelta(minutes=9 * i),  # across midnight: two days
    }


def write(root, name: str, ids: range) -> None:
    writer = TraceWriter(root, name)
    for i in ids:
        writer.submit(record(i))
    writer.close()


def from_views(root, team: str | None) -> tuple[list[dict], dict[str, int]]:
    store = TraceStore(root, team=team)
    usage = store.sql(
        "SELECT day, team, model, sum(requests)::BIGINT AS requests, "
        "coalesce(sum(input_tokens), 0)::BIGINT AS input_tokens, "
        "coalesce(sum(output_tokens), 0)::BIGINT AS output_tokens, "
        "coalesce(sum(cached_input_tokens), 0)::BIGINT AS cached_input_tokens "
        "FROM usage_by_team GROUP BY ALL ORDER BY day, team, model"
    ).to_pylist()
    served = store.sql(
        "SELECT coalesce(t.checkpoint_version, 'base') AS v, count(*) AS n, count(r.reward) AS rewarded, "
        "avg(r.reward) AS mean FROM traces t LEFT JOIN rewards r ON r.trace_id = t.trace_id AND r.name = 'reward' "
        "GROUP BY ALL"
    )
    return usage, {r["v"]: (r["n"], r["rewarded"], r["mean"] and round(r["mean"], 9)) for r in served.to_pylist()}


def from_rollups(root, team: str | None) -> tuple[list[dict], dict[str, int]]:
    reader = Reader(str(root), team, 30)
    by_checkpoint = reader.by_checkpoint()
    return reader.usage(), {
        v: (s["traces"], s["rewarded"], s["mean_reward"] and round(s["mean_reward"], 9)) for v, s in by_checkpoint.items()
    }


@pytest.fixture
def files_read(monkeypatch) -> list:
    read, seen = [], rollups._read
    monkeypatch.setattr(rollups, "_read", lambda path: read.append(path.name) or seen(path))
    monkeypatch.setattr(rollups, "_FILE_ROLLUPS", {})
    return read


def test_totals_are_the_views_group_by_through_compaction_and_new_rows(tmp_path, files_read):
    write(tmp_path, "gw1", range(0, 40))
    write(tmp_path, "gw2", range(40, 70))
    # a file of an older schema: no cached tokens, no checkpoint column (both read as null)
    old = pa.schema([f for f in TRACE_SCHEMA if f.name not in ("gen_ai_usage_cache_read_input_tokens", "checkpoint_version")])
    part = tmp_path / "date=2026-12-01" / "model=tiny"
    pq.write_table(pa.Table.from_pylist([record(i) for i in range(70, 75)], schema=old), part / "old-1.parquet")
    # rewards on both days (the checkpoints page sums them a day of ids at a time): each team's
    # on its own traces, one posted twice (the latest counts), one on another team's trace
    rewards = [{"trace_id": trace_id(i), "team": record(i)["team"], "name": "reward", "reward": i / 100} for i in range(0, 75, 2)]
    write_feedback(tmp_path, rewards)
    later = [
        {"trace_id": trace_id(4), "team": "blue", "name": "reward", "reward": 0.5},  # blue's trace, posted again
        {"trace_id": trace_id(3), "team": "blue", "name": "reward", "reward": 0.99},  # red's trace
    ]
    write_feedback(tmp_path, later)
    before = {team: from_views(tmp_path, team) for team in TEAMS}
    assert {team: from_rollups(tmp_path, team) for team in TEAMS} == before
    assert before["red"][0] and all(r["team"] == "red" for r in before["red"][0])
    assert sum(r["requests"] for r in before[None][0]) == 75
    assert sum(rewarded for _, rewarded, _ in before[None][1].values()) == 38  # blue's on red's trace not among them
    read_first = len(files_read)
    assert read_first == len(list(tmp_path.glob("date=*/model=*/*.parquet")))  # each trace file once, for every caller

    assert from_rollups(tmp_path, "blue") == before["blue"] and len(files_read) == read_first  # none again

    compact(tmp_path)  # the files replaced by merged ones: the same totals
    assert (
        {team: from_rollups(tmp_path, team) for team in TEAMS} == before == {team: from_views(tmp_path, team) for team in TEAMS}
    )

    write(tmp_path, "gw3", range(75, 90))  # rows written since: counted, and only their files read
    read_before_new = len(files_read)
    assert {team: from_rollups(tmp_path, team) for team in TEAMS} == {team: from_views(tmp_path, team) for team in TEAMS}
    assert sum(r["requests"] for r in from_rollups(tmp_path, None)[0]) == 90
    new = files_read[read_before_new:]
    assert new and all(name.startswith("gw3-") for name in new), files_read


def test_an_empty_store_has_no_totals_and_a_spent_deadline_is_an_interrupt(tmp_path):
    assert from_rollups(tmp_path, None) == ([], {})
    write(tmp_path, "gw", range(3))
    with pytest.raises(duckdb.InterruptException):
        rollups.rollups(tmp_path, None, 0)
