"""The trace writer: durable on submit, Parquet in the background, idempotent after a crash.

``submit`` prefix-encodes the record and appends it to this writer's spool; its future resolves
once the record is fsync'd, and the gateway finishes a response only after that. A mover
thread seals the spool segment by size or age and turns it (in a process of its own, for a
gateway: ``traces/mover.py``) into zstd Parquet files,
hive-partitioned ``date=YYYY-MM-DD/model=NAME/``, named after the writer instance and segment
key (its process lifetime and number, unique across restarts). Because a segment's file names
are deterministic, replaying it after a crash rewrites its own files instead of adding rows, and
never touches another segment's: nothing acknowledged is lost, nothing is stored twice. At
start-up every segment a previous process left (a partly written last one too) is converted
before the writer takes records, so it is queryable without waiting for new traffic. Several
writer processes may share a root; each needs its own ``instance`` (a second one is refused).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Literal

from traces.compactor import Compactor
from traces.files import private_dirs
from traces.mover import MoverProcess, convert_segment, partition_of
from traces.prefix import PrefixEncoder
from traces.schema import SPOOL_HEADER, check_record, to_row
from traces.spool import Spool, SpoolError, fsync_path

log = logging.getLogger(__name__)


def spool_dir(root: Path, instance: str) -> Path:
    return root / "_spool" / instance


class TraceWriter:
    def __init__(
        self,
        root: str | Path,
        instance: str = "default",
        max_batch: int = 10_000,
        max_age_s: float = 1.0,
        fsync: bool = True,
        prefix_refs: bool = True,
        on_converted: Callable[[Path, str, list[str]], None] | None = None,
        mover: Literal["thread", "process"] = "thread",
        compact_fanout: int | None = None,
    ):
        """``on_converted(partition, file name, trace ids)`` hears of each Parquet file written,
        before its spool segment is dropped (``traces/otlp.py`` keeps it in its outbox).
        ``mover="process"`` converts in a child process (``traces/mover.py``), off the core that
        takes the records: what a gateway does. ``compact_fanout``: merge the partitions written
        to in levels of that many files, beside the conversion (``traces/compactor.py``)."""
        self.root, self.instance = Path(root), instance
        self.on_converted = on_converted
        self.mover_process = MoverProcess() if mover == "process" else None
        if self.mover_process is not None:
            self.mover_process.start()
        self.compact_fanout = compact_fanout
        self.max_age_s = max_age_s
        private_dirs(self.root)
        # prefix_refs=False stores every prompt whole (only benchmarks compare the two)
        self.prefix = PrefixEncoder(min_shared=64 if prefix_refs else 1 << 62)
        self.spool = Spool(spool_dir(self.root, instance), fsync=fsync, header=SPOOL_HEADER, max_records=max_batch)
        self._move_lock = threading.Lock()
        self._backlog, self._backlog_at = 0, float("-inf")
        self._stop = threading.Event()
        self.compactor = Compactor(self.root, compact_fanout) if compact_fanout and mover == "thread" else None
        try:
            self.replayed = self._replay()
        except BaseException:
            self._close_converters()
            raise
        self._thread = threading.Thread(target=self._run, name="trace-mover", daemon=True)
        self._thread.start()

    def submit(self, record: dict, on_durable: Callable[[BaseException | None], None] | None = None) -> int:
        """Queue one record; returns a ticket for ``wait_durable``. ``on_durable`` is called
        (on the spool thread) with None once the record is fsync'd, or with the error."""
        check_record(record)
        date, _ = partition_of(record)
        row, remember = self.prefix.encode(record, date)
        if remember is not None:  # a reference for later turns once on disk, never before

            def durable(error: BaseException | None, then=on_durable) -> None:
                if error is None:
                    remember()
                if then is not None:
                    then(error)

            on_durable = durable
        return self.spool.append(to_row(row), on_durable)

    def wait_durable(self, ticket: int, timeout: float | None = 30.0) -> None:
        self.spool.wait(ticket, timeout)

    def write(self, record: dict, timeout: float | None = 30.0) -> None:
        """Submit and wait until durable."""
        self.wait_durable(self.submit(record), timeout)

    async def write_async(self, record: dict) -> None:
        """Submit and wait until durable, without blocking the event loop."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(_settle, fut, error)

        self.submit(record, done)
        await fut

    def flush(self, timeout: float = 30.0) -> int:
        """Make every record submitted so far queryable in Parquet; returns how many spool
        segments are still waiting for conversion (0: everything durable is queryable)."""
        if self.spool.last_ticket >= 0:
            try:
                self.spool.wait(self.spool.last_ticket, timeout)
            except SpoolError:  # a failed write is reported to its own waiter
                pass
        self._move()
        return len(self.spool.sealed())

    def backlog_bytes(self) -> int:
        """Bytes of records durable in the spool and not yet in Parquet. Looked up at most every
        0.1 s: the gateway asks on every request."""
        now = time.monotonic()
        if now - self._backlog_at >= 0.1:
            self._backlog, self._backlog_at = self.spool.bytes_on_disk(), now
        return self._backlog

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.flush()
        self._close_converters()

    def _close_converters(self) -> None:
        self.spool.close()
        if self.mover_process is not None:
            self.mover_process.close()
        if self.compactor is not None:
            self.compactor.close()

    def _run(self) -> None:
        next_move, seen = time.monotonic() + self.max_age_s, self.spool.segments_filled
        while not self._stop.wait(0.05):
            # the spool seals a segment of max_batch records itself
            if time.monotonic() >= next_move or self.spool.segments_filled != seen:
                seen = self.spool.segments_filled
                self._move()
                next_move = time.monotonic() + self.max_age_s

    def _replay(self) -> int:
        """Convert segments a previous process left behind (it crashed, was killed, or could
        not convert them); raises if one cannot be converted, so nothing is served half-replayed."""
        with self._move_lock:
            return sum(self._convert(seg) for seg in self.spool.sealed())

    def _move(self) -> None:
        """Seal the current segment and convert every sealed one; a segment that fails (the
        disk is full, say) stays in the spool and is tried again on the next move."""
        with self._move_lock:
            self.spool.rotate()
            for seg in self.spool.sealed():
                try:
                    self._convert(seg)
                except Exception as exc:
                    log.warning("could not convert %s to Parquet (retried next move): %s", seg, exc)

    def _convert(self, segment: Path) -> int:
        want_ids = self.on_converted is not None
        if self.mover_process is not None:
            rows, outputs = self.mover_process.convert(self.root, self.instance, segment, want_ids, self.compact_fanout)
        else:
            rows, outputs = convert_segment(self.root, self.instance, segment, want_ids)
        if self.on_converted is not None:
            for part, name, ids in outputs:
                self.on_converted(Path(part), name, ids)
        segment.unlink()
        fsync_path(segment.parent)
        if self.compactor is not None and outputs:
            self.compactor.wrote(part for part, _, _ in outputs)
        return rows


def _settle(fut: asyncio.Future, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(SpoolError(f"trace not durable: {error}"))
