"""Moves trajectory records to Parquet off the response path.

``submit`` only appends to an in-memory queue; a background thread batches records by count or
age into zstd Parquet files partitioned by date (``date=YYYY-MM-DD/``). Each file is written
under a temporary name and renamed, so a reader's glob never sees half a file and several
writer processes can share one directory.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq

from traces.schema import check_record, to_table

log = logging.getLogger(__name__)


class TraceWriter:
    def __init__(self, root: str | Path, max_batch: int = 1000, max_age_s: float = 1.0):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_batch, self.max_age_s = max_batch, max_age_s
        self._queue: queue.Queue[dict | None] = queue.Queue()
        self._flushed = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
        self._thread.start()

    def submit(self, record: dict) -> None:
        check_record(record)
        with self._flushed:
            self._pending += 1
        self._queue.put(record)

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until every submitted record is in a Parquet file; False on timeout."""
        self._queue.put({})  # wakes the thread so it writes what it holds now
        deadline = time.monotonic() + timeout
        with self._flushed:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._flushed.wait(left)
        return True

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        batch: list[dict] = []
        oldest = 0.0
        while True:
            timeout = None if not batch else max(0.0, oldest + self.max_age_s - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = {}
            if item:
                if not batch:
                    oldest = time.monotonic()
                batch.append(item)
                if len(batch) < self.max_batch:
                    continue
            if batch:
                self._write(batch)
                with self._flushed:
                    self._pending -= len(batch)
                    self._flushed.notify_all()
                batch = []
            if item is None:
                return

    def _write(self, batch: list[dict]) -> None:
        try:
            day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
            part = self.root / f"date={day}"
            part.mkdir(parents=True, exist_ok=True)
            name = f"part-{int(time.time() * 1000)}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
            tmp = part / f".{name}.tmp"
            pq.write_table(to_table(batch), tmp, compression="zstd")
            os.replace(tmp, part / name)
        except Exception:  # a bad batch must not kill the writer thread
            log.exception("failed to write %d trace records", len(batch))
