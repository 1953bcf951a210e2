"""The gateway's trace ids: ``tr-``, the millisecond the id was made (12 hex digits), 80 random
bits. Ids sort by time, which is what lets a lookup by id skip files and row groups: the trace
browser's and a feedback merge's checkpoint lookup (``traces.feedback_checkpoints``) bound their
scans by it."""

from __future__ import annotations

import os
import time
from datetime import date, datetime, timedelta, timezone


def new_trace_id() -> str:
    """``tr-`` and 32 hex digits: the millisecond it was made (12), as UUIDv7 leads with it, then
    80 random bits. Ids sort by time, so the rows a writer segment holds cover a narrow id range
    and a lookup by id skips every Parquet row group whose range cannot hold it (random ids
    would make it read the id column of the whole store)."""
    return f"tr-{time.time_ns() // 1_000_000:012x}" + os.urandom(10).hex()


def trace_id_made(trace_id: str) -> datetime | None:
    """When :func:`new_trace_id` made ``trace_id`` (None: an id of another shape)."""
    stamp = trace_id[3:15]
    if not trace_id.startswith("tr-") or len(stamp) != 12:
        return None
    try:
        return datetime.fromtimestamp(int(stamp, 16) / 1000, timezone.utc)
    except (ValueError, OverflowError, OSError):  # not hex, or past the year 9999
        return None


ID_SLACK = timedelta(minutes=1)


def id_days(trace_id: str) -> list[date]:
    """The days a gateway-made id was received on (its partitions' dates), give or take
    ``ID_SLACK``; none for an id of another shape. Its row is there unless the id came from
    elsewhere: a caller looks further."""
    made = trace_id_made(trace_id)
    if made is None:
        return []
    try:
        return sorted({(made - ID_SLACK).date(), (made + ID_SLACK).date()})
    except OverflowError:  # within a minute of the year 1 or 9999
        return []
