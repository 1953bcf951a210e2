"""The trace browser's wider views: checkpoint lineage and rewards, usage and cost per day, and
a SQL console over the same team-scoped views as ``POST /v1/traces/query``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from serve.admission import micro_usd
from serve.ui.charts import bars, steps
from serve.ui.web import Web, web_of
from traces.guard import QueryRefused

DOWNLOAD_MAX_ROWS = 1_000_000


router = APIRouter(include_in_schema=False)


@router.get("/ui/checkpoints")
async def checkpoints(request: Request, web: Web = Depends(web_of)):
    session = web.session(request)
    stats = await web.read(session, "by_checkpoint")
    registered = _registry(web.config.checkpoints_file)
    if not session.caller.admin:
        registered = _for_team(registered, set(stats), session.caller.team)
    versions = {"base": _unregistered("base", "base", None), **registered}
    for v in stats:  # served under a version the registry does not know (another home, deleted)
        versions.setdefault(v, _unregistered(v, "?", "base"))
    lineage = [{**versions[v], "depth": depth, "served": stats.get(v) or {}} for v, depth in _tree(versions)]
    by_turn = sorted((c for c in versions.values() if c.get("turn") is not None), key=lambda c: c["turn"])
    return web.page(
        "checkpoints.html",
        session,
        lineage=lineage,
        reward_chart=bars([(c["version"], c["served"].get("mean_reward")) for c in lineage]),
        turn_chart=bars([(f"turn {c['turn']}", (stats.get(c["version"]) or {}).get("mean_reward")) for c in by_turn]),
    )


@router.get("/ui/usage")
async def usage(request: Request, web: Web = Depends(web_of)):
    session = web.session(request)
    rows = await web.read(session, "usage")
    for r in rows:  # priced as the ledger prices a request (whole micro-dollars)
        r["cost_usd"] = (
            micro_usd(r["input_tokens"], r["output_tokens"], web.config.prices.get(r["model"]), r["cached_input_tokens"]) / 1e6
        )
    tokens: dict[str, float] = {}
    cost: dict[str, float] = {}
    for r in rows:
        day = str(r["day"])
        tokens[day] = tokens.get(day, 0) + r["input_tokens"] + r["output_tokens"]
        cost[day] = cost.get(day, 0.0) + r["cost_usd"]
    # dedicated deployments are billed by replica time, not tokens: their own table
    dedicated = request.app.state.parts.deployments.visible(session.caller)
    return web.page(
        "usage.html",
        session,
        rows=rows,
        tokens_chart=bars(list(tokens.items())),
        cost_chart=bars(list(cost.items())),
        dedicated=dedicated,
        replica_charts={d.id: steps(d.replica_history, time.time(), d.replicas.max or d.replicas.desired) for d in dedicated},
    )


@router.get("/ui/sql")
async def sql_form(request: Request, web: Web = Depends(web_of)):
    session = web.session(request)
    return web.page(
        "sql.html",
        session,
        sql="SELECT * FROM traces ORDER BY time_received DESC LIMIT 20",
        result=None,
        error=None,
        truncated=False,
    )


@router.post("/ui/sql")
async def sql_run(request: Request, web: Web = Depends(web_of)):
    session = web.session(request)
    form = await web.form(request, session)
    if form is None:
        return web.expired(session)
    sql = str(form.get("sql", "")).strip()
    try:
        columns, rows, truncated = await web.read(session, "console", sql, web.config.ui.sql_max_rows)
    except (QueryRefused, duckdb.Error) as exc:
        return web.page("sql.html", session, 400, sql=sql, result=None, error=_reason(exc), truncated=False)
    return web.page("sql.html", session, sql=sql, result={"columns": columns, "rows": rows}, error=None, truncated=truncated)


@router.get("/ui/sql/download")
async def sql_download(request: Request, sql: str = "", format: str = "csv", web: Web = Depends(web_of)):
    session = web.session(request)
    if format not in ("csv", "parquet"):
        return web.page("error.html", session, 400, title="Bad request", message="format is csv or parquet")
    try:
        data = await web.read(session, "download", sql, format, DOWNLOAD_MAX_ROWS)
    except (QueryRefused, duckdb.Error) as exc:
        return web.page("sql.html", session, 400, sql=sql, result=None, error=_reason(exc), truncated=False)
    return Response(
        data,
        media_type="text/csv" if format == "csv" else "application/vnd.apache.parquet",
        headers={"Content-Disposition": f'attachment; filename="traces-query.{format}"'},
    )


def _registry(path: str | None) -> dict[str, dict]:
    """The checkpoint registry's entries (``feedback.registry`` writes this file; the gateway
    only reads it)."""
    if not path or not Path(path).is_file():
        return {}
    return json.loads(Path(path).read_text()).get("checkpoints", {})


def _for_team(registered: dict[str, dict], served: set[str], team: str) -> dict[str, dict]:
    """What a team sees of the registry: the checkpoints that served its traces and their
    ancestors; what one was trained on (env ids, SQL, paths) only if the team's traces trained it."""
    keep: set[str] = set()
    for version in served:
        while version in registered and version not in keep:
            keep.add(version)
            version = registered[version].get("parent")
    return {
        v: c if c.get("team") == team else {**c, "dataset": None, "env": None, "path": "", "metrics": {}, "canary": None}
        for v, c in registered.items()
        if v in keep
    }


def _unregistered(version: str, kind: str, parent: str | None) -> dict:
    return {
        "version": version,
        "kind": kind,
        "parent": parent,
        "dataset": None,
        "turn": None,
        "env": None,
        "created": "",
        "path": "",
        "canary": None,
    }


def _tree(versions: dict[str, dict]) -> list[tuple[str, int]]:
    """Versions in lineage order (each after its parent) with their depth below base."""
    children: dict[str | None, list[str]] = {}
    for v, c in versions.items():
        if v != "base":
            parent = c.get("parent") if c.get("parent") in versions else "base"
            children.setdefault(parent, []).append(v)
    out, stack = [], [("base", 0)]
    while stack:
        v, depth = stack.pop()
        out.append((v, depth))
        kids = sorted(children.get(v, []), key=lambda k: (versions[k].get("created") or "", k))
        stack.extend((k, depth + 1) for k in reversed(kids))
    return out


def _reason(exc: Exception) -> str:
    return f"query refused: {exc}" if isinstance(exc, QueryRefused) else f"query failed: {exc}"
