"""An append-only, fsync'd log of trace records: what makes an acknowledged record survive a crash.

Records go to numbered segment files as frames ``[u32 length][u32 crc32][msgpack record]``.
One thread writes and fsyncs whatever has queued up while the previous fsync ran (group
commit), then advances the durable watermark and runs each record's callback: a caller that
waited for its ticket (``wait``) or got its callback knows the record is on disk. Tickets are
plain integers so bulk producers pay nothing per record for synchronisation. A crash can leave a torn last frame; readers stop at the first frame whose
length or checksum does not match, which can only be a frame nobody was told was durable.
"""

from __future__ import annotations

import os
import queue
import struct
import threading
import zlib
from typing import Callable
from pathlib import Path
import msgspec

_HEADER = struct.Struct("<II")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
SEGMENT_GLOB = "seg-*.spool"


def segment_path(directory: Path, seq: int) -> Path:
    return directory / f"seg-{seq:012d}.spool"


def segment_seq(path: Path) -> int:
    return int(path.stem.split("-")[1])


def _frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a rename is durable only once its directory is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_segment(path: Path) -> tuple[list[dict], int]:
    """All intact records of a segment, and the byte offset where intact frames end."""
    data = path.read_bytes()
    records, pos = [], 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        payload = data[pos + _HEADER.size:end]
        if end > len(data) or zlib.crc32(payload) != crc:
            break
        records.append(_decoder.decode(payload))
        pos = end
    return records, pos


class SpoolError(RuntimeError):
    """A record could not be made durable (the write or fsync failed, or the spool closed)."""


class Spool:
    """Segments under ``directory``; ``append`` returns a ticket that ``wait`` turns into
    "this record is fsync'd"."""

    def __init__(self, directory: str | Path, fsync: bool = True, header: dict | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        existing = self.segments()
        # A previous process's segments are left for replay; we never append to them.
        self._seq = (segment_seq(existing[-1]) + 1) if existing else 1
        self._header = _frame(_encoder.encode(header)) if header is not None else b""
        self._file = self._open_segment()
        self._records_in_segment = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards segment rotation against the writer thread
        self._closed = False
        self._ticket_lock = threading.Lock()  # ticket order == queue order
        self._next_ticket = 0
        self._durable = -1                    # every ticket <= this one is on disk or failed
        self._failed: dict[int, BaseException] = {}
        self._durable_cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trace-spool", daemon=True)
        self._thread.start()

    def _open_segment(self):
        """Every segment starts with the header frame (if any), so it decodes on its own."""
        f = open(segment_path(self.dir, self._seq), "ab")
        f.write(self._header)
        return f

    def segments(self) -> list[Path]:
        return sorted(self.dir.glob(SEGMENT_GLOB), key=segment_seq)

    @property
    def current_seq(self) -> int:
        return self._seq

    @property
    def records_in_segment(self) -> int:
        return self._records_in_segment

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
        """Seal the current segment (if it holds records) and start a new one; returns the
        sealed segment, which no writer will touch again."""
        with self._lock:
            if self._records_in_segment == 0:
                return None
            sealed = segment_path(self.dir, self._seq)
            self._file.close()
            self._seq += 1
            self._file = self._open_segment()
            self._records_in_segment = 0
            return sealed

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)
        with self._lock:
            self._file.close()
            path = segment_path(self.dir, self._seq)
            if self._records_in_segment == 0 and path.exists() and path.stat().st_size <= len(self._header):
                path.unlink()

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

    def _write(self, batch: list) -> None:
        buf = b"".join(_frame(payload) for payload, _, _ in batch)
        error: BaseException | None = None
        try:
            with self._lock:
                self._file.write(buf)
                self._file.flush()
                if self.fsync:
                    os.fsync(self._file.fileno())
                self._records_in_segment += len(batch)
        except BaseException as exc:  # the disk said no: every waiter must hear it
            error = exc
        with self._durable_cond:
            if error is not None:
                self._failed.update((ticket, error) for _, ticket, _ in batch)
            self._durable = batch[-1][1]
            self._durable_cond.notify_all()
        for _, _, callback in batch:
            if callback is not None:
                callback(error)
