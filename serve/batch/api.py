"""OpenAI's Files and Batches routes, served by the gateway (the ``openai`` SDK works unchanged).

Files and batches belong to the caller's team: another team's ids answer 404, lists show only
the team's own (the admin key sees every team's). A batch is validated line by line when it is
created (:mod:`serve.batch.lines`); its lines then run in the background on every replica
(:mod:`serve.batch.runner`).
"""

from __future__ import annotations

import asyncio
import re
import time

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field, ValidationError

from serve.auth import Caller
from serve.batch.finish import public
from serve.batch.lines import ENDPOINTS, check_lines
from serve.errors import APIError, invalid_request
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from traces.batch_store import new_id

WINDOW = re.compile(r"^([1-9]\d*)h$")


class BatchCreate(BaseModel):
    input_file_id: str
    endpoint: str = Field(description="/v1/chat/completions or /v1/completions")
    completion_window: str = Field("24h", description="hours, as '24h'")
    metadata: dict[str, str] | None = None


def _not_found(kind: str, ident: str, param: str) -> APIError:
    return APIError(404, f"No such {kind}: '{ident}'", param=param, code="not_found")


def _listing(items: list[dict], limit: int, after: str | None) -> dict:
    ids = [i["id"] for i in items]
    start = ids.index(after) + 1 if after in ids else 0
    page = items[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(items),
    }


def _mine(caller: Caller, obj: dict | None) -> bool:
    return obj is not None and (caller.admin or obj["team"] == caller.team)


def own_file(file_id: str, request: Request, gw: GatewayParts = Depends(parts)) -> dict:
    """The dependency of a file's routes: the caller's team's file, else 404 (as for no file)."""
    meta = gw.files.get(file_id)
    if not _mine(gw.caller(request), meta):
        raise _not_found("file", file_id, "file_id")
    return meta


def own_batch(batch_id: str, request: Request, gw: GatewayParts = Depends(parts)) -> dict:
    batch = gw.batches.get(batch_id)
    if not _mine(gw.caller(request), batch):
        raise _not_found("batch", batch_id, "batch_id")
    return batch


def _callable_models(gw: GatewayParts, caller: Caller) -> set[str]:
    """The aliases the caller's team may call: another team's private alias is, to a batch line
    as to a chat request, a model that does not exist (a line accepted for it would say it does)."""
    return {alias for alias, route in gw.routes.items() if route.serves(caller.team, caller.admin)}


def file_view(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k != "team"}


router = APIRouter()


@router.post("/v1/files")
async def upload(request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    try:
        form = await request.form(max_part_size=gw.config.batch.max_file_bytes)
    except Exception as exc:  # starlette's own multipart errors
        raise APIError(400, f"expected a multipart form with 'file' and 'purpose': {exc}") from None
    upload, purpose = form.get("file"), form.get("purpose")
    if purpose != "batch":
        raise APIError(400, f"purpose must be 'batch', not {purpose!r}", param="purpose")
    if upload is None or isinstance(upload, str):
        raise APIError(400, "Missing required parameter: 'file'.", param="file")
    data = await upload.read()
    if len(data) > gw.config.batch.max_file_bytes:
        raise APIError(
            413, f"the file is larger than {gw.config.batch.max_file_bytes} bytes (gateway.batch.max_file_bytes)", param="file"
        )
    held = sum(m["bytes"] for m in await asyncio.to_thread(gw.files.list) if m["team"] == caller.team)
    if held + len(data) > gw.config.batch.max_team_bytes:
        raise APIError(
            413,
            f"your team's files hold {held:,} bytes; this one would pass the "
            f"{gw.config.batch.max_team_bytes:,} a team may keep (delete some: DELETE /v1/files/ID)",
            param="file",
            code="quota_exceeded",
        )
    meta = await asyncio.to_thread(gw.files.put, caller.team, upload.filename or "upload.jsonl", purpose, data)
    return file_view(meta)


@router.get("/v1/files")
async def list_files(
    request: Request, limit: int = 10_000, after: str | None = None, purpose: str | None = None, gw: GatewayParts = Depends(parts)
):
    caller = gw.caller(request)
    metas = [
        file_view(m)
        for m in await asyncio.to_thread(gw.files.list)
        if _mine(caller, m) and (purpose is None or m["purpose"] == purpose)
    ]
    return _listing(metas, limit, after)


@router.get("/v1/files/{file_id}")
async def get_file(meta: dict = Depends(own_file)):
    return file_view(meta)


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, meta: dict = Depends(own_file), gw: GatewayParts = Depends(parts)):
    return Response(await asyncio.to_thread(gw.files.content, file_id), media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, meta: dict = Depends(own_file), gw: GatewayParts = Depends(parts)):
    await asyncio.to_thread(gw.files.delete, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/v1/batches", openapi_extra=json_body(BatchCreate))
async def create_batch(request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    try:
        req = BatchCreate.model_validate_json(await request.body())
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None
    if req.endpoint not in ENDPOINTS:
        raise APIError(400, f"endpoint must be one of {sorted(ENDPOINTS)}, not {req.endpoint!r}", param="endpoint")
    window = WINDOW.match(req.completion_window)
    if not window:
        raise APIError(
            400, f"completion_window must be hours such as '24h', not {req.completion_window!r}", param="completion_window"
        )
    meta = gw.files.get(req.input_file_id)
    if not _mine(caller, meta):
        raise _not_found("file", req.input_file_id, "input_file_id")
    if meta["purpose"] != "batch":
        raise APIError(400, f"file {req.input_file_id} has purpose {meta['purpose']!r}, not 'batch'", param="input_file_id")
    data = await asyncio.to_thread(gw.files.content, req.input_file_id)
    try:
        good, refused = await asyncio.to_thread(
            check_lines, data, req.endpoint, _callable_models(gw, caller), gw.config.batch.max_lines
        )
    except ValueError as exc:
        raise APIError(400, str(exc), param="input_file_id") from None
    now = int(time.time())
    batch = {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": req.endpoint,
        "errors": None,
        "input_file_id": req.input_file_id,
        "completion_window": req.completion_window,
        "status": "in_progress",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": now,
        "expires_at": now + 3600 * int(window.group(1)),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "metadata": req.metadata,
        "request_counts": {"total": len(good) + len(refused), "completed": 0, "failed": 0},
        "team": caller.team,
        "_api_key_id": caller.key_id,
        "_total": len(good) + len(refused),
        "_chunks": -(-len(good) // gw.config.batch.chunk_lines),
    }
    if not good:  # nothing to run: the batch fails, as OpenAI's does on an invalid file
        batch.update(
            status="failed",
            failed_at=now,
            in_progress_at=None,
            errors={
                "object": "list",
                "data": [
                    {
                        "code": r["line"]["error"]["code"],
                        "message": r["line"]["error"]["message"],
                        "param": None,
                        "line": r["n"] + 1,
                    }
                    for r in refused[:100]
                ],
            },
        )
        batch["request_counts"]["failed"] = len(refused)
    await asyncio.to_thread(gw.batches.create, batch, good, refused)
    return public(gw.batches, batch)


@router.get("/v1/batches")
async def list_batches(request: Request, limit: int = 20, after: str | None = None, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    batches = [b for b in await asyncio.to_thread(gw.batches.list) if _mine(caller, b)]
    page = _listing(batches, limit, after)
    page["data"] = [await asyncio.to_thread(public, gw.batches, b) for b in page["data"]]
    return page


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch: dict = Depends(own_batch), gw: GatewayParts = Depends(parts)):
    return await asyncio.to_thread(public, gw.batches, batch)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, batch: dict = Depends(own_batch), gw: GatewayParts = Depends(parts)):
    gw.batch_runner.cancel(batch_id)

    def change(b: dict) -> bool:
        if b["status"] != "in_progress":  # finalizing: every line is answered already
            return False
        b.update(status="cancelling", cancelling_at=int(time.time()))
        return True

    batch = await asyncio.to_thread(gw.batches.update, batch_id, change)
    if batch["status"] in ("completed", "failed", "expired"):
        raise APIError(
            409,
            f"batch {batch_id} is already {batch['status']}; it cannot be cancelled",
            param="batch_id",
            code="batch_not_cancellable",
        )
    return await asyncio.to_thread(public, gw.batches, batch)
