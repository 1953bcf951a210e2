"""Rewards and human feedback, stored next to the traces and joined to them by trace id.

Feedback is low-volume and must not be lost once acknowledged, so each batch is written as one
zstd Parquet file (temp file, fsync, rename, fsync the directory) before the caller hears "ok".
Files live under ``<store>/_feedback/date=YYYY-MM-DD/``; the store's ``feedback`` and
``rewards`` views read them.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from traces.spool import fsync_path

FEEDBACK_DIR = "_feedback"
FEEDBACK_SCHEMA = pa.schema([
    ("feedback_id", pa.string()),
    ("trace_id", pa.string()),
    ("team", pa.string()),
    ("api_key_id", pa.string()),
    ("name", pa.string()),          # which reward (e.g. "reward", "correct", "format")
    ("reward", pa.float64()),
    ("score", pa.float64()),
    ("label", pa.string()),
    ("comment", pa.string()),
    ("source", pa.string()),        # "api", "env:<env id>", a labeller's name...
    ("time_created", pa.timestamp("us", tz="UTC")),
], metadata={"flywheel.feedback_schema_version": "1"})


def write_feedback(root: str | Path, items: list[dict]) -> list[str]:
    """Durably store feedback rows (dicts with FEEDBACK_SCHEMA fields); returns their ids."""
    now = datetime.now(timezone.utc)
    rows = [{**item, "feedback_id": item.get("feedback_id") or "fb-" + uuid.uuid4().hex,
             "time_created": item.get("time_created") or now} for item in items]
    part = Path(root) / FEEDBACK_DIR / f"date={now:%Y-%m-%d}"
    part.mkdir(parents=True, exist_ok=True)
    name = f"fb-{now:%H%M%S%f}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = part / f".{name}.tmp"
    pq.write_table(pa.Table.from_pylist(rows, schema=FEEDBACK_SCHEMA), tmp, compression="zstd")
    fsync_path(tmp)
    os.replace(tmp, part / name)
    fsync_path(part)
    return [r["feedback_id"] for r in rows]
