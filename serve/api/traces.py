"""``POST /v1/traces/query``: read-only SQL over the trace store (``serve/trace_query.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from serve.errors import APIError
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from serve.trace_query import QueryLimits, QueryRequest, answer, query_failure

router = APIRouter()


@router.post("/v1/traces/query", openapi_extra=json_body(QueryRequest))
async def query(request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    if caller.anonymous:
        raise APIError(401, "querying traces needs a team or admin API key", code="invalid_api_key")
    try:
        req = QueryRequest.model_validate_json(await request.body())
    except ValueError as exc:
        raise APIError(400, f'expected {{"sql": "SELECT ..."}}: {exc}', param="sql") from None
    try:
        config = gw.config
        body = await gw.queries.run(
            answer, config.traces_dir, None if caller.admin else caller.team, req.sql, req.max_rows, QueryLimits.of(config)
        )
    except Exception as exc:
        failure = query_failure(exc, gw.config.query_timeout_s)
        if failure is None:
            raise
        raise failure from None
    return Response(body, media_type="application/json")
