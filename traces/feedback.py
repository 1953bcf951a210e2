"""Rewards and human feedback, stored next to the traces and joined to them by trace id.

Feedback must not be lost once acknowledged, so it is written as zstd Parquet (temp file,
fsync, rename, fsync the directory) before the caller hears "ok". Posts that arrive while a
write is under way are written together, as one file (group commit), and a day that reaches
``COMPACT_AT`` files is compacted into one (``traces.housekeeping``): every query reads each
file's footer, and 2,000 posts of one file each added 1.5 s to every query of every team. The
merged files stay ``KEEP_INPUTS_S`` for the queries that listed them: posted fast, feedback is
merged every few seconds, and a loop reading its team's rewards lost three snapshots in a row.
Files live under ``<store>/_feedback/date=YYYY-MM-DD/``; the store's ``feedback`` and
``rewards`` views read them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from traces.files import private_dirs, seal
from traces.housekeeping import KEEP_INPUTS_S, compact_feedback, visible_files
from traces.schema import FEEDBACK_DIR

log = logging.getLogger(__name__)
FEEDBACK_SCHEMA = pa.schema(
    [
        ("feedback_id", pa.string()),
        ("trace_id", pa.string()),
        ("team", pa.string()),
        ("api_key_id", pa.string()),
        ("name", pa.string()),  # which reward (e.g. "reward", "correct", "format")
        ("reward", pa.float64()),
        ("score", pa.float64()),
        ("label", pa.string()),
        ("comment", pa.string()),
        ("source", pa.string()),  # "api", "env:<env id>", a labeller's name...
        ("time_created", pa.timestamp("us", tz="UTC")),
        # the checkpoint that served the trace ('base': the base model), filled in when the day's
        # files are merged, for feedback its trace's team can see; NULL until then (version 2)
        ("checkpoint_version", pa.string()),
    ],
    metadata={"flywheel.feedback_schema_version": "2"},
)


COMPACT_AT = 32  # files in a day's partition


def write_feedback(root: str | Path, items: list[dict]) -> list[str]:
    """Durably store feedback rows (dicts with FEEDBACK_SCHEMA fields); returns their ids once
    they are on disk."""
    now = datetime.now(timezone.utc)
    rows = [
        {
            **item,
            "feedback_id": item.get("feedback_id") or "fb-" + uuid.uuid4().hex,
            "time_created": item.get("time_created") or now,
            "checkpoint_version": None,  # a merge's lookup fills it, by the visibility rule
        }
        for item in items
    ]
    _writer(Path(root)).write(rows)
    return [r["feedback_id"] for r in rows]


class _Waiter:
    def __init__(self, rows: list[dict]):
        self.rows, self.done, self.error = rows, threading.Event(), None


class FeedbackWriter:
    """Group commit for one store: the first caller writes what every caller queued meanwhile,
    the others wait for it. No thread of its own, so nothing to start or stop."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._queued: list[_Waiter] = []
        self._writing = False

    def write(self, rows: list[dict]) -> None:
        waiter = _Waiter(rows)
        with self._lock:
            self._queued.append(waiter)
            if self._writing:
                leader = False
            else:
                self._writing = leader = True
        if leader:
            self._lead()
        waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error

    def _lead(self) -> None:
        while True:
            with self._lock:
                batch, self._queued = self._queued, []
                if not batch:
                    self._writing = False
                    return
            try:
                part = self._write_file([r for w in batch for r in w.rows])
            except BaseException as exc:  # each waiter hears it; none was acknowledged
                part = None
                for w in batch:
                    w.error = exc
            for w in batch:
                w.done.set()
            if part is not None:
                self._compact_if_due(part)

    def _write_file(self, rows: list[dict]) -> Path:
        """Write one file of ``rows``; returns the day's folder it is in."""
        now = datetime.now(timezone.utc)
        part = private_dirs(self.root / FEEDBACK_DIR / f"date={now:%Y-%m-%d}")
        name = f"fb-{now:%H%M%S%f}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = part / f".{name}.tmp"
        pq.write_table(pa.Table.from_pylist(rows, schema=FEEDBACK_SCHEMA), tmp, compression="zstd")
        seal(tmp, part / name)
        return part

    def _compact_if_due(self, part: Path) -> None:
        try:
            # the files a query sees: the merged files kept beside their output are not counted
            if len(visible_files(part)) >= COMPACT_AT:
                compact_feedback(self.root, [part], keep_inputs_s=KEEP_INPUTS_S)
        except Exception as exc:  # the rows are safe; compaction is tried on the next write
            log.warning("could not compact feedback: %s", exc)


_WRITERS: dict[Path, FeedbackWriter] = {}
_WRITERS_LOCK = threading.Lock()


def _writer(root: Path) -> FeedbackWriter:
    with _WRITERS_LOCK:
        return _WRITERS.setdefault(root.resolve(), FeedbackWriter(root))
