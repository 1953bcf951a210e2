"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A request is translated (``serve/translate/messages.py``, back: ``messages_answer.py``) to the chat request the gateway
forwards, through ``serve.api.completions.forward_chat``: admission, budgets, affinity (by
``X-Session-ID``, else ``metadata.user_id``), the tool-call grammar, capture and outcomes are
chat's. Every error on these routes is in Anthropic's shape (``serve.errors.in_route_shape``); the
key may come as ``x-api-key``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from serve.api.completions import answered, forward_chat, parsed, parsed_request
from serve.auth import authenticate_headers, require_scope
from serve.context_limit import count_prompt_tokens
from serve.errors import model_not_found
from serve.forward import Stream
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from serve.translate.chat import translated
from serve.translate.messages import CountTokensRequest, MessagesRequest, chat_body, chat_messages, chat_tools
from serve.translate.messages_answer import MessagesStream, message
from traces.ids import new_trace_id

router = APIRouter()


@router.post("/v1/messages", openapi_extra=json_body(MessagesRequest))
async def create_message(request: Request, gw: GatewayParts = Depends(parts)):
    return answered(*await create(gw, dict(request.headers.items()), await request.body()))


async def create(gw: GatewayParts, headers: dict[str, str], raw: bytes) -> tuple[dict | Stream, dict[str, str]]:
    """``POST /v1/messages``, from its raw body to the client's answer (the hot path's entry;
    ``headers`` with lower-case names)."""
    caller = authenticate_headers(headers, gw.config, gw.keys)
    require_scope(caller, "inference")
    req = await parsed_request(gw, caller, MessagesRequest, raw)
    trace_id = new_trace_id()
    result, answer_headers = await forward_chat(
        gw,
        caller,
        headers,
        chat_body(req),
        trace_id=trace_id,
        api="messages",
        api_request=raw.decode(),
        session_id=req.metadata.user_id if req.metadata else None,
    )
    if isinstance(result, Stream):
        return Stream(result.headers, translated(result.body, MessagesStream(trace_id, req.model, req))), answer_headers
    return message(result, trace_id, req.model, req), answer_headers


@router.post("/v1/messages/count_tokens", openapi_extra=json_body(CountTokensRequest))
async def count_tokens(request: Request, gw: GatewayParts = Depends(parts)):
    """The prompt's tokens as the model's chat template renders it, tools included."""
    caller = gw.caller(request)
    require_scope(caller, "inference")
    req = parsed(CountTokensRequest, await request.body())
    route = gw.routes.get(req.model)
    if route is None or not route.serves(caller.team, caller.admin):
        raise model_not_found(req.model)
    tools, _, _ = chat_tools(req)
    model_path = gw.config.deployment(route.deployment).model_path
    n = await gw.forwarder.turns.run(caller.team, count_prompt_tokens, chat_messages(req), tools, model_path)
    return {"input_tokens": n}
