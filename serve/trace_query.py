"""Read-only SQL over the trace store for data teams (``POST /v1/traces/query``, in
``serve/api/traces.py``), the trace browser and the Responses API's conversations.

A team key sees only its team's rows; the admin key sees all. Either way the statement must be
a single SELECT over the store's views and cannot touch any other file (``traces.guard`` and a
locked DuckDB connection). Queries run in a worker process (``serve.query_pool``) under a
deadline and a memory cap; the answer is serialised there too, row by row as DuckDB streams
it, and stops at ``max_rows`` or ``max_result_bytes``, whichever comes first.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
from pydantic import BaseModel, Field

from serve.config import GatewayConfig
from serve.errors import APIError
from serve.query_pool import QueryDeadline, QueryTooLarge, QueryWorkerLost
from traces.guard import QueryRefused
from traces.store import SnapshotGone, TraceStore


class QueryRequest(BaseModel):
    sql: str = Field(min_length=1)
    max_rows: int = Field(10_000, ge=1, le=1_000_000)


@dataclass(frozen=True)
class QueryLimits:
    """What one query may take: its deadline, its answer's bytes, DuckDB's memory and spill."""

    timeout_s: float = 30.0
    max_bytes: int = 64 << 20
    memory_limit: str = "1GB"
    spill_dir: str | None = None
    max_spill_bytes: int = 0

    @classmethod
    def of(cls, config: GatewayConfig) -> "QueryLimits":
        q = config.query
        # DuckDB's buffer pool gets half of what the worker has past its ~300 MB of imports: the
        # rest is for what DuckDB does not count (strings an expression builds, Arrow results)
        return cls(
            config.query_timeout_s, q.max_result_bytes, f"{(q.memory_mb - 384) // 2}MB", spill_root(config), q.max_spill_mb << 20
        )


def spill_root(config: GatewayConfig) -> str:
    """Where this replica's query workers spill (each in a folder named by its PID)."""
    return config.query.spill_dir or str(Path(tempfile.gettempdir()) / f"flywheel-query-spill-{config.instance_name}")


def scoped_store(root: str, team: str | None, limits: QueryLimits = QueryLimits(), sealed: bool = True) -> TraceStore:
    """The one way the gateway opens the store (this endpoint and the trace browser): a
    sandboxed snapshot scoped to ``team`` (None: the admin, every team) that accepts only
    guarded SELECTs. ``sealed`` False only for statements the gateway writes (``TraceStore``)."""
    spill = None
    if limits.spill_dir and limits.max_spill_bytes:
        spill = Path(limits.spill_dir, str(os.getpid()))
        spill.mkdir(parents=True, exist_ok=True, mode=0o700)
    return TraceStore(
        root,
        team=team,
        sandbox=True,
        threads=1,
        memory_limit=limits.memory_limit,
        spill_dir=spill,
        max_spill_bytes=limits.max_spill_bytes,
        sealed=sealed,
    )


class Deadline:
    """Interrupts a store's query once ``timeout_s`` have passed since it was made."""

    def __init__(self, store: TraceStore, timeout_s: float):
        self.timer = threading.Timer(timeout_s, store.con.interrupt)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()


def scoped_query(store: TraceStore, sql: str, limit: int, timeout_s: float, params: list | None = None):
    """At most ``limit`` rows (DuckDB stops producing once it has them, so a huge result is
    never built in full), interrupted after ``timeout_s``."""
    with Deadline(store, timeout_s):
        return store.sql(sql, limit=limit, params=params)


def answer(root: str, team: str | None, sql: str, max_rows: int, limits: QueryLimits) -> bytes:
    """The endpoint's JSON answer, built in a query worker: rows encoded as they stream out of
    DuckDB, until ``max_rows`` or ``limits.max_bytes`` (then ``truncated`` is true)."""
    try:
        return _answer(scoped_store(root, team, limits), sql, max_rows, limits, team)
    except SnapshotGone:  # housekeeping removed a file under us: one more try on a new snapshot
        return _answer(scoped_store(root, team, limits), sql, max_rows, limits, team)


def _answer(store: TraceStore, sql: str, max_rows: int, limits: QueryLimits, team: str | None) -> bytes:
    rows: list[str] = []
    size, truncated = 0, False
    with Deadline(store, limits.timeout_s):
        columns, batches = store.batches(sql)
        for batch in batches:
            for row in json_rows(batch):
                if len(rows) == max_rows or size + len(row) + 1 > limits.max_bytes:
                    truncated = True
                    break
                rows.append(row)
                size += len(row) + 1
            if truncated:
                break
    if truncated and not rows and max_rows > 0:
        raise QueryTooLarge(f"the first row alone is over the {limits.max_bytes:,} bytes a query may return")
    head = json.dumps({"columns": columns, "row_count": len(rows), "truncated": truncated, "scope": team or "all"})
    return f'{head[:-1]}, "rows": [{", ".join(rows)}]}}'.encode()


def json_rows(batch: pa.RecordBatch) -> list[str]:
    """Each row of ``batch`` as a JSON array. Values JSON has no form for are written as
    strings: times and dates ISO (also those outside Python's years 1-9999), NaN and the
    infinities as "NaN", "Infinity", "-Infinity" (as protobuf's JSON mapping does)."""
    columns = [_py_values(batch.column(i)) for i in range(batch.num_columns)]
    return [json.dumps([_finite(v) for v in row], default=str, allow_nan=False) for row in zip(*columns)] if columns else []


def _py_values(column: pa.Array) -> list:
    try:
        return column.to_pylist()
    except (ValueError, OverflowError):  # a date or time Python cannot hold (year 0, 10000...)
        return column.cast(pa.string()).to_pylist()


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def query_failure(exc: Exception, timeout_s: float) -> APIError | None:
    """The client's error for a query that failed (None: not a query failure, a bug)."""
    if isinstance(exc, QueryRefused):
        return APIError(400, f"query refused: {exc}", param="sql")
    if isinstance(exc, (duckdb.InterruptException, QueryDeadline)):
        return APIError(408, f"query exceeded {timeout_s:.0f} s", param="sql")
    if isinstance(exc, (duckdb.OutOfMemoryException, QueryTooLarge)):
        return APIError(413, f"query too large: {exc}", code="query_too_large", param="sql")
    if isinstance(exc, QueryWorkerLost):
        return APIError(503, f"query failed: {exc}; try again", code="query_worker_lost")
    if isinstance(exc, duckdb.Error):
        return APIError(400, f"query failed: {exc}", param="sql")
    return None
