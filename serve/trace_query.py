"""`POST /v1/traces/query`: read-only SQL over the trace store for data teams.

A team key sees only its team's rows; the admin key sees all. Either way the statement must be
a single SELECT over the store's views and cannot touch any other file (``traces.guard`` and a
locked DuckDB connection). Queries run in a worker thread with a row cap and a time limit.
"""

from __future__ import annotations

import json
import threading

import duckdb
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, Field

from serve.errors import APIError
from serve.openapi import json_body
from traces.guard import QueryRefused
from traces.store import SnapshotGone, TraceStore


class QueryRequest(BaseModel):
    sql: str = Field(min_length=1)
    max_rows: int = Field(10_000, ge=1, le=1_000_000)


def _run(root: str, team: str | None, req: QueryRequest, timeout_s: float) -> dict:
    try:
        table = scoped_query(scoped_store(root, team), req.sql, req.max_rows + 1, timeout_s)
    except SnapshotGone:  # housekeeping removed a file under us: one more try on a new snapshot
        table = scoped_query(scoped_store(root, team), req.sql, req.max_rows + 1, timeout_s)
    rows = table.slice(0, req.max_rows).to_pylist()
    return {"columns": table.column_names, "rows": [list(r.values()) for r in rows],
            "row_count": len(rows), "truncated": table.num_rows > req.max_rows,
            "scope": team or "all"}


def scoped_store(root: str, team: str | None) -> TraceStore:
    """The one way the gateway opens the store (this endpoint and the trace browser): a
    sandboxed snapshot scoped to ``team`` (None: the admin, every team) that accepts only
    guarded SELECTs."""
    return TraceStore(root, team=team, sandbox=True, threads=1)


def scoped_query(store: TraceStore, sql: str, limit: int, timeout_s: float, params: list | None = None):
    """At most ``limit`` rows (DuckDB stops producing once it has them, so a huge result is
    never built in full), interrupted after ``timeout_s``."""
    timer = threading.Timer(timeout_s, store.con.interrupt)
    timer.start()
    try:
        return store.sql(sql, limit=limit, params=params)
    finally:
        timer.cancel()


def router(traces_dir: str, authenticate, timeout_s: float = 30.0) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/traces/query", openapi_extra=json_body(QueryRequest))
    async def query(request: Request):
        caller = authenticate(request)
        if caller.anonymous:
            raise APIError(401, "querying traces needs a team or admin API key",
                           code="invalid_api_key")
        try:
            req = QueryRequest.model_validate_json(await request.body())
        except ValueError as exc:
            raise APIError(400, f"expected {{\"sql\": \"SELECT ...\"}}: {exc}", param="sql") from None
        try:
            result = await run_in_threadpool(_run, traces_dir, None if caller.admin else caller.team,
                                             req, timeout_s)
        except QueryRefused as exc:
            raise APIError(400, f"query refused: {exc}", param="sql") from None
        except duckdb.InterruptException:
            raise APIError(408, f"query exceeded {timeout_s:.0f} s", param="sql") from None
        except duckdb.Error as exc:
            raise APIError(400, f"query failed: {exc}", param="sql") from None
        return Response(json.dumps(result, default=str), media_type="application/json")

    return api
