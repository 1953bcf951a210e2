"""An append-only, fsync'd log of trace records: what makes an acknowledged record survive a crash.

Records go to segment files as frames ``[u32 length][u32 crc32][msgpack record]``. One thread
writes and fsyncs whatever has queued up while the previous fsync ran (group commit), then
advances the durable watermark and runs each record's callback: a caller that waited for its
ticket (``wait``) or got its callback knows the record is on disk. Tickets are plain integers so
bulk producers pay nothing per record for synchronisation.

Segments are named ``seg-<lifetime>-<seq>.spool``: ``lifetime`` is new for every process that
opens the spool, so no process ever writes, or names anything after, a segment of an earlier
one (a restart with an empty spool used to start counting at 1 again and overwrite the previous
process's Parquet files). One process at a time owns a spool directory (an exclusive lock).

A crash can leave a torn last frame; readers stop at the first frame whose length or checksum
does not match, which can only be a frame nobody was told was durable. A write that fails (disk
full, read-only) is cut off again, or, if even that fails, its segment is abandoned, so frames
acknowledged later never sit behind a torn one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import secrets
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Callable

import msgspec

from traces.files import fsync_path, private_dirs

log = logging.getLogger(__name__)
_HEADER = struct.Struct("<II")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
SEGMENT_GLOB = "seg-*.spool"
LOCK_FILE = ".lock"


def new_lifetime() -> str:
    """Unique per process lifetime; sorts by start time (microseconds, hex) then at random."""
    return f"{time.time_ns() // 1000:013x}{secrets.token_hex(2)}"


def segment_path(directory: Path, lifetime: str, seq: int) -> Path:
    return directory / f"seg-{lifetime}-{seq:08d}.spool"


def segment_key(path: Path) -> str:
    """What names a segment's outputs: ``<lifetime>-<seq>`` (or the old ``<seq>``)."""
    return path.stem.removeprefix("seg-")


def converted_name(instance: str, segment: Path) -> str:
    """The Parquet file a segment becomes in each partition it has rows for."""
    return f"{instance}-{segment_key(segment)}.parquet"


def frame(payload: bytes) -> bytes:
    """One record as it lies in a segment: length, checksum, payload."""
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def read_segment(path: Path) -> tuple[list[dict], int]:
    """All intact records of a segment, and the byte offset where intact frames end."""
    data = memoryview(path.read_bytes())  # frames are checked and decoded in place, not copied
    records, pos, size, decode, crc32 = [], 0, len(data), _decoder.decode, zlib.crc32
    while pos + _HEADER.size <= size:
        length, crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        payload = data[pos + _HEADER.size : end]
        if end > size or crc32(payload) != crc:
            break
        records.append(decode(payload))
        pos = end
    return records, pos


class SpoolError(RuntimeError):
    """A record could not be made durable (the write or fsync failed, or the spool closed)."""


class SpoolLocked(SpoolError):
    """Another live process owns this spool directory."""


def _lock(directory: Path) -> int:
    # read-only: an fd open for writing would keep the filesystem from being remounted read-only
    fd = os.open(directory / LOCK_FILE, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpoolLocked(f"{directory} is in use by another live process; each writer needs its own instance name") from None
    return fd


class Spool:
    """Segments under ``directory``; ``append`` returns a ticket that ``wait`` turns into
    "this record is fsync'd". Segments of earlier lifetimes are left alone for the caller to
    replay (``sealed``)."""

    def __init__(self, directory: str | Path, fsync: bool = True, header: dict | None = None, max_records: int | None = None):
        """``max_records``: a segment holding that many is sealed by the spool itself, so
        segments stay that size while the mover is busy converting earlier ones."""
        self.dir = private_dirs(Path(directory))
        self.max_records, self._filled = max_records, 0
        self._lock_fd = _lock(self.dir)
        self.fsync = fsync
        self.lifetime = new_lifetime()
        self._seq = 1
        self._header = frame(_encoder.encode(header)) if header is not None else b""
        self._fd: int | None = None  # the open segment; opened by the first write into it
        self._offset = 0  # bytes of intact frames in it
        self._records_in_segment = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards segment rotation against the writer thread
        self._closed = False
        self._ticket_lock = threading.Lock()  # ticket order == queue order
        self._next_ticket = 0
        self._durable = -1  # every ticket <= this one is on disk or failed
        self._failed: dict[int, BaseException] = {}
        self._durable_cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trace-spool", daemon=True)
        self._thread.start()

    def segments(self) -> list[Path]:
        return sorted(self.dir.glob(SEGMENT_GLOB), key=segment_key)

    def bytes_on_disk(self) -> int:
        """What every segment holds: the one being written and those waiting for conversion."""
        total = 0
        for seg in self.dir.glob(SEGMENT_GLOB):
            try:
                total += seg.stat().st_size
            except FileNotFoundError:  # converted and dropped since the listing
                pass
        return total

    def sealed(self) -> list[Path]:
        """Every segment no writer will touch again: all but the one being written. Listed under
        the lock: a segment the writer opens after an unlocked look would pass for sealed, be
        converted and unlinked, and the records it goes on taking would be lost."""
        with self._lock:
            current = segment_path(self.dir, self.lifetime, self._seq) if self._fd is not None else None
            return [s for s in self.segments() if s != current]

    @property
    def segments_filled(self) -> int:
        """How many segments the spool has sealed for holding ``max_records``."""
        return self._filled

    def append(self, record: dict, callback: Callable[[BaseException | None], None] | None = None) -> int:
        """Queue a record; returns its ticket. ``callback(None)`` (or ``callback(error)``) runs
        on the spool thread once the record is durable (or could not be made so)."""
        if self._closed:
            raise SpoolError("the trace spool is closed")
        payload = _encoder.encode(record)
        with self._ticket_lock:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queue.put((payload, ticket, callback))
        return ticket

    @property
    def durable_count(self) -> int:
        """How many records appended so far are on disk (or failed): tickets below it are settled."""
        return self._durable + 1

    @property
    def last_ticket(self) -> int:
        return self._next_ticket - 1

    def wait(self, ticket: int, timeout: float | None = None) -> None:
        """Block until ``ticket`` is durable; raises SpoolError if it failed or on timeout."""
        with self._durable_cond:
            if not self._durable_cond.wait_for(lambda: self._durable >= ticket, timeout):
                raise SpoolError(f"record {ticket} not durable after {timeout} s")
            if ticket in self._failed:
                raise SpoolError(f"record {ticket} was not written: {self._failed[ticket]}")

    def rotate(self) -> Path | None:
        """Seal the current segment (if it holds records); the next write opens a new one.
        Returns the sealed segment, which no writer will touch again."""
        with self._lock:
            if self._fd is None or self._records_in_segment == 0:
                return None
            sealed = segment_path(self.dir, self.lifetime, self._seq)
            self._close_segment()
            return sealed

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)
        with self._lock:
            if self._fd is not None:
                empty = self._offset == 0
                path = segment_path(self.dir, self.lifetime, self._seq)
                self._close_segment()
                if empty:
                    path.unlink(missing_ok=True)
        os.close(self._lock_fd)

    def _close_segment(self) -> None:
        os.close(self._fd)
        self._fd, self._offset, self._records_in_segment = None, 0, 0
        self._seq += 1

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = []
            item = self._queue.get()
            while True:  # take everything queued during the last fsync: one write, one fsync
                if item is None:
                    stop = True
                else:
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._write(batch)

    def _write_locked(self, buf: bytes) -> None:
        if self._fd is None:
            path = segment_path(self.dir, self.lifetime, self._seq)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            if self.fsync:
                fsync_path(self.dir)  # the new segment's name must survive a crash too
        if self._offset == 0:
            buf = self._header + buf  # every segment starts with the header, so it decodes alone
        view = memoryview(buf)
        while view:
            view = view[os.write(self._fd, view) :]
        if self.fsync:
            os.fsync(self._fd)
        self._offset += len(buf)

    def _write(self, batch: list) -> None:
        buf = b"".join(frame(payload) for payload, _, _ in batch)
        error: BaseException | None = None
        with self._lock:
            try:
                self._write_locked(buf)
                self._records_in_segment += len(batch)
                if self.max_records is not None and self._records_in_segment >= self.max_records:
                    self._close_segment()
                    self._filled += 1
            except BaseException as exc:  # the disk said no: every waiter must hear it
                error = exc
                self._cut_back()
        # callbacks first: what one does on durability (the writer remembers a turn as a prefix
        # reference) is done before a waiter on the same ticket hears of it
        for _, _, callback in batch:
            if callback is not None:
                try:
                    callback(error)
                except Exception:  # one caller's callback (a closed event loop) must not stop the rest
                    log.exception("a durability callback failed")
        with self._durable_cond:
            if error is not None:
                self._failed.update((ticket, error) for _, ticket, _ in batch)
            self._durable = batch[-1][1]
            self._durable_cond.notify_all()

    def _cut_back(self) -> None:
        """After a failed write: drop its partial bytes, or give up the segment if we cannot,
        so that later frames never follow a torn one."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._offset)
        except OSError:
            os.close(self._fd)
            self._fd, self._offset, self._records_in_segment = None, 0, 0
            self._seq += 1
