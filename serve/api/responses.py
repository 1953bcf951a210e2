"""OpenAI's Responses API: ``POST /v1/responses``, ``GET /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items`` and ``DELETE /v1/responses/{id}``.

A request is translated (``serve/translate/responses.py``, back: ``responses_answer.py``) to the chat request the gateway
forwards, through ``serve.api.completions.forward_chat``: admission, budgets, the tool-call
grammar, capture and outcomes are chat's. A conversation keeps one session (``X-Session-ID``,
else ``prompt_cache_key``, else its first response's trace id), so its turns stay on one
deployment's cache; ``previous_response_id`` is read back from the trace store
(``serve/conversations.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from serve.api.completions import answered, forward_chat, parsed_request
from serve.auth import Caller, authenticate_headers, require_scope
from serve.conversations import Turn
from serve.forward import Stream
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from serve.translate.chat import translated
from serve.translate.responses import ResponsesRequest, chat_body
from serve.translate.responses_answer import (
    ResponsesStream,
    conversation_items,
    output_items,
    response,
    response_id as public_id,
    response_object,
)
from traces.ids import new_trace_id

router = APIRouter()


def _caller(headers: Mapping[str, str], gw: GatewayParts) -> Caller:
    caller = authenticate_headers(headers, gw.config, gw.keys)
    require_scope(caller, "inference")  # a response is an inference key's, as is its conversation
    return caller


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest))
async def create_response(request: Request, gw: GatewayParts = Depends(parts)):
    return answered(*await create(gw, dict(request.headers.items()), await request.body()))


async def create(gw: GatewayParts, headers: dict[str, str], raw: bytes) -> tuple[dict | Stream, dict[str, str]]:
    """``POST /v1/responses``, from its raw body to the client's answer (the hot path's entry;
    ``headers`` with lower-case names)."""
    caller = _caller(headers, gw)
    req = await parsed_request(gw, caller, ResponsesRequest, raw)
    earlier, session, parent = [], req.prompt_cache_key, None
    if req.previous_response_id:
        turn = await gw.conversations.get(caller, req.previous_response_id, param="previous_response_id")
        earlier, session, parent = turn.conversation(), session or turn.session, turn.trace_id
    body, trace_id = chat_body(req, earlier), new_trace_id()
    client_request = req.model_dump(exclude_unset=True)
    result, answer_headers = await forward_chat(
        gw,
        caller,
        headers,
        body,
        trace_id=trace_id,
        api="responses",
        api_request=raw.decode(),
        session_id=session or trace_id,
        parent_trace_id=parent,
    )

    def turn(content: str | None, tool_calls: list[dict], finish: str | None, usage: dict, created_at: float) -> Turn:
        return Turn(
            trace_id, caller.team, headers.get("x-session-id") or session or trace_id, req.model, client_request,
            body["messages"], content, tool_calls, finish, usage, created_at,
        )  # fmt: skip

    if isinstance(result, Stream):
        stream = ResponsesStream(trace_id, req.model, client_request)

        def finished(s: ResponsesStream) -> None:
            content = "".join(p["text"] for item in s.output if item["type"] == "message" for p in item["content"])
            calls = [
                {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                for i in s.output
                if i["type"] == "function_call"
            ]
            gw.conversations.remember(turn(content or None, calls, s.finish, s.usage or {}, s.created_at))

        stream.finished = finished
        return Stream(result.headers, translated(result.body, stream)), answer_headers
    created_at = time.time()
    msg = (result.get("choices") or [{}])[0].get("message") or {}
    finish = (result.get("choices") or [{}])[0].get("finish_reason")
    gw.conversations.remember(
        turn(msg.get("content"), msg.get("tool_calls") or [], finish, result.get("usage") or {}, created_at)
    )
    return response(result, trace_id, req.model, client_request, created_at), answer_headers


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request, gw: GatewayParts = Depends(parts)):
    turn = await gw.conversations.get(_caller(request.headers, gw), response_id)
    rid = public_id(turn.trace_id)
    items = output_items(rid, turn.content, turn.tool_calls)
    return response_object(rid, turn.request, turn.alias, turn.created_at, items, turn.usage, turn.finish)


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    request: Request,
    gw: GatewayParts = Depends(parts),
    order: Literal["asc", "desc"] = "desc",
    limit: int = Query(20, ge=1, le=100),
    after: str | None = None,
):
    """The conversation's items up to this response (earlier turns included), newest first
    unless ``order=asc``, as OpenAI lists them."""
    turn = await gw.conversations.get(_caller(request.headers, gw), response_id)
    messages = turn.messages[1:] if turn.request.get("instructions") else turn.messages
    items = conversation_items(messages)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, gw: GatewayParts = Depends(parts)):
    await gw.conversations.delete(_caller(request.headers, gw), response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
