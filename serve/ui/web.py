"""What every trace-browser page shares: templates (autoescaped: all trace content is untrusted
model or user text), the logged-in session, the caller's reader, and HTML error pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, TypeVar
from urllib.parse import quote

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from serve.config import GatewayConfig
from serve.ui.queries import Reader
from serve.ui.session import COOKIE, Sessions, UISession

HERE = Path(__file__).parent
T = TypeVar("T")


class LoginNeeded(Exception):
    def __init__(self, next_url: str):
        self.next_url = next_url


class Web:
    def __init__(self, config: GatewayConfig, sessions: Sessions):
        self.config, self.sessions = config, sessions
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True,
                               undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self.env.filters["pretty"] = pretty_json
        self.env.filters["ms"] = lambda v: "–" if v is None else f"{v:,.1f} ms"
        self.env.filters["num"] = lambda v: "–" if v is None else f"{v:,}"

    def session(self, request: Request) -> UISession:
        """The logged-in session, or a redirect to the login form that comes back here."""
        session = self.sessions.read(request.cookies.get(COOKIE))
        if session is None:
            raise LoginNeeded(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return session

    def reader(self, session: UISession) -> Reader:
        return Reader(self.config.traces_dir, None if session.caller.admin else session.caller.team,
                      self.config.query_timeout_s)

    async def read(self, session: UISession, query: Callable[[Reader], T]) -> T:
        """Run ``query`` on the caller's reader off the event loop (DuckDB blocks)."""
        return await run_in_threadpool(query, self.reader(session))

    def page(self, template: str, session: UISession | None, status: int = 200, **values) -> HTMLResponse:
        html = self.env.get_template(template).render(
            session=session, csrf=self.sessions.csrf(session) if session else "", **values)
        return HTMLResponse(html, status_code=status, headers={
            # nothing on these pages comes from elsewhere; inline scripts are refused outright
            "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                                       "style-src-attr 'unsafe-inline'; "
                                       "img-src 'self' data:; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"})

    async def form(self, request: Request, session: UISession):
        """The posted form, or None when it lacks this session's CSRF token."""
        form = await request.form()
        return form if self.sessions.csrf_ok(session, form.get("csrf")) else None

    def expired(self, session: UISession) -> HTMLResponse:
        return self.page("error.html", session, 403, title="Forbidden", message="The form has expired; reload the page.")

    def not_found(self, session: UISession, what: str) -> HTMLResponse:
        return self.page("error.html", session, 404, title="Not found",
                         message=f"{what} does not exist, or it is not your team's.")


def login_redirect(exc: LoginNeeded) -> RedirectResponse:
    return RedirectResponse(f"/ui/login?next={quote(exc.next_url)}", status_code=303)


def pretty_json(text: str | None) -> str:
    if not text:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text
