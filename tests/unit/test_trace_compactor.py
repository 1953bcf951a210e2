"""Compaction while the store is written (traces/compactor.py): a partition's files stay few under
sustained ingest, each row is stored once through every merge, a query's snapshot from before a
merge still reads, and a merge that fails or meets another compaction leaves the store as it was."""

import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from traces import compactor as compactor_module
from traces.compactor import Compactor, compact_levels, conversion_waiting, level_of
from traces.housekeeping import JOURNALS, data_files, doctor, housekeeping_lock, partitions, visible_files
from traces.spool import new_lifetime, segment_path
from traces.store import SnapshotGone, TraceStore
from traces.writer import TraceWriter

NOW = datetime(2026, 12, 5, 9, tzinfo=timezone.utc)


def segment(writer: TraceWriter, first: int, rows: int = 5) -> None:
    """``rows`` records, then a flush: one file in the partition."""
    for i in range(first, first + rows):
        writer.write({"trace_id": f"t{i}", "gen_ai_request_model": "m", "time_received": NOW, "completion_token_ids": [i]})
    writer.flush()


def four_files(root) -> Path:
    """Four segments of five rows, converted: their partition."""
    writer = TraceWriter(root, "gw", max_age_s=3600)
    for n in range(4):
        segment(writer, n * 5)
    writer.close()
    (part,) = partitions(root)
    return part


def stored(root) -> dict:
    return TraceStore(root).sql("SELECT count(*) AS n, count(DISTINCT trace_id) AS ids FROM traces").to_pylist()[0]


def base_digits(n: int, base: int) -> list[int]:
    digits = []
    while n:
        n, d = divmod(n, base)
        digits.append(d)
    return digits


def test_levels_keep_a_partitions_files_to_the_digits_of_its_count_and_store_each_row_once(tmp_path):
    """70 segments merged in fours as they come: 70 is 1012 in base 4, so four files are left
    (one of each level's digit), and every row is there once."""
    writer = TraceWriter(tmp_path, "gw", max_age_s=3600)
    most = 0
    for n in range(70):
        segment(writer, n * 5)
        (part,) = partitions(tmp_path)
        report = compact_levels(tmp_path, part, fanout=4)
        assert report is not None
        most = max(most, len(visible_files(part)))
        assert stored(tmp_path) == {"n": (n + 1) * 5, "ids": (n + 1) * 5}  # merged and kept files: each row once
    writer.close()
    levels = sorted(level_of(f.name) for f in visible_files(part))
    digits = base_digits(70, 4)
    assert levels == sorted(level for level, d in enumerate(digits) for _ in range(d)), levels
    assert most <= 3 * len(digits) + 1  # at most fanout - 1 of each level, and the one just written
    assert stored(tmp_path) == {"n": 350, "ids": 350}
    compact_levels(tmp_path, part, fanout=4, keep_inputs_s=0)  # the merges' inputs, kept till now, go
    assert data_files(part) == visible_files(part) and not list(part.glob(JOURNALS))
    assert stored(tmp_path) == {"n": 350, "ids": 350}


def test_a_snapshot_taken_before_a_merge_still_reads_its_files_until_they_have_been_kept_long_enough(tmp_path):
    part = four_files(tmp_path)
    before = TraceStore(tmp_path, sandbox=True)  # a query worker's snapshot, fixed at creation
    assert compact_levels(tmp_path, part, fanout=4)["files_out"] == 1
    assert before.sql("SELECT count(*) AS n FROM traces").to_pylist() == [{"n": 20}]
    assert stored(tmp_path) == {"n": 20, "ids": 20}  # a new snapshot: the merged file alone
    assert len(visible_files(part)) == 1 and len(data_files(part)) == 5
    compact_levels(tmp_path, part, fanout=4, keep_inputs_s=0)
    assert len(data_files(part)) == 1
    with pytest.raises(SnapshotGone):
        before.sql("SELECT count(*) AS n FROM traces")


def test_a_writer_with_compaction_on_merges_beside_the_conversion_and_loses_nothing(tmp_path):
    """The gateway's way: the mover process converts and compacts on a thread of its own; the
    store reads every row once while files come and go."""
    writer = TraceWriter(tmp_path, "gw", max_age_s=3600, mover="process", compact_fanout=3)
    try:
        for n in range(12):
            segment(writer, n * 5)
            assert stored(tmp_path) == {"n": (n + 1) * 5, "ids": (n + 1) * 5}
        (part,) = partitions(tmp_path)
        deadline = time.monotonic() + 60
        while not any(level_of(f.name) == 2 for f in part.glob("*.parquet")):
            assert time.monotonic() < deadline, sorted(f.name for f in part.glob("*.parquet"))
            time.sleep(0.1)
    finally:
        writer.close()
    assert stored(tmp_path) == {"n": 60, "ids": 60}
    assert len(visible_files(part)) <= 2 * 3 + 1


def test_a_merge_that_fails_half_way_leaves_its_inputs_and_no_journal(tmp_path, monkeypatch):
    part = four_files(tmp_path)
    before = sorted(f.name for f in part.glob("*.parquet"))

    def disk_full(tmp, final):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("traces.housekeeping.seal", disk_full)
    with pytest.raises(OSError, match="No space"):
        compact_levels(tmp_path, part, fanout=4)
    assert sorted(f.name for f in part.glob("*.parquet")) == before
    assert not list(part.glob(JOURNALS)) and not list(part.glob(".*.tmp"))
    assert stored(tmp_path) == {"n": 20, "ids": 20}


def test_a_compaction_under_way_elsewhere_is_waited_for_not_joined(tmp_path):
    part = four_files(tmp_path)
    with housekeeping_lock(tmp_path) as held:  # as another process's compaction holds it
        assert held
        assert compact_levels(tmp_path, part, fanout=4) is None
        assert len(list(part.glob("*.parquet"))) == 4
        (part / "_compaction.json").write_text("{}")  # its journal: work in progress, not a problem
        report = doctor(tmp_path)
        assert report["compacting"] and report["interrupted_compactions"] == []
    (part / "_compaction.json").unlink()
    assert compact_levels(tmp_path, part, fanout=4) == {
        "partitions": 1,
        "files_in": 4,
        "files_out": 1,
        "rows": 20,
        "yielded": False,
    }
    assert [level_of(f.name) for f in visible_files(part)] == [1]
    report = doctor(tmp_path)  # the merge's inputs, kept for a while, are not a problem either
    assert report["compacting"] is False and report["interrupted_compactions"] == [] and report["rows"] == 40


def test_the_compactor_gives_way_while_a_segment_waits_for_conversion_and_merges_once_none_does(tmp_path, monkeypatch):
    """Conversion first: while a writer's spool holds a segment besides the one it appends to, no
    merge starts (beside the conversion they cut its throughput by a third); once converted, the
    compactor merges."""
    part = four_files(tmp_path)
    spool, lifetime = tmp_path / "_spool" / "gw-2", new_lifetime()
    spool.mkdir(parents=True)
    segment_path(spool, lifetime, 1).write_bytes(b"")  # being appended to: conversion has no work
    assert not conversion_waiting(tmp_path)
    waiting = segment_path(spool, lifetime, 2)
    waiting.write_bytes(b"")
    assert conversion_waiting(tmp_path)
    report = compact_levels(tmp_path, part, fanout=4, yield_to=lambda: conversion_waiting(tmp_path))
    assert report["yielded"] and report["files_in"] == 0 and len(visible_files(part)) == 4
    looks = []
    monkeypatch.setattr(compactor_module, "conversion_waiting", lambda root: looks.append(conversion_waiting(root)) or looks[-1])
    compactor = Compactor(tmp_path, fanout=4)
    try:
        compactor.wrote([part])
        deadline = time.monotonic() + 30
        while len(looks) < 3:  # it looked three times, gave way each time
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert len(visible_files(part)) == 4
        waiting.unlink()  # converted
        while len(visible_files(part)) != 1:
            assert time.monotonic() < deadline, looks
            time.sleep(0.05)
    finally:
        compactor.close()
    assert looks[:3] == [True] * 3 and looks[-1] is False
    assert stored(tmp_path) == {"n": 20, "ids": 20}
