"""The trace browser's login and trace pages: the list with filters, one trace, one session,
and feedback posted from a trace (through the same code as ``POST /v1/feedback``)."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

from serve.auth import caller_for_key
from serve.errors import APIError
from serve.feedback_api import FeedbackItem, save_feedback
from serve.ui.queries import BadFilter, TraceFilters
from serve.ui.session import COOKIE
from serve.ui.tokens import pieces, tokenizer_for
from serve.ui.web import Web, web_of


router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def home():
    return RedirectResponse("/ui/traces", status_code=303)


@router.get("/ui/login")
async def login_form(next: str = "/ui/traces", web: Web = Depends(web_of)):
    return web.page("login.html", None, next=_safe_next(next), error=None)


@router.post("/ui/login")
async def login(request: Request, web: Web = Depends(web_of)):
    form = await request.form()
    key, next_url = str(form.get("key", "")).strip(), _safe_next(str(form.get("next", "")))
    try:
        caller = caller_for_key(key, web.config, web.sessions.keys)
    except APIError as exc:  # a revoked key
        caller, error = None, exc.message
    else:
        error = "That is not a valid team or admin key."
    if caller is None:
        return web.page("login.html", None, 401, next=next_url, error=error)
    response = RedirectResponse(next_url, status_code=303)
    response.set_cookie(
        COOKIE,
        web.sessions.issue(caller),
        max_age=int(web.config.ui.session_ttl_s),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/ui/logout")
async def logout(request: Request, web: Web = Depends(web_of)):
    session = web.session(request)
    form = await web.form(request, session)
    if form is None:
        return web.expired(session)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


@router.get("/ui/traces")
async def traces(request: Request, page: int = 0, web: Web = Depends(web_of)):
    session = web.session(request)
    filters = TraceFilters.from_query(request.query_params)
    page = max(page, 0)
    try:
        rows, more = await web.read(session, "traces", filters, page, web.config.ui.page_size)
    except BadFilter as exc:
        return web.page(
            "traces.html", session, 400, rows=[], filters=filters, error=str(exc), page=page, prev_url=None, next_url=None
        )
    query = filters.active()
    return web.page(
        "traces.html",
        session,
        rows=rows,
        filters=filters,
        error=None,
        page=page,
        prev_url=f"/ui/traces?{urlencode({**query, 'page': page - 1})}" if page else None,
        next_url=f"/ui/traces?{urlencode({**query, 'page': page + 1})}" if more else None,
    )


@router.get("/ui/traces/{trace_id}")
async def trace(request: Request, trace_id: str, web: Web = Depends(web_of)):
    session = web.session(request)
    return await _trace_page(web, session, trace_id)


async def _trace_page(web: Web, session, trace_id: str, status: int = 200, error: str | None = None):
    record = await web.read(session, "trace", trace_id)
    if record is None:
        return web.not_found(session, f"Trace {trace_id}")
    feedback = await web.read(session, "feedback", trace_id)
    tokenizer = await run_in_threadpool(tokenizer_for, web.config, record["deployment"])
    return web.page(
        "trace.html",
        session,
        status,
        t=record,
        feedback=feedback,
        error=error,
        messages=_messages(record["gen_ai_input_messages"]),
        tool_calls=_tool_calls(record["response_tool_calls"]),
        tokens=pieces(record["completion_token_ids"], record["completion_logprobs"], tokenizer),
        timing=_timing(record),
    )


@router.post("/ui/traces/{trace_id}/feedback")
async def feedback(request: Request, trace_id: str, web: Web = Depends(web_of)):
    session = web.session(request)
    form = await web.form(request, session)
    if form is None:
        return web.expired(session)
    if await web.read(session, "trace", trace_id) is None:
        return web.not_found(session, f"Trace {trace_id}")
    fields = {
        k: str(form.get(k)).strip() for k in ("name", "reward", "score", "label", "comment") if str(form.get(k) or "").strip()
    }
    try:
        item = FeedbackItem.model_validate({"trace_id": trace_id, "source": "ui", **fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return await _trace_page(web, session, trace_id, 400, f"{where}: {first['msg']}" if where else first["msg"])
    await run_in_threadpool(save_feedback, web.config.traces_dir, session.caller, [item])
    return RedirectResponse(f"/ui/traces/{trace_id}#feedback", status_code=303)


@router.get("/ui/sessions/{session_id}")
async def session_page(request: Request, session_id: str, web: Web = Depends(web_of)):
    session = web.session(request)
    turns = await web.read(session, "session", session_id)
    if not turns:
        return web.not_found(session, f"Session {session_id}")
    widest = max((t["reused_tokens"] or 0) + (t["new_tokens"] or 0) for t in turns) or 1
    return web.page("session.html", session, session_id=session_id, turns=turns, widest=widest)


def _safe_next(url: str) -> str:
    """Only a page of ours: a login form must not become a redirect to anywhere."""
    return url if url.startswith("/ui/") and not url.startswith("//") and "\\" not in url else "/ui/traces"


def _messages(text: str | None) -> list[dict]:
    """Chat messages as role + text parts; a completion prompt as one 'prompt' message."""
    try:
        value = json.loads(text) if text else []
    except ValueError:
        value = text
    if isinstance(value, str):
        return [{"role": "prompt", "content": value, "extra": None}]
    if not isinstance(value, list):
        return [{"role": "prompt", "content": json.dumps(value, ensure_ascii=False), "extra": None}]
    out = []
    for m in value:
        if not isinstance(m, dict):
            out.append({"role": "?", "content": json.dumps(m, ensure_ascii=False), "extra": None})
            continue
        content = m.get("content")
        if isinstance(content, list):  # content parts: their text, in order
            content = "\n".join(p.get("text", json.dumps(p)) if isinstance(p, dict) else str(p) for p in content)
        extra = {k: v for k, v in m.items() if k not in ("role", "content")}
        out.append(
            {
                "role": str(m.get("role", "?")),
                "content": content or "",
                "extra": json.dumps(extra, indent=2, ensure_ascii=False) if extra else None,
            }
        )
    return out


def _tool_calls(text: str | None) -> list[dict]:
    try:
        calls = json.loads(text) if text else []
    except ValueError:
        return [{"name": "?", "arguments": text}]
    out = []
    for c in calls if isinstance(calls, list) else []:
        fn = c.get("function", {}) if isinstance(c, dict) else {}
        args = fn.get("arguments", "")
        try:
            args = json.dumps(json.loads(args), indent=2, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
        out.append({"name": fn.get("name", "?"), "id": c.get("id") if isinstance(c, dict) else None, "arguments": args})
    return out


def _timing(t: dict) -> list[dict]:
    """Queue wait, prefill (to the first token) and decode, as shares of the whole request."""
    queue = t["queue_wait_ms"] or 0.0
    ttft = t["ttft_ms"]
    decode = None
    if t["time_done"] and t["time_first_token"]:
        decode = (t["time_done"] - t["time_first_token"]).total_seconds() * 1000
    parts = [("queue wait", queue), ("prefill", max((ttft or 0.0) - queue, 0.0)), ("decode", decode or 0.0)]
    total = sum(v for _, v in parts) or 1.0
    return [{"name": n, "ms": v, "pct": round(100 * v / total, 2)} for n, v in parts]
