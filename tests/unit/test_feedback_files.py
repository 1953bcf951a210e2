"""Feedback is batched and compacted like traces, so no team's posts can slow every team's
queries; and no compaction, of feedback or traces, can store a row twice."""

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pyarrow.parquet as pq
import pytest

from traces import feedback
from traces.housekeeping import compact, compact_feedback, data_files, feedback_partitions, visible_files
from traces.store import TraceStore
from traces.writer import TraceWriter
from tests.unit.test_housekeeping import fill


def feedback_files(root):
    """The feedback files a query opens (those a merge took stay a while, hidden)."""
    return [f for part in feedback_partitions(root) for f in visible_files(part)]


def test_thousands_of_single_posts_leave_a_bounded_number_of_files_and_every_row_once(setup, tmp_path):
    client, keys = setup
    sent = []
    for i in range(300):
        r = client.post(
            "/v1/feedback",
            json={"trace_id": f"tr-{i % 4}", "reward": i / 300},
            headers={"Authorization": f"Bearer {keys['red']}"},
        )
        assert r.status_code == 200, r.text
        sent.append(r.json()["data"][0]["id"])
    assert len(feedback_files(tmp_path / "traces")) < feedback.COMPACT_AT
    rows = TraceStore(tmp_path / "traces").sql("SELECT feedback_id FROM feedback").column("feedback_id").to_pylist()
    assert sorted(rows) == sorted(sent)


def test_posts_at_the_same_moment_share_files_and_each_is_acknowledged_once_stored(tmp_path):
    def post(i):
        return feedback.write_feedback(tmp_path, [{"trace_id": f"t{i}", "team": "red", "name": "reward", "reward": 1.0}])

    with ThreadPoolExecutor(16) as pool:
        ids = [fid for got in pool.map(post, range(200)) for fid in got]
    stored = TraceStore(tmp_path).sql("SELECT feedback_id FROM feedback").column("feedback_id").to_pylist()
    assert sorted(stored) == sorted(ids) and len(set(ids)) == 200
    assert len(feedback_files(tmp_path)) < feedback.COMPACT_AT


def test_a_failed_feedback_write_is_an_error_for_its_callers_and_stores_nothing(tmp_path, monkeypatch):
    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(feedback.pq, "write_table", full_disk)
    try:
        feedback.write_feedback(tmp_path, [{"trace_id": "t", "team": "red", "name": "reward", "reward": 1.0}])
    except OSError as exc:
        assert exc.errno == 28
    else:
        raise AssertionError("a write that failed was acknowledged")
    monkeypatch.undo()
    assert feedback.write_feedback(tmp_path, [{"trace_id": "t", "team": "red", "name": "reward", "reward": 1.0}])
    assert TraceStore(tmp_path).sql("SELECT count(*) AS n FROM feedback").to_pylist() == [{"n": 1}]


def test_compaction_between_a_half_failed_conversion_and_its_retry_stores_no_row_twice(tmp_path, monkeypatch):
    fill(tmp_path, 1, instance="old")  # a file already in the partition, so there is something to merge with
    writer = TraceWriter(tmp_path, "gw", max_age_s=3600)
    now = datetime.now(timezone.utc)
    for i, model in enumerate(["m", "other", "m", "other"]):
        writer.write({"trace_id": f"half-{i}", "gen_ai_request_model": model, "http_status": 200, "time_received": now})
    real, calls = pq.write_table, []

    def second_fails(*a, **k):  # the first partition is written, the second is not
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr("traces.mover.pq.write_table", second_fails)  # the conversion lives there now
    assert writer.flush() == 1  # the segment stays in the spool, to be converted again
    monkeypatch.undo()
    compact(tmp_path)
    assert writer.flush() == 0
    writer.close()
    counts = TraceStore(tmp_path).sql("SELECT trace_id, count(*) AS n FROM traces GROUP BY ALL").to_pylist()
    assert {r["trace_id"]: r["n"] for r in counts} == {**{f"old-{i}": 1 for i in range(5)}, **{f"half-{i}": 1 for i in range(4)}}


def test_a_teams_snapshot_whose_feedback_files_were_compacted_away_says_so_and_a_new_one_reads_them(tmp_path):
    """Housekeeping merges a day's feedback files while a team's sandboxed store still holds the old
    ones: the query says SnapshotGone (the gateway and the loop open a new store), never a 500."""
    from traces.housekeeping import compact_feedback
    from traces.store import SnapshotGone

    writer = TraceWriter(tmp_path, "gw", max_age_s=3600)
    writer.write({"trace_id": "t1", "team": "red", "http_status": 200, "prompt_token_ids": [1], "completion_token_ids": [2]})
    writer.close()
    for reward in (0.0, 1.0):
        feedback.write_feedback(tmp_path, [{"trace_id": "t1", "team": "red", "name": "reward", "reward": reward}])
    old = TraceStore(tmp_path, team="red")
    assert compact_feedback(tmp_path)["files_in"] == 2
    with pytest.raises(SnapshotGone):
        old.sql("SELECT reward FROM rewards")
    assert TraceStore(tmp_path, team="red").sql("SELECT reward FROM rewards").column("reward").to_pylist() == [1.0]


def test_a_teams_snapshot_reads_on_while_the_feedback_under_it_is_merged_and_sees_each_row_once(tmp_path):
    """Feedback posted fast is merged every ``COMPACT_AT`` files. A team's snapshot taken before
    a merge still reads the files it listed (kept ``KEEP_INPUTS_S``; CI lost a loop's three
    snapshots in a row when they were deleted at once), and no snapshot sees a row twice."""
    writer = TraceWriter(tmp_path, "gw", max_age_s=3600)
    writer.write({"trace_id": "t1", "team": "red", "http_status": 200, "prompt_token_ids": [1], "completion_token_ids": [2]})
    writer.close()

    def post(i):
        feedback.write_feedback(tmp_path, [{"trace_id": "t1", "team": "red", "name": f"r{i}", "reward": 1.0}])

    def count(store):
        return store.sql("SELECT count(*) AS n, count(DISTINCT feedback_id) AS ids FROM feedback").to_pylist()[0]

    for i in range(feedback.COMPACT_AT - 1):
        post(i)
    before = TraceStore(tmp_path, team="red")
    post(feedback.COMPACT_AT)  # the day's 32nd file: merged
    (part,) = feedback_partitions(tmp_path)
    assert len(visible_files(part)) == 1 and len(data_files(part)) == 1 + feedback.COMPACT_AT
    assert count(before) == {"n": feedback.COMPACT_AT - 1, "ids": feedback.COMPACT_AT - 1}
    assert count(TraceStore(tmp_path, team="red")) == {"n": feedback.COMPACT_AT, "ids": feedback.COMPACT_AT}
    for i in range(feedback.COMPACT_AT - 1):  # the merged file and 31 more: merged again
        post(100 + i)
    assert len(visible_files(part)) == 1
    assert count(TraceStore(tmp_path, team="red")) == {"n": 2 * feedback.COMPACT_AT - 1, "ids": 2 * feedback.COMPACT_AT - 1}
    compact_feedback(tmp_path, keep_inputs_s=0)  # kept long enough: gone
    assert len(data_files(part)) == 1
    assert count(TraceStore(tmp_path, team="red"))["n"] == 2 * feedback.COMPACT_AT - 1


@pytest.mark.parametrize("team", [None, "red"])
def test_a_store_opened_while_feedback_files_are_compacted_away_lists_them_again(tmp_path, monkeypatch, team):
    """A feedback file listed for a new snapshot and compacted away before its view is defined
    (the canary controller met this: its look failed with DuckDB's "No files found"; the loop's
    team-scoped store with Arrow's FileNotFoundError, in CI): the store lists the files again
    and opens."""
    import traces.store

    writer = TraceWriter(tmp_path, "gw", max_age_s=3600)
    writer.write({"trace_id": "t1", "team": "red", "http_status": 200, "prompt_token_ids": [1], "completion_token_ids": [2]})
    writer.close()
    feedback.write_feedback(tmp_path, [{"trace_id": "t1", "team": "red", "name": "reward", "reward": 1.0}])
    listed, calls = traces.store.visible_files, []

    def a_compaction_between(part):
        files = listed(part)
        calls.append(part)
        if "_feedback" in str(part) and len([c for c in calls if "_feedback" in str(c)]) == 1:
            return files + [part / "fb-compacted-away.parquet"]  # listed, then gone
        return files

    monkeypatch.setattr(traces.store, "visible_files", a_compaction_between)
    store = TraceStore(tmp_path, team=team)
    assert store.sql("SELECT reward FROM rewards").column("reward").to_pylist() == [1.0]
    assert len([c for c in calls if "_feedback" in str(c)]) == 2  # listed twice
