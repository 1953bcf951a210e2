"""What every trace-browser page shares: templates (autoescaped: all trace content is untrusted
model or user text), the logged-in session, the caller's reader, and HTML error pages."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import duckdb
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from serve.config import GatewayConfig
from serve.query_pool import QueryDeadline, QueryPool, QueryTooLarge, QueryWorkerLost
from serve.trace_query import QueryLimits, query_failure
from serve.ui.queries import read
from serve.ui.session import COOKIE, Sessions, UISession

HERE = Path(__file__).parent


class QueryFailed(Exception):
    """A page's query ran out of time or memory: the page says so, with its status."""

    def __init__(self, session: UISession, status: int, message: str):
        self.session, self.status, self.message = session, status, message


class LoginNeeded(Exception):
    def __init__(self, next_url: str):
        self.next_url = next_url


def web_of(request: Request) -> Web:
    """The FastAPI dependency of the browser's routes: the app's one ``Web``."""
    return request.app.state.web


class Web:
    def __init__(self, config: GatewayConfig, sessions: Sessions, queries: QueryPool):
        self.config, self.sessions, self.queries = config, sessions, queries
        self.limits = QueryLimits.of(config)
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["pretty"] = pretty_json
        self.env.filters["ms"] = lambda v: "–" if v is None else f"{v:,.1f} ms"
        self.env.filters["num"] = lambda v: "–" if v is None else f"{v:,}"

    def session(self, request: Request) -> UISession:
        """The logged-in session, or a redirect to the login form that comes back here."""
        session = self.sessions.read(request.cookies.get(COOKIE))
        if session is None:
            raise LoginNeeded(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return session

    async def read(self, session: UISession, method: str, *args):
        """``Reader.method(*args)`` for the caller's team, in a query worker (``serve.query_pool``):
        a page's SQL can neither block the event loop nor take the gateway's memory. A query
        that ran out of time or memory is :class:`QueryFailed`."""
        team = None if session.caller.admin else session.caller.team
        try:
            return await self.queries.run(read, self.config.traces_dir, team, self.limits, method, args)
        except (QueryDeadline, QueryTooLarge, QueryWorkerLost, duckdb.InterruptException, duckdb.OutOfMemoryException) as exc:
            failure = query_failure(exc, self.config.query_timeout_s)
            raise QueryFailed(session, failure.status, failure.message) from None

    def page(self, template: str, session: UISession | None, status: int = 200, **values) -> HTMLResponse:
        html = self.env.get_template(template).render(
            session=session, csrf=self.sessions.csrf(session) if session else "", **values
        )
        return HTMLResponse(
            html,
            status_code=status,
            headers={
                # nothing on these pages comes from elsewhere; inline scripts are refused outright
                "Content-Security-Policy": "default-src 'self'; script-src 'none'; style-src 'self'; "
                "style-src-attr 'unsafe-inline'; "
                "img-src 'self' data:; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "same-origin",
            },
        )

    async def form(self, request: Request, session: UISession):
        """The posted form, or None when it lacks this session's CSRF token."""
        form = await request.form()
        return form if self.sessions.csrf_ok(session, form.get("csrf")) else None

    def expired(self, session: UISession) -> HTMLResponse:
        return self.page("error.html", session, 403, title="Forbidden", message="The form has expired; reload the page.")

    def not_found(self, session: UISession, what: str) -> HTMLResponse:
        return self.page(
            "error.html", session, 404, title="Not found", message=f"{what} does not exist, or it is not your team's."
        )


def login_redirect(exc: LoginNeeded) -> RedirectResponse:
    return RedirectResponse(f"/ui/login?next={quote(exc.next_url)}", status_code=303)


def pretty_json(text: str | None) -> str:
    if not text:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text
