"""The trace browser's reads: SQL over the store's views, built from a page's filters.

Every query goes through :func:`serve.trace_query.scoped_query`, the path `/v1/traces/query`
takes: a team's snapshot holds only its rows, whatever the filters say. User input only ever
reaches DuckDB as a bound parameter (``$n``), never inside the SQL text.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timezone

from serve.trace_query import scoped_query

LIST_COLUMNS = """trace_id, time_received, gen_ai_request_model, checkpoint_version,
    gen_ai_conversation_id, env_id, http_status, error, finish_reason, gen_ai_usage_input_tokens,
    gen_ai_usage_output_tokens, ttft_ms, response_tool_calls IS NOT NULL AS has_tool_calls,
    left(coalesce(response_content, response_tool_calls, ''), 160) AS preview"""


class BadFilter(ValueError):
    """A filter value that cannot be read (a date that is not one, a reward that is no number)."""


@dataclass
class TraceFilters:
    since: str = ""
    until: str = ""
    model: str = ""
    checkpoint: str = ""
    session: str = ""
    env: str = ""
    status: str = ""          # "", "ok", "error"
    tools: str = ""           # "", "1": only traces with tool calls
    reward_min: str = ""
    reward_max: str = ""
    q: str = ""               # full text over request, response and reasoning

    @classmethod
    def from_query(cls, params) -> "TraceFilters":
        return cls(**{f.name: (params.get(f.name) or "").strip() for f in fields(cls)})

    def active(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}

    def where(self) -> tuple[str, list]:
        """The WHERE clause (with ``$n`` placeholders) and its parameters."""
        clauses, params = [], []

        def bind(value) -> str:
            params.append(value)
            return f"${len(params)}"

        for name, op in (("since", ">="), ("until", "<=")):
            value = getattr(self, name)
            if value:
                moment = _moment(name, value)
                # the date partition column lets DuckDB skip whole days' files
                clauses.append(f"date {op} {bind(moment.date())} AND time_received {op} {bind(moment)}")
        for name, column in (("model", "gen_ai_request_model"), ("checkpoint", "checkpoint_version"),
                             ("session", "gen_ai_conversation_id"), ("env", "env_id")):
            if getattr(self, name):
                clauses.append(f"{column} = {bind(getattr(self, name))}")
        if self.status == "ok":
            clauses.append("error IS NULL")
        elif self.status == "error":
            clauses.append("error IS NOT NULL")
        elif self.status:
            raise BadFilter(f"status is 'ok' or 'error', not {self.status!r}")
        if self.tools:
            clauses.append("response_tool_calls IS NOT NULL")
        if self.reward_min or self.reward_max:
            low = _number("reward_min", self.reward_min, float("-inf"))
            high = _number("reward_max", self.reward_max, float("inf"))
            clauses.append(f"trace_id IN (SELECT trace_id FROM rewards WHERE name = 'reward' "
                           f"AND reward >= {bind(low)} AND reward <= {bind(high)})")
        if self.q:
            pattern = bind("%" + self.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
            clauses.append(" OR ".join(f"{c} ILIKE {pattern} ESCAPE '\\'" for c in
                                       ("gen_ai_input_messages", "response_content", "response_reasoning")))
            clauses[-1] = f"({clauses[-1]})"
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _moment(name: str, value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadFilter(f"{name} must be a date or time like 2026-12-01T13:00, not {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _number(name: str, value: str, default: float) -> float:
    try:
        return float(value) if value else default
    except ValueError:
        raise BadFilter(f"{name} must be a number, not {value!r}") from None


class Reader:
    """One caller's view of the store: ``team`` None is the admin (every team)."""

    def __init__(self, traces_dir: str, team: str | None, timeout_s: float):
        self.traces_dir, self.team, self.timeout_s = traces_dir, team, timeout_s

    def rows(self, sql: str, params: list | None = None, limit: int = 100_000) -> list[dict]:
        return self.table(sql, params, limit).to_pylist()

    def table(self, sql: str, params: list | None = None, limit: int = 100_000):
        return scoped_query(self.traces_dir, self.team, sql, limit, self.timeout_s, params)

    def traces(self, filters: TraceFilters, page: int, size: int) -> tuple[list[dict], bool]:
        """A page of traces, newest first, and whether there is a next page."""
        where, params = filters.where()
        rows = self.rows(f"SELECT {LIST_COLUMNS} FROM traces{where} "
                         f"ORDER BY time_received DESC NULLS LAST, trace_id DESC "
                         f"LIMIT {size + 1} OFFSET {page * size}", params)
        if rows:  # the page's rewards: a lookup for its ids, not a join over the store
            ids = [r["trace_id"] for r in rows]
            holes = ", ".join(f"${i + 1}" for i in range(len(ids)))
            rewards = {r["trace_id"]: r["reward"] for r in self.rows(
                f"SELECT trace_id, reward FROM rewards WHERE name = 'reward' AND trace_id IN ({holes})", ids)}
            for r in rows:
                r["reward"] = rewards.get(r["trace_id"])
        return rows[:size], len(rows) > size

    def trace(self, trace_id: str) -> dict | None:
        found = self.rows("SELECT * FROM traces WHERE trace_id = $1", [trace_id], limit=1)
        return found[0] if found else None

    def feedback(self, trace_id: str) -> list[dict]:
        return self.rows("SELECT name, reward, score, label, comment, source, time_created FROM feedback "
                         "WHERE trace_id = $1 ORDER BY time_created", [trace_id])

    def session(self, session_id: str) -> list[dict]:
        return self.rows(
            "SELECT trace_id, time_received, gen_ai_request_model, checkpoint_version, ttft_ms, error, "
            "coalesce(prompt_prefix_len, 0) AS reused_tokens, len(prompt_new_token_ids) AS new_tokens, "
            "gen_ai_usage_output_tokens AS output_tokens, gen_ai_usage_cache_read_input_tokens AS cached "
            "FROM traces WHERE gen_ai_conversation_id = $1 ORDER BY time_received, trace_id", [session_id])

    def by_checkpoint(self) -> dict[str, dict]:
        served = self.rows("SELECT coalesce(checkpoint_version, 'base') AS version, count(*) AS traces, "
                           "max(time_received) AS last_served FROM traces GROUP BY ALL")
        rewards = self.rows("SELECT coalesce(t.checkpoint_version, 'base') AS version, avg(r.reward) AS "
                            "mean_reward, count(r.reward) AS rewarded FROM rewards r JOIN traces t "
                            "USING (trace_id) WHERE r.name = 'reward' GROUP BY ALL")
        out = {r["version"]: {**r, "mean_reward": None, "rewarded": 0} for r in served}
        for r in rewards:
            out.setdefault(r["version"], {"version": r["version"], "traces": 0, "last_served": None}).update(r)
        return out

    def usage(self) -> list[dict]:
        return self.rows("SELECT day, team, model, sum(requests)::BIGINT AS requests, "
                         "coalesce(sum(input_tokens), 0)::BIGINT AS input_tokens, "
                         "coalesce(sum(output_tokens), 0)::BIGINT AS output_tokens, "
                         "coalesce(sum(cached_input_tokens), 0)::BIGINT AS cached_input_tokens "
                         "FROM usage_by_team GROUP BY ALL ORDER BY day, team, model")
