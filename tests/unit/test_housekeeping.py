import json
from datetime import datetime, timedelta, timezone

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from traces.feedback import write_feedback
from traces.housekeeping import JOURNAL, compact, doctor, partitions, recover, retain
from traces.schema import FEEDBACK_DIR, SCHEMA_VERSION
from traces.store import TraceStore
from traces.writer import TraceWriter


def fill(root, n_files: int, per_file: int = 5, when=None, instance="gw"):
    writer = TraceWriter(root, instance, max_age_s=3600)
    i = 0
    for _ in range(n_files):
        for _ in range(per_file):
            writer.write(
                {
                    "trace_id": f"{instance}-{i}",
                    "gen_ai_request_model": "m",
                    "http_status": 200,
                    "time_received": when or datetime.now(timezone.utc),
                    "completion_token_ids": [i],
                }
            )
            i += 1
        writer.flush()
    writer.close()


def test_compaction_merges_small_files_without_losing_or_duplicating_rows(tmp_path):
    fill(tmp_path, 6)
    part = partitions(tmp_path)[0]
    assert len(list(part.glob("*.parquet"))) == 6
    report = compact(tmp_path)
    assert report == {"partitions": 1, "files_in": 6, "files_out": 1, "rows": 30}
    [out] = list(part.glob("*.parquet"))
    assert pq.read_metadata(out).metadata[b"flywheel.schema_version"] == str(SCHEMA_VERSION).encode()
    store = TraceStore(tmp_path)
    assert store.sql("SELECT count(*) AS n, count(DISTINCT trace_id) AS d FROM traces").to_pylist() == [{"n": 30, "d": 30}]


def test_a_merged_file_holds_its_traces_in_time_order_and_its_feedback_in_trace_order(tmp_path):
    """A time bound (the trace browser's spans) or a trace id bound (a reward's feedback) skips
    a merged file's row groups by their statistics only if the merge keeps its rows in order."""
    start = datetime(2026, 12, 6, 9, tzinfo=timezone.utc)
    writers = [TraceWriter(tmp_path, gw, max_age_s=3600) for gw in ("gw-a", "gw-b")]
    for i in range(60):  # two gateways' files interleave in time; ids run against time
        row = {"trace_id": f"t{999 - i}", "gen_ai_request_model": "m", "time_received": start + timedelta(seconds=i)}
        writers[i % 2].write(row)
        if i % 10 == 9:
            writers[i % 2].flush()
    for w in writers:
        w.close()
    for first in (40, 20, 0):  # feedback written newest trace first
        write_feedback(tmp_path, [{"trace_id": f"t{999 - i}", "name": "reward", "reward": 1.0} for i in range(first, first + 20)])
    assert compact(tmp_path)["files_out"] == 2
    [traces] = list(partitions(tmp_path)[0].glob("*.parquet"))
    received = pq.read_table(traces, columns=["time_received"])["time_received"].to_pylist()
    assert received == [start + timedelta(seconds=i) for i in range(60)]
    [feedback] = list((tmp_path / FEEDBACK_DIR).rglob("*.parquet"))
    assert pq.read_table(feedback, columns=["trace_id"])["trace_id"].to_pylist() == [f"t{i}" for i in range(940, 1000)]


def test_a_merged_file_carries_bloom_filters_for_session_ids_not_for_trace_ids(tmp_path):
    """An admin's session lookup skips each row group whose Bloom filter rules the id out; ids
    that are all distinct get no dictionary (and so no filter) to carry."""
    part = tmp_path / "date=2026-12-06" / "model=m"
    part.mkdir(parents=True)
    for half in range(2):  # 10,000 sessions of two turns, a turn in each file
        rows = range(half * 10_000, (half + 1) * 10_000)
        at = [datetime(2026, 12, 6, tzinfo=timezone.utc) + timedelta(milliseconds=i) for i in rows]
        ids = {"trace_id": [f"t{i}" for i in rows], "gen_ai_conversation_id": [f"s{i % 10_000}" for i in rows]}
        table = pa.table({**ids, "time_received": at, "time_done": at})
        pq.write_table(table, part / f"gw-{half}.parquet")
    assert compact(tmp_path)["rows"] == 20_000
    [merged] = list(part.glob("*.parquet"))
    blooms = "SELECT path_in_schema, count(bloom_filter_offset) FROM parquet_metadata($1) GROUP BY ALL"
    with_filter = dict(duckdb.execute(blooms, [str(merged)]).fetchall())
    assert (with_filter["gen_ai_conversation_id"], with_filter["trace_id"]) == (1, 0)
    store = TraceStore(tmp_path)
    assert store.sql("SELECT count(*) AS n FROM traces WHERE gen_ai_conversation_id = 's42'").to_pylist() == [{"n": 2}]


def test_an_interrupted_compaction_is_invisible_to_readers_and_recovered(tmp_path):
    fill(tmp_path, 3)
    part = partitions(tmp_path)[0]
    inputs = {p.name: p.read_bytes() for p in part.glob("*.parquet")}
    names = sorted(inputs)
    # Simulate a crash after the output was renamed into place but before the inputs went.
    compact(tmp_path)
    [out] = list(part.glob("*.parquet"))
    for name, data in inputs.items():  # the inputs are back, as the crash left them
        (part / name).write_bytes(data)
    (part / JOURNAL).write_text(json.dumps({"inputs": names, "output": out.name}))
    assert TraceStore(tmp_path).count() == 15  # inputs hidden: nothing counted twice
    assert recover(tmp_path) == 1
    assert [p.name for p in part.glob("*.parquet")] == [out.name]
    assert TraceStore(tmp_path).count() == 15


def test_retention_drops_only_old_days(tmp_path):
    today = datetime.now(timezone.utc)
    fill(tmp_path, 1, when=today - timedelta(days=10), instance="old")
    fill(tmp_path, 1, when=today, instance="new")
    removed = retain(tmp_path, days=7, today=today.date())
    assert removed == [(today - timedelta(days=10)).date().isoformat()]
    assert TraceStore(tmp_path).sql("SELECT DISTINCT trace_id LIKE 'new-%' AS new FROM traces").to_pylist() == [{"new": True}]


def test_doctor_reports_backlog_versions_and_unreadable_files(tmp_path):
    fill(tmp_path, 2)
    writer = TraceWriter(tmp_path, "busy", max_age_s=3600)
    writer.write({"trace_id": "pending", "gen_ai_request_model": "m"})
    part = partitions(tmp_path)[0]
    (part / "broken.parquet").write_bytes(b"not parquet at all")
    r = doctor(tmp_path)
    assert r["spool"]["busy"]["records"] == 1
    assert r["schema_versions"] == {str(SCHEMA_VERSION): 2} and r["rows"] == 10
    assert len(r["unreadable"]) == 1 and "broken.parquet" in r["unreadable"][0]
    writer.close()


def test_every_query_reads_one_snapshot_while_a_compaction_runs(tmp_path, monkeypatch):
    import os
    import threading

    from traces import files

    fill(tmp_path, 4)  # 4 files, 20 rows
    before = TraceStore(tmp_path)
    paused, go, real_replace = threading.Event(), threading.Event(), os.replace

    def rename_then_pause(src, dst):
        real_replace(src, dst)
        if "compact-" in str(dst):  # the output is in place, the inputs are not deleted yet
            paused.set()
            go.wait(10)

    monkeypatch.setattr(files.os, "replace", rename_then_pause)  # the compaction renames through traces.files
    worker = threading.Thread(target=compact, args=(tmp_path,))
    worker.start()
    try:
        assert paused.wait(10)
        n = "SELECT count(*) AS n, count(DISTINCT trace_id) AS d FROM traces"
        assert before.sql(n).to_pylist() == [{"n": 20, "d": 20}]  # its snapshot: the inputs
        assert TraceStore(tmp_path).sql(n).to_pylist() == [{"n": 20, "d": 20}]  # now: the output
    finally:
        go.set()
        worker.join()
    # the inputs of the old snapshot are gone: the store takes a new one instead of failing
    assert before.sql(n).to_pylist() == [{"n": 20, "d": 20}]
