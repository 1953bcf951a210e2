from datetime import datetime, timezone

import pytest

from traces.store import TraceStore
from traces.writer import TraceWriter


def record(i: int, **kw) -> dict:
    return {"trace_id": f"tr-{i}", "gen_ai_operation_name": "chat", "gen_ai_request_model": "tiny",
            "prompt_token_ids": [1, 2, i], "completion_token_ids": [7, 8],
            "completion_logprobs": [-0.5, -1.25], "time_received": datetime.now(timezone.utc),
            "http_status": 200, **kw}


def test_an_empty_store_answers_queries_with_typed_columns(tmp_path):
    store = TraceStore(tmp_path)
    assert store.count() == 0
    assert "completion_token_ids" in store.sql("SELECT * FROM traces").column_names


def test_records_round_trip_exactly_through_parquet(tmp_path):
    writer = TraceWriter(tmp_path, max_batch=3, max_age_s=60)
    for i in range(7):
        writer.submit(record(i, team="a" if i % 2 else "b"))
    assert writer.flush()
    store = TraceStore(tmp_path)
    assert store.count() == 7
    rows = store.sql("SELECT trace_id, prompt_token_ids, completion_logprobs, schema_version "
                     "FROM traces ORDER BY trace_id").to_pylist()
    assert rows[3] == {"trace_id": "tr-3", "prompt_token_ids": [1, 2, 3],
                       "completion_logprobs": [-0.5, -1.25], "schema_version": 1}
    by_team = store.sql("SELECT team, count(*) AS n FROM traces GROUP BY team ORDER BY team")
    assert by_team.to_pylist() == [{"team": "a", "n": 3}, {"team": "b", "n": 4}]
    writer.close()


def test_unflushed_records_are_written_by_age(tmp_path):
    writer = TraceWriter(tmp_path, max_batch=1000, max_age_s=0.2)
    writer.submit(record(1))
    import time
    deadline = time.monotonic() + 5
    while TraceStore(tmp_path).count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert TraceStore(tmp_path).count() == 1
    writer.close()


def test_a_misspelled_field_is_refused_not_dropped(tmp_path):
    writer = TraceWriter(tmp_path)
    with pytest.raises(ValueError, match="completion_tokenids"):
        writer.submit({**record(1), "completion_tokenids": [1]})
    writer.close()
