"""An append-only, fsync'd log of trace records: what makes an acknowledged record survive a crash.

Records go to numbered segment files as frames ``[u32 length][u32 crc32][msgpack record]``.
One thread writes and fsyncs whatever has queued up while the previous fsync ran (group
commit), then completes each record's future: a caller that waited on its future knows the
record is on disk. A crash can leave a torn last frame; readers stop at the first frame whose
length or checksum does not match, which can only be a frame nobody was told was durable.
"""

from __future__ import annotations

import os
import queue
import struct
import threading
import zlib
from concurrent.futures import Future
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


class Spool:
    """Segments under ``directory``; ``append`` returns a future resolved once fsync'd."""

    def __init__(self, directory: str | Path, fsync: bool = True):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        existing = self.segments()
        # A previous process's segments are left for replay; we never append to them.
        self._seq = (segment_seq(existing[-1]) + 1) if existing else 1
        self._file = open(segment_path(self.dir, self._seq), "ab")
        self._records_in_segment = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards segment rotation against the writer thread
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="trace-spool", daemon=True)
        self._thread.start()

    def segments(self) -> list[Path]:
        return sorted(self.dir.glob(SEGMENT_GLOB), key=segment_seq)

    @property
    def current_seq(self) -> int:
        return self._seq

    @property
    def records_in_segment(self) -> int:
        return self._records_in_segment

    def append(self, record: dict) -> Future:
        fut: Future = Future()
        if self._closed:
            fut.set_exception(RuntimeError("spool is closed"))
            return fut
        self._queue.put((_encoder.encode(record), fut))
        return fut

    def rotate(self) -> Path | None:
        """Seal the current segment (if it holds records) and start a new one; returns the
        sealed segment, which no writer will touch again."""
        with self._lock:
            if self._records_in_segment == 0:
                return None
            sealed = segment_path(self.dir, self._seq)
            self._file.close()
            self._seq += 1
            self._file = open(segment_path(self.dir, self._seq), "ab")
            self._records_in_segment = 0
            return sealed

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=30)
        with self._lock:
            self._file.close()
            path = segment_path(self.dir, self._seq)
            if self._records_in_segment == 0 and path.exists() and path.stat().st_size == 0:
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
        buf = bytearray()
        for payload, _ in batch:
            buf += _HEADER.pack(len(payload), zlib.crc32(payload))
            buf += payload
        try:
            with self._lock:
                self._file.write(buf)
                self._file.flush()
                if self.fsync:
                    os.fsync(self._file.fileno())
                self._records_in_segment += len(batch)
        except BaseException as exc:  # the disk said no: every waiter must hear it
            for _, fut in batch:
                fut.set_exception(exc)
            return
        for _, fut in batch:
            fut.set_result(None)
