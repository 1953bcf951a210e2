"""The trace browser at ``/ui``: server-rendered pages over the trace store, for data teams and
researchers, scoped to the logged-in team exactly like ``POST /v1/traces/query``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles

from serve.config import GatewayConfig
from serve.keys import KeyStore
from serve.query_pool import QueryPool
from serve.ui import console, pages
from serve.ui.session import Sessions, load_secret
from serve.ui.web import HERE, LoginNeeded, QueryFailed, Web, login_redirect


def install(app: FastAPI, config: GatewayConfig, keys: KeyStore | None, queries: QueryPool) -> None:
    web = Web(config, Sessions(load_secret(config.ui.secret_file), config.ui.session_ttl_s, keys, config.admin_key), queries)
    app.state.web = web
    app.include_router(pages.router)
    app.include_router(console.router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    @app.exception_handler(LoginNeeded)
    async def _login(request: Request, exc: LoginNeeded):
        return login_redirect(exc)

    @app.exception_handler(QueryFailed)
    async def _query_failed(request: Request, exc: QueryFailed):
        return web.page("error.html", exc.session, exc.status, title="Query failed", message=exc.message)
