import shutil
import struct

from traces.spool import Spool, read_segment
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


def test_replaying_a_segment_twice_stores_each_trace_once(tmp_path):
    writer = TraceWriter(tmp_path, "gw", max_age_s=60)
    for i in range(20):
        writer.write({"trace_id": f"tr-{i}", "gen_ai_request_model": "m", "http_status": 200})
    sealed = writer.spool.rotate()
    backup = tmp_path / "backup.spool"
    shutil.copy(sealed, backup)
    writer._convert(sealed)           # converted to Parquet, then the process dies...
    shutil.copy(backup, sealed)       # ...before the segment's unlink reached the disk
    writer.spool.close()
    again = TraceWriter(tmp_path, "gw", max_age_s=60)  # restart: replays the segment
    assert again.replayed == 20
    again.close()
    store = TraceStore(tmp_path)
    assert store.sql("SELECT count(*) AS n, count(DISTINCT trace_id) AS d FROM traces").to_pylist() == \
        [{"n": 20, "d": 20}]
    assert not list(spool_dir(tmp_path, "gw").glob("seg-*.spool"))


def test_a_segment_left_empty_by_a_crash_is_replayed_as_nothing(tmp_path):
    seg_dir = spool_dir(tmp_path, "gw")
    seg_dir.mkdir(parents=True)
    (seg_dir / "seg-000000000007.spool").write_bytes(b"")  # killed right after opening it
    writer = TraceWriter(tmp_path, "gw")
    assert writer.replayed == 0 and not (seg_dir / "seg-000000000007.spool").exists()
    writer.close()
