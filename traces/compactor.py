"""Compaction while the store is written: each partition's files merged in levels, so that their
number stays bounded under any sustained ingest without the whole partition rewritten each time.

A converted spool segment is a level-0 file. Once ``fanout`` files of one level are in a partition,
they are merged into one file of the next level (``compact-L<n>-<hash>.parquet``), and so on up. A
partition then holds at most ``fanout - 1`` files of each level above 0 and ``2 * fanout - 1`` of
level 0 (the partition is looked at once per ``fanout`` files written), besides those whose segment
is still being converted, and a row is rewritten once per level it climbs: log_fanout(the partition's
files) times. `flywheel traces compact` run on a schedule instead merges every small file into one
on each run, so it rewrites the partition's rows once per run.

The merge is ``traces/housekeeping.py``'s (journal, rename, then delete; crash-safe, never a row
seen twice), under the same lock. A compactor that finds the lock held (another replica's, or a
`flywheel traces compact`) leaves the partition for its next look. A file `compact` merged has no
level and is left alone here, as is one past ``max_file_bytes``.

Conversion comes first: a merge starts only while no writer's spool holds a segment waiting to
be converted (``conversion_waiting``), and the merges run at idle CPU priority, so that they take
only what the conversion and the gateway leave of a core. Run beside the conversion at normal
priority they had cut its throughput by a third at 50,000 rows/s offered (README, "Compaction as
the store is written"). Under a load that leaves no idle core, files pile up until it eases; the
compactor then merges each level's files at once.

Merges come every few seconds under load, so a merge's inputs are not deleted at once: hidden
from new snapshots, they stay ``KEEP_INPUTS_S``, twice a query's default deadline, so that a query
whose snapshot was taken before the merge still reads them (it would fail, and be tried once more
on a new snapshot, and fail again if it outlived the next merge too).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import defaultdict
from pathlib import Path

import duckdb

from traces.housekeeping import (
    JOURNALS,
    KEEP_INPUTS_S,
    TRACE_ROWS,
    being_converted,
    housekeeping_lock,
    merge_part,
    recover,
    visible_files,
)
from traces.spool import SEGMENT_GLOB

log = logging.getLogger(__name__)

DEFAULT_MAX_FILE_BYTES = 256 << 20
YIELD_WAIT_S = 0.25  # how soon a compactor that gave way to the conversion looks again
_LEVELLED = re.compile(r"^compact-L(\d+)-[0-9a-f]{16}\.parquet$")
_MERGED_WHOLE = re.compile(r"^compact-[0-9a-f]{16}\.parquet$")


def level_of(name: str) -> int | None:
    """A file's level: 0 for a converted segment; None for `compact`'s output, never merged here."""
    if m := _LEVELLED.match(name):
        return int(m.group(1))
    return None if _MERGED_WHOLE.match(name) else 0


def compact_levels(
    root: str | Path,
    part: Path,
    fanout: int,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    con=None,
    keep_inputs_s: float = KEEP_INPUTS_S,
    yield_to=lambda: False,
) -> dict | None:
    """Merge each level of ``part`` that holds ``fanout`` files, lowest first (a merge may fill
    the next one up), keeping each merge's inputs ``keep_inputs_s`` (and removing those kept
    that long); before each merge, stop (the report says ``"yielded"``) if ``yield_to()``. The
    report, or None when another compaction holds the store's lock."""
    root = Path(root)
    with housekeeping_lock(root, wait=False) as held:
        if not held:
            return None
        recover(root, keep_s=keep_inputs_s, part=part)
        con = duckdb.connect() if con is None else con
        converting = being_converted(root)
        report = {"partitions": 0, "files_in": 0, "files_out": 0, "rows": 0, "yielded": False}
        try:
            while full := _full_level(part, fanout, max_file_bytes, converting):
                if yield_to():
                    report["yielded"] = True
                    break
                level, inputs = full
                prefix = f"compact-L{level + 1}-"
                merge_part(con, part, inputs, fanout, report, TRACE_ROWS, prefix, keep_inputs=keep_inputs_s > 0)
        except BaseException:
            recover(root, keep_s=keep_inputs_s, part=part)  # interrupted (closing, the disk full): undone, not left half-way
            raise
        return report


def conversion_waiting(root: Path) -> bool:
    """Whether a writer's spool holds a segment waiting for conversion (or being converted):
    more than the one segment it appends to."""
    return any(sum(1 for _ in spool.glob(SEGMENT_GLOB)) > 1 for spool in (root / "_spool").glob("*"))


def _full_level(part: Path, fanout: int, max_file_bytes: int, converting: set[str]) -> tuple[int, list[Path]] | None:
    """The lowest level with ``fanout`` files or more, and its files."""
    levels: dict[int, list[Path]] = defaultdict(list)
    for f in visible_files(part):
        level = level_of(f.name)
        if level is not None and f.name not in converting and f.stat().st_size < max_file_bytes:
            levels[level].append(f)
    return next(((level, files) for level, files in sorted(levels.items()) if len(files) >= fanout), None)


class Compactor:
    """:func:`compact_levels` on a thread of its own, for a partition each ``fanout`` files a
    writer has written into it (``wrote``; at once for one it had not written to yet), and again
    for those with inputs kept once they may go; each merge waits until no segment waits for
    conversion. DuckDB gets one thread.

    A look between those finds nothing to merge, and a look costs: the lock, the partition's
    journals and its listing (with inputs kept a minute, hundreds of names). Looked at after every
    file, at ten files a second, it cost the mover's process ~25 ms a file."""

    def __init__(self, root: str | Path, fanout: int, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES):
        self.root, self.fanout, self.max_file_bytes = Path(root), fanout, max_file_bytes
        self._pending: set[Path] = set()
        self._written: dict[Path, int] = {}  # files written into a partition since it was last looked at
        self._keeping: set[Path] = set()  # partitions whose merges' inputs are kept for now
        self._lock, self._wake, self._closing = threading.Lock(), threading.Event(), False
        self._con = duckdb.connect(config={"threads": 1})
        self._thread = threading.Thread(target=self._run, name="trace-compactor", daemon=True)
        self._thread.start()

    def wrote(self, parts) -> None:
        due = False
        with self._lock:
            for part in map(Path, parts):
                written = self._written[part] = self._written.get(part, self.fanout - 1) + 1
                if written >= self.fanout:
                    self._pending.add(part)
                    due = True
        if due:
            self._wake.set()

    def _look_again(self, parts) -> None:
        with self._lock:
            self._pending.update(parts)
        self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop; a merge under way is interrupted and undone (its inputs stay)."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=0.5)
        if self._thread.is_alive():
            self._con.interrupt()
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        # the merges run on this thread (DuckDB with one thread runs a query on its caller's):
        # at idle priority they take only what the conversion and the gateway leave of a core
        if hasattr(os, "SCHED_IDLE"):  # Linux
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        yielded = False
        while True:
            if yielded:  # the conversion had work: look again shortly
                self._wake.wait(timeout=YIELD_WAIT_S)
            elif not self._wake.wait(timeout=KEEP_INPUTS_S if self._keeping else None):
                self._look_again(self._keeping)  # quiet since: what was kept may go now
            self._wake.clear()
            if self._closing:
                return
            # asked first, and again before each merge: under load most looks end here, without the
            # lock, the journals' recovery and the levels' listing that compact_levels starts with
            with self._lock:
                pending = bool(self._pending)
            yielded = pending and conversion_waiting(self.root)
            if yielded:
                continue  # the partitions stay pending
            with self._lock:
                parts, self._pending = self._pending, set()
            for part in sorted(parts):
                if self._closing:
                    return
                try:
                    report = compact_levels(
                        self.root,
                        part,
                        self.fanout,
                        self.max_file_bytes,
                        self._con,
                        yield_to=lambda: conversion_waiting(self.root),
                    )
                except Exception as exc:
                    if not self._closing:
                        log.warning("could not compact %s (tried again at its next file): %s", part, exc)
                    continue
                if report is None or report["yielded"]:
                    yielded = yielded or report is not None
                    with self._lock:  # another compaction holds the store, or the conversion has work
                        self._pending.add(part)
                    continue
                with self._lock:
                    self._written[part] = 0
                if any(part.glob(JOURNALS)):
                    self._keeping.add(part)
                else:
                    self._keeping.discard(part)
            if self._closing:
                return
