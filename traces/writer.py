"""The trace writer: durable on submit, Parquet in the background, idempotent after a crash.

``submit`` prefix-encodes the record and appends it to this writer's spool; its future resolves
once the record is fsync'd, and the gateway finishes a response only after that. A mover
thread seals the spool segment by size or age and turns it into zstd Parquet files,
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
from functools import lru_cache
from typing import Callable
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq

from traces.files import private_dirs, seal
from traces.prefix import PrefixEncoder
from traces.schema import SPOOL_HEADER, check_record, rows_to_table, to_row
from traces.spool import Spool, SpoolError, fsync_path, read_segment, segment_key

log = logging.getLogger(__name__)


def partition_of(record: dict) -> tuple[str, str]:
    ts = record.get("time_received") or datetime.now(timezone.utc)
    if ts.tzinfo is not timezone.utc:
        ts = ts.astimezone(timezone.utc)
    return _day(ts.date()), _model_dir(record.get("gen_ai_request_model") or "unknown")


@lru_cache(maxsize=1024)
def _day(d) -> str:
    return d.isoformat()


@lru_cache(maxsize=4096)
def _model_dir(model: str) -> str:
    return quote(model, safe="")


def spool_dir(root: Path, instance: str) -> Path:
    return root / "_spool" / instance


def converted_name(instance: str, segment: Path) -> str:
    """The Parquet file a segment becomes in each partition it has rows for."""
    return f"{instance}-{segment_key(segment)}.parquet"


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
    ):
        """``on_converted(partition, file name, trace ids)`` hears of each Parquet file written,
        before its spool segment is dropped (``traces/otlp.py`` keeps it in its outbox)."""
        self.root, self.instance = Path(root), instance
        self.on_converted = on_converted
        self.max_batch, self.max_age_s = max_batch, max_age_s
        private_dirs(self.root)
        # prefix_refs=False stores every prompt whole (only benchmarks compare the two)
        self.prefix = PrefixEncoder(min_shared=64 if prefix_refs else 1 << 62)
        self.spool = Spool(spool_dir(self.root, instance), fsync=fsync, header=SPOOL_HEADER)
        self._move_lock = threading.Lock()
        self._stop = threading.Event()
        try:
            self.replayed = self._replay()
        except BaseException:
            self.spool.close()
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
        fields, rows = read_rows(segment)
        if not rows:
            segment.unlink()
            fsync_path(segment.parent)
            return 0
        tid, ts, model = (fields.index(f) for f in ("trace_id", "time_received", "gen_ai_request_model"))
        by_id = {r[tid]: r for r in rows}  # a replayed id keeps its last copy
        groups: dict[tuple[str, str], list[list]] = {}
        for r in by_id.values():
            groups.setdefault(partition_of({"time_received": r[ts], "gen_ai_request_model": r[model]}), []).append(r)
        for (date, model), rows in groups.items():
            part = private_dirs(self.root / f"date={date}" / f"model={model}")
            name = converted_name(self.instance, segment)
            tmp = part / f".{name}.tmp"
            pq.write_table(rows_to_table(fields, rows), tmp, compression="zstd")
            seal(tmp, part / name)
            if self.on_converted is not None:
                self.on_converted(part, name, [r[tid] for r in rows])
        segment.unlink()
        fsync_path(segment.parent)
        return len(by_id)


def read_rows(segment: Path) -> tuple[list[str], list[list]]:
    """A writer segment's field order (from its header frame) and its intact rows."""
    frames, _ = read_segment(segment)
    if not frames:  # opened, then the process died before anything was written: empty
        return [], []
    if not isinstance(frames[0], dict) or "fields" not in frames[0]:
        raise ValueError(f"{segment} has no header frame; not a trace writer segment")
    return frames[0]["fields"], frames[1:]


def _settle(fut: asyncio.Future, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(SpoolError(f"trace not durable: {error}"))
