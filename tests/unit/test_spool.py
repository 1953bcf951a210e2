import shutil
import struct

import pytest

from traces.spool import Spool, SpoolError, SpoolLocked, read_segment
from traces.store import TraceStore
from traces.writer import TraceWriter, spool_dir


def test_acknowledged_records_are_on_disk_and_a_torn_tail_is_ignored(tmp_path):
    spool = Spool(tmp_path)
    tickets = [spool.append({"trace_id": f"t{i}", "ids": list(range(i))}) for i in range(50)]
    spool.wait(tickets[-1], 5)
    seg = spool.rotate()
    spool.close()
    data = seg.read_bytes()
    seg.write_bytes(data + struct.pack("<II", 1000, 0) + b"x" * 10)  # crashed mid-frame
    records, end = read_segment(seg)
    assert [r["trace_id"] for r in records] == [f"t{i}" for i in range(50)]
    assert end == len(data)
    corrupt = bytearray(data)
    corrupt[-3] ^= 0xFF  # a flipped bit in the last frame: its checksum fails
    seg.write_bytes(bytes(corrupt))
    assert len(read_segment(seg)[0]) == 49


def test_a_full_segment_is_sealed_by_the_spool_while_the_mover_is_busy(tmp_path):
    spool = Spool(tmp_path, max_records=3)
    for i in range(7):  # one at a time: each is its own group
        spool.wait(spool.append({"trace_id": f"t{i}"}), 5)
    sealed = spool.sealed()
    assert spool.segments_filled == 2 and len(sealed) == 2
    assert [[r["trace_id"] for r in read_segment(s)[0]] for s in sealed] == [["t0", "t1", "t2"], ["t3", "t4", "t5"]]
    spool.close()
    assert [r["trace_id"] for r in read_segment(spool.segments()[-1])[0]] == ["t6"]


def test_replaying_a_segment_twice_stores_each_trace_once(tmp_path):
    writer = TraceWriter(tmp_path, "gw", max_age_s=60)
    for i in range(20):
        writer.write({"trace_id": f"tr-{i}", "gen_ai_request_model": "m", "http_status": 200})
    sealed = writer.spool.rotate()
    backup = tmp_path / "backup.spool"
    shutil.copy(sealed, backup)
    writer._convert(sealed)  # converted to Parquet, then the process dies...
    shutil.copy(backup, sealed)  # ...before the segment's unlink reached the disk
    writer.spool.close()
    again = TraceWriter(tmp_path, "gw", max_age_s=60)  # restart: replays the segment
    assert again.replayed == 20
    again.close()
    store = TraceStore(tmp_path)
    assert store.sql("SELECT count(*) AS n, count(DISTINCT trace_id) AS d FROM traces").to_pylist() == [{"n": 20, "d": 20}]
    assert not list(spool_dir(tmp_path, "gw").glob("seg-*.spool"))


def test_a_segment_left_empty_by_a_crash_is_replayed_as_nothing(tmp_path):
    seg_dir = spool_dir(tmp_path, "gw")
    seg_dir.mkdir(parents=True)
    (seg_dir / "seg-000000000007.spool").write_bytes(b"")  # killed right after opening it
    writer = TraceWriter(tmp_path, "gw")
    assert writer.replayed == 0 and not (seg_dir / "seg-000000000007.spool").exists()
    writer.close()


def _rec(i, prefix="tr"):
    return {"trace_id": f"{prefix}-{i}", "gen_ai_request_model": "m", "http_status": 200}


def _ids(root):
    return TraceStore(root).sql("SELECT trace_id FROM traces").column("trace_id").to_pylist()


def test_restarts_with_an_empty_spool_never_overwrite_an_earlier_process_files(tmp_path):
    acked = []
    for life in range(5):  # a clean shutdown converts everything, so each restart finds no segment
        writer = TraceWriter(tmp_path, "gw", max_age_s=60)
        for i in range(7):
            writer.write(_rec(i, f"life{life}"))
            acked.append(f"life{life}-{i}")
        writer.close()
    ids = _ids(tmp_path)
    assert sorted(ids) == sorted(acked) and len(ids) == len(set(ids))


def test_a_killed_writer_is_replayed_at_start_before_any_new_record(tmp_path):
    writer = TraceWriter(tmp_path, "gw", max_age_s=3600)
    for i in range(12):
        writer.write(_rec(i))
    # the process dies: no close(), its spool lock goes with it
    writer._stop.set()
    writer.spool._closed = True
    import os

    os.close(writer.spool._lock_fd)
    seg = next(iter(writer.spool.segments()))
    with open(seg, "ab") as f:  # and its last frame was torn
        f.write(struct.pack("<II", 500, 0) + b"partial")
    again = TraceWriter(tmp_path, "gw", max_age_s=3600)
    assert again.replayed == 12
    assert sorted(_ids(tmp_path)) == sorted(f"tr-{i}" for i in range(12))  # no new traffic needed
    again.close()


def test_a_second_writer_with_the_same_instance_is_refused(tmp_path):
    first = TraceWriter(tmp_path, "gw")
    with pytest.raises(SpoolLocked):
        TraceWriter(tmp_path, "gw")
    other = TraceWriter(tmp_path, "gw-2")  # another instance name is fine
    other.close()
    first.close()
    TraceWriter(tmp_path, "gw").close()  # and the name is free again once the first is gone


def test_a_failed_write_is_reported_and_later_records_are_still_readable(tmp_path, monkeypatch):
    import os

    spool = Spool(tmp_path, header={"fields": ["trace_id"]})
    spool.wait(spool.append({"trace_id": "a"}), 5)
    real_write, calls = os.write, {"n": 0}

    def disk_full(fd, data):  # half the batch reaches the file, then the disk is full
        calls["n"] += 1
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(SpoolError, match="No space left"):
        spool.wait(spool.append({"trace_id": "lost-and-reported"}), 5)
    monkeypatch.setattr(os, "write", real_write)
    spool.wait(spool.append({"trace_id": "b"}), 5)
    spool.close()
    got = [r.get("trace_id") for seg in spool.segments() for r in read_segment(seg)[0]]
    assert calls["n"] == 1 and got == [None, "a", "b"]  # header frame, then both acknowledged records


def test_a_record_written_while_the_mover_lists_segments_is_never_lost(tmp_path, monkeypatch):
    """The mover seals the segment, then lists the sealed ones. A record acknowledged in
    between opens the next segment; were the listing taken outside the spool's lock, that open
    segment would be converted and unlinked while the writer still appends to it (acknowledged
    records of a blue-green run under load went missing this way)."""
    import threading
    import time

    slow_glob = Spool.segments

    def segments(self):  # a mover thread descheduled between the lock and the directory listing
        time.sleep(0.02)
        return slow_glob(self)

    monkeypatch.setattr(Spool, "segments", segments)
    writer = TraceWriter(tmp_path, "gw", max_age_s=0.01)
    acked, stop = [], threading.Event()

    def produce():
        i = 0
        while not stop.is_set():
            writer.write(_rec(i))
            acked.append(f"tr-{i}")
            i += 1

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(1.5)
    stop.set()
    producer.join()
    writer.close()
    assert sorted(_ids(tmp_path)) == sorted(acked) and len(acked) > 50
