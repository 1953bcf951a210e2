"""The completion routes: ``/v1/chat/completions``, ``/v1/completions`` and prime-rl's
``/inference/v1/generate``.

``complete`` is the one entry for the first two: ``serve.hot_path`` calls it ahead of FastAPI for
the gateway's traffic, and the FastAPI routes below (what ``/openapi.json`` documents, and what an
ASGI caller that reaches FastAPI itself gets) call the same function.
"""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.datastructures import Headers

from serve import json_codec
from serve.auth import Caller, authenticate_headers, require_scope
from serve.capture import RequestContext
from serve.errors import invalid_request
from serve.forward import Stream
from serve.gateway_parts import GatewayParts, parts
from serve.openapi import json_body
from serve.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest, Message, generate_response
from serve.routes import RouteTable
from serve.upstream import PROMPT_KEYS
from traces.ids import new_trace_id

# path -> (operation, request model, route name): the hot path answers these paths; the routes
# declared from the same table document them
COMPLETIONS = {
    "/v1/chat/completions": ("chat", ChatCompletionRequest, "chat_completions"),
    "/v1/completions": ("text_completion", CompletionRequest, "completions"),
}
REQUEST_MODELS = {operation: model for operation, model, _ in COMPLETIONS.values()}
# Reading and validating a body costs ~35 ms per MB here (msgspec, then pydantic): a larger one is
# read in a thread, so one client's 32 MB body cannot hold every other stream's tokens back.
OFF_LOOP_BYTES = 256 << 10
MESSAGES_PER_SLICE = 256
MESSAGE_LIST = TypeAdapter(list[Message])

router = APIRouter()
M = TypeVar("M", bound=BaseModel)


async def complete(gw: GatewayParts, operation: str, headers: dict[str, str], raw: bytes):
    """A completion request, from its raw body to the client's answer (the hot path)."""
    caller = authenticate_headers(headers, gw.config, gw.keys)
    require_scope(caller, "inference")
    if len(raw) > OFF_LOOP_BYTES:
        body, prompt_json = await gw.forwarder.turns.run(caller.team, _validated, raw, operation, True)
    else:
        body, prompt_json = _validated(raw, operation)
    ctx = _context(gw.routes, headers, operation, body, caller)
    ctx.prompt_json = prompt_json
    return await gw.forwarder.forward(operation, body, ctx)


def answered(result: dict | Stream, headers: dict[str, str]):
    """A hot-path answer as FastAPI's response, for the routes as FastAPI declares them."""
    if isinstance(result, Stream):
        return StreamingResponse(result.body, media_type="text/event-stream", headers={**headers, **result.headers})
    return JSONResponse(result, headers=headers)


def _declare(path: str, operation: str, model, name: str) -> None:
    async def route(request: Request, gw: GatewayParts = Depends(parts)):
        return answered(*await complete(gw, operation, dict(request.headers.items()), await request.body()))

    router.add_api_route(path, route, methods=["POST"], name=name, openapi_extra=json_body(model))


for _path, _entry in COMPLETIONS.items():
    _declare(_path, *_entry)


@router.post("/inference/v1/generate", openapi_extra=json_body(GenerateRequest))
async def generate(request: Request, gw: GatewayParts = Depends(parts)):
    """Token-in/token-out, as prime-rl and verifiers' training client call it."""
    caller = gw.caller(request)
    require_scope(caller, "inference")
    try:
        req = GenerateRequest.model_validate(json_codec.request_object(await request.body())[0])
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None
    body = req.completion_body()
    data, headers = await gw.forwarder.forward("generate", body, _context(gw.routes, request.headers, "generate", body, caller))
    return JSONResponse(generate_response(data), headers=headers)


def parsed(model: type[M], raw: bytes) -> M:
    """A translated API's raw body as its request model (400s naming what is wrong)."""
    body, _ = json_codec.request_object(raw)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None


async def parsed_request(gw: GatewayParts, caller: Caller, model: type[M], raw: bytes) -> M:
    """:func:`parsed`, in a thread (the team's turn) for a body past ``OFF_LOOP_BYTES``."""
    if len(raw) > OFF_LOOP_BYTES:
        return await gw.forwarder.turns.run(caller.team, parsed, model, raw)
    return parsed(model, raw)


async def forward_chat(
    gw: GatewayParts,
    caller: Caller,
    headers: Headers,
    body: dict,
    *,
    trace_id: str,
    api: str,
    api_request: str,
    session_id: str | None,
    parent_trace_id: str | None = None,
):
    """A chat request translated from another API (serve/translate/), on the same way as a
    client's own: the answer is chat's, for the caller to translate back."""
    try:
        ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None
    ctx = _context(gw.routes, headers, "chat", body, caller, trace_id)
    ctx.api, ctx.api_request = api, api_request
    ctx.session_id = ctx.session_id or session_id
    ctx.parent_trace_id = ctx.parent_trace_id or parent_trace_id
    return await gw.forwarder.forward("chat", body, ctx)


def _validated(raw: bytes, operation: str, in_slices: bool = False) -> tuple[dict, bytes | None]:
    """A completion request's body, checked against its model (400s), and its prompt's JSON.
    ``in_slices`` (a large body, in a thread): decoded and checked a slice of messages at a time,
    so that no single call holds the GIL for long (pydantic held it 130 ms for 20,000 messages)."""
    key = PROMPT_KEYS[operation]
    body, prompt_json = (
        json_codec.request_object(raw, key, json_codec.decode_request_in_slices)
        if in_slices
        else json_codec.request_object(raw, key)
    )
    messages = body.get("messages") if operation == "chat" else None
    try:
        if not in_slices or not isinstance(messages, list) or len(messages) <= MESSAGES_PER_SLICE:
            REQUEST_MODELS[operation].model_validate(body)
            return body, prompt_json
        REQUEST_MODELS[operation].model_validate({**body, "messages": messages[:1]})
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None
    for start in range(1, len(messages), MESSAGES_PER_SLICE):
        try:
            MESSAGE_LIST.validate_python(messages[start : start + MESSAGES_PER_SLICE])
        except ValidationError as exc:  # where the problem is in the whole list
            raise invalid_request(
                [{**e, "loc": ("messages", start + e["loc"][0], *e["loc"][1:])} for e in exc.errors()]
            ) from None
    return body, prompt_json


def _context(
    routes: RouteTable, h: Headers | dict[str, str], operation: str, body: dict, caller: Caller, trace_id: str | None = None
) -> RequestContext:
    return RequestContext.for_route(
        routes.get(body["model"]),
        trace_id or new_trace_id(),
        operation,
        body,
        team=caller.team,
        api_key_id=caller.key_id,
        admin=caller.admin,
        session_id=h.get("x-session-id"),
        parent_trace_id=h.get("x-parent-trace-id"),
        env_id=h.get("x-env-id"),
        example_id=h.get("x-example-id"),
        # an environment's session is its rollout (verifiers sends one X-Session-ID per rollout)
        rollout_id=h.get("x-rollout-id") or (h.get("x-session-id") if h.get("x-env-id") else None),
    )
