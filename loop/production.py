"""Training on production traffic (``flywheel loop --from-traces SQL``): which rows a turn takes.

The team writes one SELECT over its own views (``traces``, ``rewards``...) naming the rows it will
train on, with two columns: ``trace_id`` and ``reward`` (the rewards view's, or its own: a query
can reweigh, filter or invert them). It runs in the team's sandbox, like ``POST
/v1/traces/query``: another team's rows are not there to name. Each turn then keeps those served
by the checkpoint serving the alias (its ``checkpoint_version``) and received since the last
turn, so a turn never trains on what an earlier one did, nor on a canary's candidate.
"""

from __future__ import annotations

import duckdb

from loop.scope import quote
from traces.guard import QueryRefused, check_select
from traces.store import VIEWS

NEEDED = ("trace_id", "reward")


def production_rows(query: str, version: str, since: str, until: str) -> str:
    """Whole trace rows with their ``reward``: the query's, served by ``version``, received in
    (``since``, ``until``] (ISO times), answered and rewarded."""
    return (
        f"SELECT t.*, q.reward FROM traces t JOIN ({query}) q USING (trace_id) "
        f"WHERE t.http_status = 200 AND t.checkpoint_version = {quote(version)} AND q.reward IS NOT NULL "
        f"AND t.time_received > {quote(since)}::TIMESTAMPTZ AND t.time_received <= {quote(until)}::TIMESTAMPTZ"
    )


def check_query(team_store, query: str) -> None:
    """Refuse, with one line saying why, a query that is not one SELECT of the team's views or that
    lacks the columns a turn needs (``team_store`` is a sandboxed TraceStore of the team)."""
    check_select(team_store.con, query, set(VIEWS))  # the query itself, before it is wrapped
    try:
        columns = team_store.sql(f"SELECT * FROM ({query}) LIMIT 0").column_names
    except duckdb.Error as exc:
        raise QueryRefused(f"the query does not run: {str(exc).splitlines()[0]}") from None
    missing = [c for c in NEEDED if c not in columns]
    if missing:
        raise QueryRefused(
            f"the query must return the columns {list(NEEDED)}; it lacks {missing} "
            "(e.g. SELECT trace_id, reward FROM rewards WHERE name = 'reward')"
        )
