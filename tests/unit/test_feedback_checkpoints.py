"""A feedback merge writes each rated trace's checkpoint into its rows, only where the trace's
team may see that feedback, and the checkpoints page gives the same figures whether the rows
were resolved or are joined at read time; a lookup that fails never costs a row."""

import logging
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from serve.ui import queries
from serve.ui.queries import Reader
from traces.feedback import FEEDBACK_SCHEMA, write_feedback
from traces.housekeeping import compact, compact_feedback, retain
from traces.schema import FEEDBACK_DIR
from traces.store import TraceStore
from traces.writer import TraceWriter

T0 = datetime(2026, 11, 30, 23, 58, tzinfo=timezone.utc)  # the traces reach past midnight


def made_at(minutes: int, n: int) -> str:
    """An id as the gateway makes it, ``minutes`` after T0."""
    return f"tr-{int((T0 + timedelta(minutes=minutes)).timestamp() * 1000):012x}" + f"{n:020x}"


A, B, C, D = made_at(0, 1), made_at(1, 2), made_at(4, 3), made_at(6, 4)
TRACES = {  # id: (team, checkpoint, minutes after T0)
    A: ("red", "v1", 0),
    B: ("red", None, 1),  # the base model
    C: ("blue", "v2", 4),
    "imported-7": ("red", "v3", 5),  # an id the gateway did not make: no day to look in
}


def store_traces(root, traces: dict) -> None:
    writer = TraceWriter(root, "seed")
    for trace_id, (team, version, minutes) in traces.items():
        writer.submit(
            {
                "trace_id": trace_id,
                "team": team,
                "checkpoint_version": version,
                "http_status": 200,
                "gen_ai_request_model": "tiny",
                "time_received": T0 + timedelta(minutes=minutes),
            }
        )
    writer.close()


def post(root, *rows: tuple) -> None:
    write_feedback(root, [{"trace_id": t, "team": team, "name": "reward", "reward": r} for t, team, r in rows])


def resolved(root) -> dict:
    rows = TraceStore(root).sql("SELECT trace_id, team, checkpoint_version FROM feedback").to_pylist()
    return {(r["trace_id"], r["team"]): r["checkpoint_version"] for r in rows}


def page(root) -> dict:
    return {
        team: {
            v: (round(s["mean_reward"], 9), s["rewarded"])
            for v, s in Reader(str(root), team, 30).by_checkpoint().items()
            if s["rewarded"]
        }
        for team in (None, "red", "blue")
    }


@pytest.fixture
def root(tmp_path):
    store_traces(tmp_path, TRACES)
    post(tmp_path, (A, "red", 0.2), (B, "red", 0.4), (C, "red", 1.0), (C, "admin", 0.6))
    post(tmp_path, (C, "blue", 0.8), (D, "red", 0.5), ("imported-7", "red", 0.9), (A, "red", 0.3))
    return tmp_path


@pytest.mark.parametrize("merge", [compact_feedback, compact], ids=["as-posted", "flywheel-traces-compact"])
def test_a_merge_resolves_what_it_may_and_a_later_merge_the_traces_that_came_later(root, merge):
    joined = page(root)  # before any merge: every row joined at read time
    assert set(resolved(root).values()) == {None}
    merge(root)
    assert resolved(root) == {
        (A, "red"): "v1",
        (B, "red"): "base",
        (C, "red"): None,  # blue's trace: red's feedback never counts for it
        (C, "admin"): "v2",
        (C, "blue"): "v2",
        (D, "red"): None,  # not stored yet
        ("imported-7", "red"): None,
    }
    assert page(root) == joined
    assert joined == {
        None: {"v1": (0.3, 1), "base": (0.4, 1), "v2": (0.8, 1), "v3": (0.9, 1)},  # C's latest: blue's 0.8
        "red": {"v1": (0.3, 1), "base": (0.4, 1), "v3": (0.9, 1)},
        "blue": {"v2": (0.8, 1)},
    }
    store_traces(root, {D: ("red", "v1", 6)})
    post(root, (B, "red", 0.1))
    merge(root)
    assert resolved(root)[(D, "red")] == "v1" and resolved(root)[(B, "red")] == "base"
    assert page(root)["red"] == {"v1": (0.4, 2), "base": (0.1, 1), "v3": (0.9, 1)}


def test_posted_checkpoints_are_not_taken_on_trust(root):
    write_feedback(root, [{"trace_id": A, "team": "blue", "name": "reward", "reward": 1.0, "checkpoint_version": "v9"}])
    compact_feedback(root)
    assert resolved(root)[(A, "blue")] is None
    assert "v9" not in page(root)[None]


def test_a_lookup_that_fails_merges_every_row_unresolved(root, caplog):
    day = next(root.glob("date=2026-11-30/model=*"))
    (day / "torn.parquet").write_bytes(b"PAR1 not a footer")
    with caplog.at_level(logging.WARNING):
        report = compact_feedback(root)
    assert report["rows"] == 8 and report["files_out"] == 1 and "not looked up" in caplog.text
    (day / "torn.parquet").unlink()  # the store's readers would refuse it too
    counted = TraceStore(root).sql("SELECT count(*) AS n, count(checkpoint_version) AS resolved FROM feedback")
    assert counted.to_pylist() == [{"n": 8, "resolved": 0}]


def test_feedback_written_before_the_column_reads_as_unresolved(tmp_path):
    store_traces(tmp_path, TRACES)
    old = FEEDBACK_SCHEMA.remove(FEEDBACK_SCHEMA.get_field_index("checkpoint_version")).with_metadata(
        {"flywheel.feedback_schema_version": "1"}
    )
    part = tmp_path / FEEDBACK_DIR / f"date={datetime.now(timezone.utc):%Y-%m-%d}"  # where posts land
    part.mkdir(parents=True)
    rows = [{"feedback_id": "fb-1", "trace_id": A, "team": "red", "name": "reward", "reward": 0.7, "time_created": T0}]
    pq.write_table(pa.Table.from_pylist(rows, schema=old), part / "fb-old.parquet")
    for team in (None, "red"):
        assert TraceStore(tmp_path, team=team).sql("SELECT checkpoint_version FROM feedback").to_pylist() == [
            {"checkpoint_version": None}
        ]
    assert page(tmp_path)["red"] == {"v1": (0.7, 1)}
    post(tmp_path, (B, "red", 0.5))
    compact_feedback(tmp_path)
    assert resolved(tmp_path) == {(A, "red"): "v1", (B, "red"): "base"}
    assert page(tmp_path)["red"] == {"v1": (0.7, 1), "base": (0.5, 1)}  # every row resolved: no trace read


def test_the_page_in_slices_of_one_row_gives_the_same_figures(root, monkeypatch):
    compact_feedback(root)
    post(root, (D, "red", 0.7), (A, "admin", 0.1))  # files unresolved beside the merged one
    post(root, (B, "red", 0.6))
    whole = page(root)
    monkeypatch.setattr(queries, "REWARDS_PER_SLICE", 1)
    # a cut at each file's smallest id (the merged file's: 'imported-7'), each slice a row or more
    assert queries._feedback_cuts(str(root), 1) == [A, B]
    assert page(root) == whole


def test_resolved_rewards_outlive_the_retention_of_their_traces(root):
    compact_feedback(root)
    before = page(root)
    assert retain(root, days=1, today=date(2026, 12, 30)) == ["2026-11-30", "2026-12-01"]
    assert page(root)[None] == {k: v for k, v in before[None].items() if k != "v3"}  # 'imported-7' was joined
    assert not Reader(str(root), None, 30).by_checkpoint()["v1"]["traces"]
