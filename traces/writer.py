"""The trace writer: durable on submit, Parquet in the background, idempotent after a crash.

``submit`` prefix-encodes the record and appends it to this writer's spool; its future resolves
once the record is fsync'd, and the gateway finishes a response only after that. A mover
thread seals the spool segment by size or age and turns it into zstd Parquet files,
hive-partitioned ``date=YYYY-MM-DD/model=NAME/``, named after the writer instance and segment
number. Because the names are deterministic, replaying a segment after a crash (on the next
start) rewrites the same files instead of adding rows: nothing acknowledged is lost, nothing
is stored twice. Several writer processes may share a root; each needs its own ``instance``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq

from traces.prefix import PrefixEncoder
from traces.schema import check_record, to_table
from traces.spool import Spool, fsync_path, read_segment, segment_seq

log = logging.getLogger(__name__)


def partition_of(record: dict) -> tuple[str, str]:
    ts = record.get("time_received") or datetime.now(timezone.utc)
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%d"), quote(
        record.get("gen_ai_request_model") or "unknown", safe="")


def spool_dir(root: Path, instance: str) -> Path:
    return root / "_spool" / instance


class TraceWriter:
    def __init__(self, root: str | Path, instance: str = "default", max_batch: int = 10_000,
                 max_age_s: float = 1.0, fsync: bool = True):
        self.root, self.instance = Path(root), instance
        self.max_batch, self.max_age_s = max_batch, max_age_s
        self.root.mkdir(parents=True, exist_ok=True)
        self.prefix = PrefixEncoder()
        self.spool = Spool(spool_dir(self.root, instance), fsync=fsync)
        self._move_lock = threading.Lock()
        self._last: Future | None = None
        self._submitted = 0
        self._stop = threading.Event()
        self.replayed = self._replay()
        self._thread = threading.Thread(target=self._run, name="trace-mover", daemon=True)
        self._thread.start()

    def submit(self, record: dict) -> Future:
        """Queue one record; the future resolves once it is durable (fsync'd to the spool)."""
        check_record(record)
        date, _ = partition_of(record)
        fut = self.spool.append(self.prefix.encode(record, date))
        self._last = fut
        self._submitted += 1
        return fut

    def flush(self, timeout: float = 30.0) -> bool:
        """Make every record submitted so far queryable in Parquet; False on timeout."""
        last = self._last
        if last is not None:
            try:
                last.result(timeout)
            except Exception:  # a failed write is reported to its own waiter
                pass
        self._move()
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.flush()
        self.spool.close()

    def _run(self) -> None:
        next_move = time.monotonic() + self.max_age_s
        while not self._stop.wait(0.05):
            if time.monotonic() >= next_move or self.spool.records_in_segment >= self.max_batch:
                self._move()
                next_move = time.monotonic() + self.max_age_s

    def _replay(self) -> int:
        """Convert segments a previous process left behind (it crashed or was killed)."""
        rows = 0
        for seg in self.spool.segments():
            if segment_seq(seg) < self.spool.current_seq:
                rows += self._convert(seg)
        return rows

    def _move(self) -> None:
        with self._move_lock:
            sealed = self.spool.rotate()
            if sealed is not None:
                try:
                    self._convert(sealed)
                except Exception:  # the segment stays on disk and is replayed on restart
                    log.exception("could not convert %s to Parquet", sealed)

    def _convert(self, segment: Path) -> int:
        records, _ = read_segment(segment)
        by_id = {r["trace_id"]: r for r in records}  # a replayed id keeps its last copy
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in by_id.values():
            groups.setdefault(partition_of(r), []).append(r)
        for (date, model), rows in groups.items():
            part = self.root / f"date={date}" / f"model={model}"
            part.mkdir(parents=True, exist_ok=True)
            name = f"{self.instance}-{segment_seq(segment):012d}.parquet"
            tmp = part / f".{name}.tmp"
            pq.write_table(to_table(rows), tmp, compression="zstd")
            fsync_path(tmp)
            os.replace(tmp, part / name)
            fsync_path(part)
        segment.unlink()
        return len(by_id)

