"""Spool segments to Parquet: the conversion itself, and a process of its own to run it in.

A segment's rows are decoded, turned into Arrow columns and written as zstd Parquet, one file
per partition it has rows for. That is ~20 us of CPU per 200-token row, as much as the request
path spends getting the row durable (``deploy/bench/traces.py --stages-only``), so a gateway that
converts on its own core tops out near 26,000 rows/s. ``MoverProcess`` runs the conversion in a
child process (``python -m traces.mover``), on the other core, while the gateway's thread only
waits for its answer.

The child never removes a segment: it only writes files and says which. The writer hears of
them (``on_converted``) and only then drops the segment, so a crash at any point leaves the
segment to be converted again, into the same file names. The child reads requests on stdin and
exits when it closes: when the writer closes it, or when the gateway dies, however it dies.
"""

from __future__ import annotations

import gc
import os
import signal
import struct
import subprocess
import sys
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.compactor import Compactor
from traces.files import private_dirs, seal
from traces.schema import SPOOL_HEADER, rows_to_table, to_row
from traces.spool import converted_name, read_segment

_LENGTH = struct.Struct("<I")
# A file of fewer rows than this is written without dictionary pages. Each column's dictionary is
# tried, then given up where values do not repeat, and a small file pays that in full: 100 rows
# took 34 against 23 us a row and came out 22 % larger; 1,000 rows 10.8-12.5 against 6.4-8.1
# us and 12-23 % larger (rows that do not repeat within the file). Bigger segments, as at tens
# of thousands of rows a second, keep them: where rows repeat they halve the file.
DICTIONARY_MIN_ROWS = 1000
_encoder, _decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()

# (partition directory, file name, the trace ids in it: empty unless asked for)
Output = tuple[str, str, list[str]]


def partition_of(record: dict) -> tuple[str, str]:
    """(the UTC day it was received, the model's directory name): where a row lands."""
    ts = record.get("time_received") or datetime.now(timezone.utc)
    if ts.tzinfo is not timezone.utc:
        ts = ts.astimezone(timezone.utc)
    return _day(ts.date()), model_dir(record.get("gen_ai_request_model") or "unknown")


@lru_cache(maxsize=1024)
def _day(d) -> str:
    return d.isoformat()


@lru_cache(maxsize=4096)
def model_dir(model: str) -> str:
    return quote(model, safe="")


def read_rows(segment: Path) -> tuple[list[str], list[list]]:
    """A writer segment's field order (from its header frame) and its intact rows."""
    frames, _ = read_segment(segment)
    if not frames:  # opened, then the process died before anything was written: empty
        return [], []
    if not isinstance(frames[0], dict) or "fields" not in frames[0]:
        raise ValueError(f"{segment} has no header frame; not a trace writer segment")
    return frames[0]["fields"], frames[1:]


def convert_segment(root: Path, instance: str, segment: Path, want_ids: bool) -> tuple[int, list[Output]]:
    """Write a segment's rows to Parquet; returns how many distinct rows, and the files."""
    fields, rows = read_rows(segment)
    if not rows:
        return 0, []
    tid = fields.index("trace_id")
    ids = [r[tid] for r in rows]
    if len(set(ids)) < len(ids):  # replayed: an id keeps its last copy
        rows = list({r[tid]: r for r in rows}.values())
    table = rows_to_table(fields, rows)
    outputs = []
    for (date, model_name), part_rows in partitions(table):
        part = private_dirs(root / f"date={date}" / f"model={model_name}")
        name = converted_name(instance, segment)
        # the pid: a mover of a gateway that was killed may still be writing this segment's
        # file while the next gateway replays it
        tmp = part / f".{name}.{os.getpid()}.tmp"
        write_parquet(part_rows, tmp)
        seal(tmp, part / name)
        outputs.append((str(part), name, part_rows.column("trace_id").to_pylist() if want_ids else []))
    return len(rows), outputs


def write_parquet(rows: pa.Table, where) -> None:
    pq.write_table(rows, where, compression="zstd", use_dictionary=rows.num_rows >= DICTIONARY_MIN_ROWS)


def partitions(table: pa.Table):
    """``((date, model directory), rows)`` for each partition the table has rows in, as
    :func:`partition_of` places one row; in columns, since a segment holds ~10^4 rows or more."""
    received = table.column("time_received")
    if received.null_count:
        received = pc.fill_null(received, pa.scalar(datetime.now(timezone.utc), received.type))
    days = pc.cast(received, pa.date32())
    models = pc.fill_null(table.column("gen_ai_request_model"), "unknown")
    keys = pa.table({"day": days, "model": models}).group_by(["day", "model"]).aggregate([])
    if keys.num_rows == 1:  # the usual segment: one day, one model; no copy
        yield (_day(keys.column("day")[0].as_py()), model_dir(keys.column("model")[0].as_py())), table
        return
    for day, model in zip(keys.column("day").to_pylist(), keys.column("model").to_pylist()):
        mask = pc.and_(pc.equal(days, pa.scalar(day, pa.date32())), pc.equal(models, model))
        yield (_day(day), model_dir(model)), table.filter(mask)


class MoverError(RuntimeError):
    """The mover process could not convert a segment (it stays in the spool), or is gone."""


def _send(stream, message) -> None:
    payload = _encoder.encode(message)
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def _receive(stream):
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    return _decoder.decode(stream.read(_LENGTH.unpack(head)[0]))


class MoverProcess:
    """One child process that converts segments, one at a time, for one writer; started with the
    writer (``start``) and again after it died (the segment it was on is tried again)."""

    def __init__(self) -> None:
        self._child: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None and self._child.poll() is None else None

    def start(self) -> None:
        """Start the child now unless it runs. Started on the first segment instead, its start and
        warm-up (~0.4 s idle, over 1 s on a loaded host) delayed the first rows after every ``up``."""
        if self.pid is None:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "traces.mover"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
            )

    def convert(
        self, root: Path, instance: str, segment: Path, want_ids: bool, compact_fanout: int | None = None
    ) -> tuple[int, list[Output]]:
        """Convert ``segment``; with ``compact_fanout``, the child then compacts the partitions it
        wrote to on a thread of its own (``traces/compactor.py``)."""
        self.start()
        try:
            _send(self._child.stdin, [str(root), instance, str(segment), want_ids, compact_fanout])
            reply = _receive(self._child.stdout)
        except (BrokenPipeError, OSError) as exc:
            reply = None
            gone: BaseException | None = exc
        else:
            gone = None
        if reply is None:
            self.close()
            raise MoverError(f"the trace mover process exited while converting {segment.name}") from gone
        if "error" in reply:
            raise MoverError(reply["error"])
        return reply["rows"], [tuple(o) for o in reply["files"]]

    def close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        for stream in (child.stdin, child.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def warm_up() -> None:
    """Convert one row in memory: the first conversion of a process loads pyarrow's kernels and
    the zstd codec (~0.3 s), time a segment waiting for it would spend late."""
    table = rows_to_table(SPOOL_HEADER["fields"], [to_row({"trace_id": "warm-up", "gen_ai_request_model": "warm-up"})])
    for _, rows in partitions(table):
        write_parquet(rows, pa.BufferOutputStream())


def serve(requests, replies) -> None:
    """The child's loop: convert each segment asked for until the writer closes the pipe."""
    compactor = None
    try:
        while (request := _receive(requests)) is not None:
            root, instance, segment, want_ids, compact_fanout = request
            # A segment decodes into ~10^4 lists of ~50 values: the collector would walk them again
            # and again while they are built, and they hold no cycles. It runs once per segment.
            gc.disable()
            try:
                rows, files = convert_segment(Path(root), instance, Path(segment), want_ids)
                _send(replies, {"rows": rows, "files": files})
            except Exception as exc:  # the writer keeps the segment and says why
                _send(replies, {"error": f"could not convert {Path(segment).name}: {type(exc).__name__}: {exc}"})
                continue
            finally:
                gc.enable()
            if compact_fanout and files:
                compactor = compactor or Compactor(root, compact_fanout)
                compactor.wrote(part for part, _, _ in files)
    finally:
        if compactor is not None:
            compactor.close()


if __name__ == "__main__":
    # Ctrl-C reaches the gateway's whole process group: the gateway closes the pipe when it stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # replies on a descriptor of their own: anything a library prints goes to stderr, not into them
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    warm_up()
    serve(sys.stdin.buffer, replies)
