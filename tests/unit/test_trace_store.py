import random
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.schema import SCHEMA_VERSION, SPOOL_HEADER, STORED_FIELDS, TRACE_SCHEMA, micros
from traces.spool import Spool
from traces.store import TraceStore
from traces.writer import TraceWriter, spool_dir


def record(i: int, **kw) -> dict:
    return {
        "trace_id": f"tr-{i}",
        "gen_ai_operation_name": "chat",
        "gen_ai_request_model": "tiny",
        "prompt_token_ids": [1, 2, i],
        "completion_token_ids": [7, 8],
        "completion_logprobs": [-0.5, -1.25],
        "time_received": datetime.now(timezone.utc),
        "http_status": 200,
        **kw,
    }


def test_an_empty_store_answers_queries_with_typed_columns(tmp_path):
    store = TraceStore(tmp_path)
    assert store.count() == 0
    assert "completion_token_ids" in store.sql("SELECT * FROM traces").column_names
    assert store.sql("SELECT count(*) AS n FROM traces_full").to_pylist() == [{"n": 0}]


def test_records_round_trip_exactly_through_parquet(tmp_path):
    writer = TraceWriter(tmp_path, "gw", max_batch=3, max_age_s=60)
    tickets = [writer.submit(record(i, team="a" if i % 2 else "b")) for i in range(7)]
    writer.wait_durable(tickets[-1])
    writer.flush()
    store = TraceStore(tmp_path)
    assert store.count() == 7
    rows = store.sql(
        "SELECT trace_id, prompt_token_ids, completion_logprobs, schema_version, model FROM traces_full ORDER BY trace_id"
    ).to_pylist()
    assert rows[3] == {
        "trace_id": "tr-3",
        "prompt_token_ids": [1, 2, 3],
        "completion_logprobs": [-0.5, -1.25],
        "schema_version": SCHEMA_VERSION,
        "model": "tiny",
    }
    by_team = store.sql("SELECT team, count(*) AS n FROM traces GROUP BY team ORDER BY team")
    assert by_team.to_pylist() == [{"team": "a", "n": 3}, {"team": "b", "n": 4}]
    writer.close()


def test_times_are_stored_to_the_microsecond_and_older_segments_still_convert(tmp_path):
    rng = random.Random(7)
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    times = [epoch + timedelta(microseconds=rng.randrange(0, 4_102_444_800 * 10**6)) for _ in range(2000)]
    times += [datetime(2026, 12, 5, 23, 59, 59, 999_999, tzinfo=timezone.utc), datetime(2026, 12, 5, 9, 0, 0, 1)]
    assert [micros(t) for t in times[:-1]] == [(t - epoch) // timedelta(microseconds=1) for t in times[:-1]]
    assert micros(times[-1]) == micros(times[-1].replace(tzinfo=timezone.utc))  # naive: UTC, as Arrow reads it
    # a segment written before times were spooled as integers holds datetimes
    old = Spool(spool_dir(tmp_path, "gw"), header=SPOOL_HEADER)
    old.wait(
        old.append([{"trace_id": "tr-old", "time_received": times[0], "time_done": times[1]}.get(f) for f in STORED_FIELDS]), 5
    )
    old.close()
    writer = TraceWriter(tmp_path, "gw")
    assert writer.replayed == 1
    writer.write({"trace_id": "tr-new", "time_received": times[-2], "time_done": times[2]})
    writer.close()
    got = TraceStore(tmp_path).sql("SELECT trace_id, time_received, time_done FROM traces ORDER BY trace_id").to_pylist()
    assert got == [
        {"trace_id": "tr-new", "time_received": times[-2], "time_done": times[2]},
        {"trace_id": "tr-old", "time_received": times[0], "time_done": times[1]},
    ]


def test_files_are_partitioned_by_date_and_model(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    writer.submit(record(1, gen_ai_request_model="org/model a"))
    writer.submit(record(2))
    writer.close()
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    parts = sorted(str(p.relative_to(tmp_path).parent) for p in tmp_path.glob("date=*/model=*/*.parquet"))
    assert parts == [f"date={day}/model=org%2Fmodel%20a", f"date={day}/model=tiny"]


def test_unflushed_records_reach_parquet_by_age(tmp_path):
    writer = TraceWriter(tmp_path, "gw", max_age_s=0.2)
    writer.submit(record(1))
    import time

    deadline = time.monotonic() + 5
    while TraceStore(tmp_path).count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert TraceStore(tmp_path).count() == 1
    writer.close()


def test_a_misspelled_field_is_refused_not_dropped(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    with pytest.raises(ValueError, match="completion_tokenids"):
        writer.submit({**record(1), "completion_tokenids": [1]})
    writer.close()


def test_files_of_older_versions_in_one_partition_read_with_what_they_lack_as_null(tmp_path):
    """The views read files grouped by schema (no union_by_name over them all): an older file
    beside current ones, its columns in another order and one missing, reads whole, for the admin
    and for a team, in every view built on ``traces``."""
    writer = TraceWriter(tmp_path, "gw")
    writer.submit(record(1, team="a", gen_ai_usage_cache_read_input_tokens=5))
    writer.close()
    (current,) = tmp_path.glob("date=*/model=*/*.parquet")
    older = pq.read_table(current).drop_columns(["gen_ai_usage_cache_read_input_tokens"])
    older = older.select(sorted(older.column_names))  # another column order too
    older = older.set_column(older.column_names.index("trace_id"), "trace_id", pa.array(["tr-2"]))
    pq.write_table(older, current.parent / "older-gw.parquet")
    for team in (None, "a"):
        store = TraceStore(tmp_path, team=team)
        rows = store.sql(
            "SELECT trace_id, team, gen_ai_usage_cache_read_input_tokens AS cached, model FROM traces ORDER BY trace_id"
        ).to_pylist()
        assert rows == [
            {"trace_id": "tr-1", "team": "a", "cached": 5, "model": "tiny"},
            {"trace_id": "tr-2", "team": "a", "cached": None, "model": "tiny"},
        ], team
        assert store.sql("SELECT sum(requests) AS n FROM usage_by_team").to_pylist() == [{"n": 2}]
        assert store.sql("SELECT count(*) AS n FROM traces_full").to_pylist() == [{"n": 2}]


def test_schema_v1_files_stay_readable_next_to_current_ones(tmp_path):
    # The first cut wrote date=*/part-*.parquet with the whole prompt in prompt_token_ids.
    v1_fields = [f for f in TRACE_SCHEMA if not f.name.startswith("prompt_")]
    v1 = pa.schema(v1_fields + [pa.field("prompt_token_ids", pa.list_(pa.int32()))])
    legacy = tmp_path / "date=2026-11-28"
    legacy.mkdir()
    pq.write_table(pa.Table.from_pylist([{**record(100), "schema_version": 1}], schema=v1), legacy / "part-1.parquet")
    writer = TraceWriter(tmp_path, "gw")
    writer.submit(record(1))
    writer.close()
    rows = (
        TraceStore(tmp_path)
        .sql("SELECT trace_id, schema_version, prompt_token_ids FROM traces_full ORDER BY trace_id")
        .to_pylist()
    )
    assert rows == [
        {"trace_id": "tr-1", "schema_version": SCHEMA_VERSION, "prompt_token_ids": [1, 2, 1]},
        {"trace_id": "tr-100", "schema_version": 1, "prompt_token_ids": [1, 2, 100]},
    ]
