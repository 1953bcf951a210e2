"""The trace browser's reads: SQL over the store's views, built from a page's filters.

Every query goes through :func:`serve.trace_query.scoped_query`, the path `/v1/traces/query`
takes: a team's snapshot holds only its rows, whatever the filters say. User input only ever
reaches DuckDB as a bound parameter (``$n``), never inside the SQL text.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, fields
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

from serve.trace_query import QueryLimits, json_rows, scoped_query, scoped_store
from traces import rollups
from traces.housekeeping import feedback_partitions, visible_files
from traces.ids import id_days
from traces.schema import FEEDBACK_VISIBLE_SQL, feedback_visible
from traces.store import SnapshotGone, TraceStore, file_id_groups, newest_received, newest_that_may_match

LIST_COLUMNS = """trace_id, time_received, gen_ai_request_model, checkpoint_version,
    gen_ai_conversation_id, env_id, http_status, error, finish_reason, gen_ai_usage_input_tokens,
    gen_ai_usage_output_tokens, ttft_ms, response_tool_calls IS NOT NULL AS has_tool_calls,
    left(coalesce(response_content, response_tool_calls, ''), 160) AS preview"""


SESSION_COLUMNS = """trace_id, time_received, gen_ai_request_model, checkpoint_version, ttft_ms, error,
    coalesce(prompt_prefix_len, 0) AS reused_tokens, len(prompt_new_token_ids) AS new_tokens,
    gen_ai_usage_output_tokens AS output_tokens, gen_ai_usage_cache_read_input_tokens AS cached"""

MAX_LISTED = 100_000  # the newest matches a page may reach: each page reads the ids of those before it


class BadFilter(ValueError):
    """A filter value that cannot be read (a date that is not one, a reward that is no number)."""


# the filters that ask a column to equal their value
_EQUALITIES = {
    "model": "gen_ai_request_model",
    "checkpoint": "checkpoint_version",
    "session": "gen_ai_conversation_id",
    "env": "env_id",
}


@dataclass
class TraceFilters:
    since: str = ""
    until: str = ""
    model: str = ""
    checkpoint: str = ""
    session: str = ""
    env: str = ""
    status: str = ""  # "", "ok", "error"
    tools: str = ""  # "", "1": only traces with tool calls
    reward_min: str = ""
    reward_max: str = ""
    q: str = ""  # full text over request, response and reasoning

    @classmethod
    def from_query(cls, params) -> "TraceFilters":
        return cls(**{f.name: (params.get(f.name) or "").strip() for f in fields(cls)})

    def active(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}

    def where(self, costly: bool = True) -> tuple[str, list]:
        """The WHERE clause (with ``$n`` placeholders) and its parameters. A reward filter
        leaves ``{span}`` in it, for the caller's condition on ``t`` (the days and times it
        searches). ``costly`` False leaves out the reward and text filters (a join with the
        feedback, a scan of three texts): what is left, a row's own columns decide cheaply."""
        clauses, params = [], []

        def bind(value) -> str:
            params.append(value)
            return f"${len(params)}"

        for (name, op), moment in zip((("since", ">="), ("until", "<=")), self.bounds()):
            if moment is not None:
                # the date partition column lets DuckDB skip whole days' files
                clauses.append(f"date {op} {bind(moment.date())} AND time_received {op} {bind(moment)}")
        for column, value in self.equalities().items():
            clauses.append(f"{column} = {bind(value)}")
        if self.status == "ok":
            clauses.append("error IS NULL")
        elif self.status == "error":
            clauses.append("error IS NOT NULL")
        elif self.status:
            raise BadFilter(f"status is 'ok' or 'error', not {self.status!r}")
        if self.tools:
            clauses.append("response_tool_calls IS NOT NULL")
        if costly and (self.reward_min or self.reward_max):
            low = _number("reward_min", self.reward_min, float("-inf"))
            high = _number("reward_max", self.reward_max, float("inf"))
            # the `rewards` view's rule (latest feedback, of the trace's team or the admin), joined
            # to the span being searched only ({span}: filled in by the caller) instead of it all
            clauses.append(
                f"trace_id IN (SELECT f.trace_id FROM feedback f JOIN traces t ON f.trace_id = t.trace_id "
                f"AND {FEEDBACK_VISIBLE_SQL} WHERE f.name = 'reward' AND {{span}} "
                f"GROUP BY f.trace_id HAVING arg_max(f.reward, f.time_created) BETWEEN {bind(low)} AND {bind(high)})"
            )
        if costly and self.q:  # the text as typed: % and _ match themselves
            pattern = bind("%" + self.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
            likes = " OR ".join(
                f"{c} ILIKE {pattern} ESCAPE '\\'" for c in ("gen_ai_input_messages", "response_content", "response_reasoning")
            )
            clauses.append(f"({likes})")
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def equalities(self) -> dict[str, str]:
        """The filters that ask a column to equal a value, by column."""
        return {column: getattr(self, name) for name, column in _EQUALITIES.items() if getattr(self, name)}

    def bounds(self) -> tuple[datetime | None, datetime | None]:
        """``since`` and ``until`` as UTC times (None where not given)."""
        return tuple(_moment(name, getattr(self, name)) if getattr(self, name) else None for name in ("since", "until"))


def _moment(name: str, value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
        # a time without a zone is UTC, as the pages show times; days (partitions) are UTC days
        return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
    except (ValueError, OverflowError):  # not a time, or one that leaves the years 1-9999 in UTC
        raise BadFilter(f"{name} must be a date or time like 2026-12-01T13:00, not {value!r}") from None


def _days(root: str) -> list[date]:
    """The store's days, newest first, from its directory names (no file is opened)."""
    out = set()
    for d in Path(root).glob("date=*"):
        try:
            out.add(date.fromisoformat(d.name[5:]))
        except ValueError:
            continue
    return sorted(out, reverse=True)


FIRST_SPAN = timedelta(minutes=15)
# A text search's cost follows the rows it reads, each one's three texts: at 100M traces the 15
# minutes below a checkpoint's newest row took 208 ms to search. Its walk starts smaller; where
# matches are rare, each next span is twice as long.
TEXT_FIRST_SPAN = timedelta(minutes=2)
ONE_DAY = timedelta(days=1)


@dataclass(frozen=True)
class Span:
    """A part of the store a list page searches for its newest matches: the rows of ``days``
    (a day is a directory of files) received from ``lo`` and before ``hi``. Files hold their
    rows in time order, so a time bound lets the scan skip every row group outside it by its
    statistics: a span's cost follows its own rows, not the day's. ``lo`` None reaches back to
    the days' start and takes the rows without a time too (last, as ``NULLS LAST`` sorts them);
    ``hi`` None reaches past the days' end."""

    days: list[date]
    lo: datetime | None = None
    hi: datetime | None = None

    def sql(self, alias: str, first: int) -> tuple[str, list]:
        """The condition on table ``alias`` (``""`` or ``"t."``) with placeholders from ``$first``,
        and its parameters. The same numbers for each alias: the parameters are bound once."""
        params: list = list(self.days)
        clause = f"{alias}date IN (" + ", ".join(f"${first + i}" for i in range(len(self.days))) + ")"
        received = f"{alias}time_received"
        if self.lo is not None:
            params.append(self.lo)
            clause += f" AND {received} >= ${first + len(params) - 1}"
        if self.hi is not None:
            params.append(self.hi)
            below = f"{received} < ${first + len(params) - 1}"
            clause += f" AND {below}" if self.lo is not None else f" AND ({below} OR {received} IS NULL)"
        return clause, params


def spans(
    days: list[date], top: datetime | None = None, hi: datetime | None = None, width: timedelta = FIRST_SPAN
) -> Iterator[Span]:
    """The spans a list page asks in turn, newest first, each twice as long as the one before:
    ``width`` (15 minutes) below ``top`` (now, the page's ``until`` or the newest time in the
    newest day's files, whichever is first: the first span has no upper bound) or that day's
    end, then twice that... A span that would reach past a day's start takes the rest of that
    day and as many whole older days as its length covers (``days`` newest first, gaps allowed).
    ``hi``: the first span ends there (a walk taken up again below a span already asked)."""
    i = 0
    while i < len(days):
        start = datetime.combine(days[i], datetime.min.time(), timezone.utc)
        edge = min(start + ONE_DAY, max(top or start + ONE_DAY, start))
        if hi is not None:
            edge = min(edge, hi)
        lo, width = edge - width, width * 2
        if lo > start:
            yield Span([days[i]], lo, hi)
            hi = lo
            continue
        whole = 1 + int((start - lo) / ONE_DAY)
        yield Span(days[i : i + whole], None, hi)
        hi, i = None, i + whole


# Each span costs a query or two whatever its length (at 10M traces a team's reward filter took
# 57 ms over 15 minutes, 61 over an hour, 100 over four), so a walk that has seen how often its
# filters match sizes its next span to finish the page: at the rate seen, this many times the
# time that should hold the matches still missing (not fewer than the doubling's, not more than
# ``MAX_GROWTH`` times the span just asked, one match being a poor estimate).
FINISH_MARGIN, MAX_GROWTH = 1.5, 16


def _sized_to_finish(
    days: list[date], span: Span, top: datetime, matched: int, missing: int, walk: Iterator[Span]
) -> Iterator[Span]:
    """The walk (from ``top``) on below ``span`` (``matched`` matches in it), its next span long
    enough for ``missing`` more at that rate; ``walk`` itself where doubling reaches as far."""
    # a span without an upper bound ends where spans() started it: at the top or its day's end
    day_end = datetime.combine(span.days[0], datetime.min.time(), timezone.utc) + ONE_DAY
    length = (span.hi or min(top, day_end)) - span.lo
    width = min(max(length * missing / matched * FINISH_MARGIN, 2 * length), length * MAX_GROWTH)
    if width <= 2 * length:
        return walk
    return spans([d for d in days if d <= span.lo.date()], span.lo, hi=span.lo, width=width)


def _these_traces(found: list[dict], first: int) -> tuple[str, list]:
    """A WHERE clause for exactly these traces (rows with trace_id, date and time_received) and
    its parameters, numbered from ``$first``: their ids, and, when every one has a time, the
    span of their times and their days, bounds that let a scan skip files, days and row groups."""
    times = [t["time_received"] for t in found if t["time_received"] is not None]
    dates = sorted({t["date"] for t in found if t["date"] is not None})
    params: list = [[t["trace_id"] for t in found]]
    clauses = [f"trace_id IN (SELECT unnest(${first}))"]
    if dates and len(times) == len(found):
        params += [min(times), max(times), *dates]
        clauses.append(f"time_received BETWEEN ${first + 1} AND ${first + 2}")
        clauses.append("date IN (" + ", ".join(f"${first + 3 + i}" for i in range(len(dates))) + ")")
    return " AND ".join(clauses), params


# Feedback rows the checkpoints page hashes in one query: 5M at once ran out of 1 GB, 1.25M took
# 0.4 s (deploy/bench/results/2026-12-07/feedback-5M-rewards-query-slices.txt).
REWARDS_PER_SLICE = 1_000_000


def _feedback_cuts(traces_dir: str, per_slice: int) -> list[str]:
    """Trace ids, ascending, that cut the store's feedback into slices of about ``per_slice``
    rows, from its files' row-group statistics (no row is read). A slice of day-sized id
    ranges instead cost a query per day of the store, each at least one scan of a team's
    feedback (8 days at 10M traces: 1.2 s for a team)."""
    groups = sorted(g for part in feedback_partitions(Path(traces_dir)) for f in visible_files(part) for g in file_id_groups(f))
    cuts: list[str] = []
    rows = 0
    for low, n in groups:
        if rows >= per_slice and low > (cuts[-1] if cuts else groups[0][0]):  # no slice is empty
            cuts.append(low)
            rows = 0
        rows += n
    return cuts


def _number(name: str, value: str, default: float) -> float:
    try:
        return float(value) if value else default
    except ValueError:
        raise BadFilter(f"{name} must be a number, not {value!r}") from None


# The `rewards` view's 'reward' per trace (its latest visible feedback) summed by checkpoint,
# for the traces whose ids meet {ids} (a range). A feedback merge has written most rows' trace
# checkpoints into them (``traces.feedback_checkpoints``): those are read from the feedback
# alone. Only the rest are looked up among the traces, each read once: joined to the view, every
# trace was read twice and hashed, and a team's page ran out of its 1 GB at 30M traces (through
# the sealed snapshot's Arrow scan, which gives DuckDB no row count to pick the smaller side by); all
# 5M rewards of 100M traces looked up at read time took 12-13 s, a slice of ids at a time (at
# once, they ran out of 1 GB).
CHECKPOINT_REWARDS_SQL = f"""
WITH f AS (
    SELECT trace_id, team, reward, time_created, checkpoint_version FROM feedback
    WHERE name = 'reward' AND {{ids}}
),
t AS (
    SELECT trace_id, team, coalesce(checkpoint_version, 'base') AS version FROM traces
    WHERE {{ids}} AND {{unresolved}} AND trace_id IN (SELECT trace_id FROM f WHERE checkpoint_version IS NULL)
),
visible AS (
    SELECT trace_id, checkpoint_version AS version, reward, time_created FROM f WHERE checkpoint_version IS NOT NULL
    UNION ALL
    SELECT f.trace_id, t.version, f.reward, f.time_created
    FROM f JOIN t ON f.trace_id = t.trace_id AND {FEEDBACK_VISIBLE_SQL} WHERE f.checkpoint_version IS NULL
),
latest AS (
    SELECT trace_id, any_value(version) AS version, arg_max(reward, time_created) AS reward FROM visible GROUP BY trace_id
)
SELECT version, sum(reward) AS total, count(reward) AS rewarded FROM latest GROUP BY ALL
"""


class Reader:
    """One caller's view of the store for one page: ``team`` None is the admin (every team).
    The snapshot is opened once, on the first query, and serves all of the page's queries.
    The pages' own statements (every method here but ``console`` and ``download``, whose SQL is
    the user's) read a team's rows through an unsealed snapshot (``TraceStore``'s ``sealed``):
    at 10M traces a team's page of 50 rows took 151 ms through the sealed one's Arrow scan
    against the admin's 32 ms."""

    def __init__(self, traces_dir: str, team: str | None, timeout_s: float, limits: QueryLimits | None = None):
        self.traces_dir, self.team, self.timeout_s = traces_dir, team, timeout_s
        self.limits = limits or QueryLimits(timeout_s=timeout_s)
        self._stores: dict[bool, TraceStore] = {}  # sealed or not -> its snapshot

    def rows(self, sql: str, params: list | None = None, limit: int = 100_000) -> list[dict]:
        return self.table(sql, params, limit).to_pylist()

    def table(self, sql: str, params: list | None = None, limit: int = 100_000, sealed: bool = False):
        """Our own statement's rows, or with ``sealed`` a user's."""
        try:
            return scoped_query(self._snapshot(sealed), sql, limit, self.timeout_s, params)
        except SnapshotGone:  # housekeeping removed one of its files: once more on a new one
            del self._stores[sealed]
            return scoped_query(self._snapshot(sealed), sql, limit, self.timeout_s, params)

    def _snapshot(self, sealed: bool):
        if sealed not in self._stores:
            self._stores[sealed] = scoped_store(self.traces_dir, self.team, self.limits, sealed)
        return self._stores[sealed]

    def traces(self, filters: TraceFilters, page: int, size: int) -> tuple[list[dict], bool]:
        """A page of traces, newest first, and whether there is a next page.

        Two steps, so a page of a big store reads little: the ids of the newest matching traces,
        asked of the newest :func:`spans` first (sorting the whole store would read most of it,
        and a day of it at 100M traces is 14M rows), then the page's columns for those ids only,
        in their days."""
        if (page + 1) * size > MAX_LISTED:
            raise BadFilter(
                f"page {page} is past the {MAX_LISTED:,} newest matches a list reaches; "
                "narrow it with the filters (since, until, ...)"
            )
        where, params = filters.where()
        need = (page + 1) * size + 1
        since, until = filters.bounds()
        days = [d for d in _days(self.traces_dir) if (not since or d >= since.date()) and (not until or d <= until.date())]
        equal = filters.equalities()
        found, newest = newest_that_may_match(Path(self.traces_dir), days, equal) if equal else (True, None)
        if not found:  # by the files' statistics, no row can match
            return [], False
        top = [datetime.now(timezone.utc), until, newest_received(Path(self.traces_dir), days[0]) if days else None]
        top = min(t for t in top if t is not None)
        first = TEXT_FIRST_SPAN if filters.q else FIRST_SPAN
        walk = spans(days, top, width=first)
        cheap = filters.where(costly=False)
        if newest is not None and newest < top - first:
            # none is newer than ``newest``: the first span would hold none; start at the newest
            walk = self._skip_ahead(cheap, days, Span([newest.date()], newest + timedelta(microseconds=1)), walk, first)
        found: list[dict] = []
        while len(found) < need and (span := next(walk, None)):
            scope, scope_params = span.sql("", len(params) + 1)
            if "{span}" in where:  # a reward filter: the feedback of this span's traces only
                ids = self._id_range(span)
                if ids is None:
                    continue
                n = len(params) + len(scope_params)
                feedback_scope = f"{span.sql('t.', len(params) + 1)[0]} AND f.trace_id BETWEEN ${n + 1} AND ${n + 2}"
                scope = f"{where.replace('{span}', feedback_scope)} AND {scope}"
                scope_params += ids
            else:
                scope = f"{where} AND {scope}" if where else f" WHERE {scope}"
            matched = self.rows(
                f"SELECT trace_id, time_received, date FROM traces{scope} "
                f"ORDER BY time_received DESC NULLS LAST, trace_id DESC "
                f"LIMIT {need - len(found)}",
                params + scope_params,
            )
            found += matched
            if not matched and span.lo is not None and cheap[0]:
                walk = self._skip_ahead(cheap, days, span, walk, first)
            elif matched and span.lo is not None and len(found) < need and not filters.q:
                # (not a text search's: its span costs its rows, and a rate seen in a short one
                # is a poor guide: at 100M, 4 matches in 2 minutes sized a 32-minute span)
                walk = _sized_to_finish(days, span, top, len(matched), need - len(found), walk)
        wanted = found[page * size : (page + 1) * size]
        return self._page_rows(wanted), len(found) > (page + 1) * size

    def _id_range(self, span: Span) -> list[str] | None:
        """The smallest and largest id of the span's traces (None: it has none). Feedback files
        hold their rows about in their traces' time order, and the gateway's ids lead with the
        time: within these bounds, the feedback scan skips most row groups by their statistics.
        Exact whatever the ids: every trace of the span is within them."""
        scope, params = span.sql("", 1)
        got = self.rows(f"SELECT min(trace_id) AS low, max(trace_id) AS high FROM traces WHERE {scope}", params)[0]
        return None if got["low"] is None else [got["low"], got["high"]]

    def _skip_ahead(
        self, cheap: tuple[str, list], days: list[date], span: Span, walk: Iterator[Span], first: timedelta
    ) -> Iterator[Span]:
        """Where a span held no match, the walk goes on from the newest row older than it that
        the cheap filters match (the day, checkpoint, model...; not the reward or text): the
        spans it passes hold no match. Else the next spans, twice as long each, could take in a
        whole checkpoint's rows at once, and search each one's text (at 100M traces, a checkpoint
        a week old behind 8 empty spans). A walk whose cheap filters match no further row ends;
        one that would pass rows without a time goes on as it was. ``cheap``: the WHERE clause of
        the cheap filters and its parameters; ``days``: the walk's, newest first; ``first``: the
        length of the walk's first span from there."""
        where, params = cheap
        older = [d for d in days if d <= span.days[0]]
        n = len(params)
        holes = ", ".join(f"${n + i + 2}" for i in range(len(older)))
        # a top-1, not max(): DuckDB narrows a top-N's scan as it finds rows, and the views read
        # the newest files first (at 100M traces a checkpoint's skip 99 ms against 186); the
        # rows without a time sort first, so the one row says whether there are any
        got = self.rows(
            f"SELECT time_received FROM traces {where} AND (time_received < ${n + 1} OR time_received IS NULL) "
            f"AND date IN ({holes}) ORDER BY time_received DESC NULLS FIRST LIMIT 1",
            [*params, span.lo, *older],
        )
        if not got:
            return iter(())
        newest = got[0]["time_received"]
        if newest is None:
            return walk
        return spans([d for d in older if d <= newest.date()], newest, hi=span.lo, width=first)

    def _page_rows(self, wanted: list[dict]) -> list[dict]:
        if not wanted:
            return []
        where, params = _these_traces(wanted, 1)
        by_id = {r["trace_id"]: r for r in self.rows(f"SELECT {LIST_COLUMNS}, team FROM traces WHERE {where}", params)}
        rows = [by_id[w["trace_id"]] for w in wanted if w["trace_id"] in by_id]
        rewards = self._latest_rewards(rows)
        for r in rows:
            r["reward"] = rewards.get(r["trace_id"])
        return rows

    def _latest_rewards(self, rows: list[dict]) -> dict[str, float]:
        """The 'reward' the ``rewards`` view would give these traces, looked up in ``feedback``
        by id (the view joins all of ``traces`` to match teams; these rows carry their team)."""
        team_of = {r["trace_id"]: r["team"] for r in rows}
        if not team_of:
            return {}
        latest: dict[str, tuple] = {}
        # the ids' range lets the scan skip feedback files by their statistics (see _id_range):
        # the IN alone is a join, which prunes nothing
        for f in self.rows(
            "SELECT trace_id, team, reward, time_created FROM feedback WHERE name = 'reward' "
            "AND reward IS NOT NULL AND trace_id BETWEEN $2 AND $3 AND trace_id IN (SELECT unnest($1))",
            [list(team_of), min(team_of), max(team_of)],
        ):
            if feedback_visible(f["team"], team_of[f["trace_id"]]):
                if f["trace_id"] not in latest or f["time_created"] > latest[f["trace_id"]][0]:
                    latest[f["trace_id"]] = (f["time_created"], f["reward"])
        return {t: reward for t, (_, reward) in latest.items()}

    def trace(self, trace_id: str) -> dict | None:
        """One whole record: its day and model first (three columns of the store; of the days its
        id names, if it names any), then every column read from that partition only."""
        days = id_days(trace_id)
        holes = ", ".join(f"${i + 2}" for i in range(len(days)))
        where = []
        if days:
            sql = f"SELECT date, model FROM traces WHERE trace_id = $1 AND date IN ({holes})"
            where = self.rows(sql, [trace_id, *days], limit=1)
        if not where:  # an id the gateway did not make, or one received far from its making
            where = self.rows("SELECT date, model FROM traces WHERE trace_id = $1", [trace_id], limit=1)
        if not where:
            return None
        # plain equalities: those are what the scan prunes partitions by (IS NOT DISTINCT is not)
        part = {k: v for k, v in where[0].items() if v is not None}
        clauses = "".join(f" AND {k} = ${i + 2}" for i, k in enumerate(part))
        found = self.rows(f"SELECT * FROM traces WHERE trace_id = $1{clauses}", [trace_id, *part.values()], limit=1)
        return found[0] if found else None

    def feedback(self, trace_id: str) -> list[dict]:
        return self.rows(
            "SELECT name, reward, score, label, comment, source, time_created FROM feedback "
            "WHERE trace_id = $1 ORDER BY time_created",
            [trace_id],
        )

    def session(self, session_id: str) -> list[dict]:
        """The session's turns. DuckDB's own reader skips a row group whose Bloom filter rules
        the session id out and reads the other columns only for the rows that matched (a team's
        through the sealed snapshot's Arrow scan, which does neither: 3.3 s at 10M traces)."""
        return self.rows(
            f"SELECT {SESSION_COLUMNS} FROM traces WHERE gen_ai_conversation_id = $1 ORDER BY time_received, trace_id",
            [session_id],
        )

    def _totals(self) -> pa.Table:
        """The store's per-file totals (``traces.rollups``), this caller's team's only."""
        return rollups.rollups(Path(self.traces_dir), self.team, self.timeout_s)

    def by_checkpoint(self) -> dict[str, dict]:
        served = rollups.served_by_checkpoint(self._totals())
        out = {r["version"]: {**r, "mean_reward": None, "rewarded": 0} for r in served}
        for version, (total, rewarded) in self._checkpoint_rewards().items():
            stats = out.setdefault(version, {"version": version, "traces": 0, "last_served": None})
            stats.update(mean_reward=total / rewarded, rewarded=rewarded)
        return out

    def _checkpoint_rewards(self) -> dict[str, tuple[float, int]]:
        """Each checkpoint's sum and count of rewards, a slice of trace ids at a time (cut where
        the feedback holds about ``REWARDS_PER_SLICE`` rows: each query hashes that many, by
        trace id). Feedback files are merged in trace id order, so a slice reads only its own
        row groups. The slices cover every id, of whatever shape, exactly once."""
        cuts = _feedback_cuts(self.traces_dir, REWARDS_PER_SLICE)
        # the traces are read only within the unresolved rows' ids (none: not at all): a slice's
        # traces are millions of rows (a team's Arrow scan, then, read them at 1.2-1.6 s a slice at 100M)
        todo = self.rows(
            "SELECT min(trace_id) AS low, max(trace_id) AS high FROM feedback "
            "WHERE name = 'reward' AND checkpoint_version IS NULL"
        )[0]
        sums: dict[str, tuple[float, int]] = {}
        for low, high in zip([None, *cuts], [*cuts, None]):  # the first and last open-ended
            bounds = [(op, cut) for op, cut in ((">=", low), ("<", high)) if cut is not None]
            ids = " AND ".join(f"trace_id {op} ${i}" for i, (op, _) in enumerate(bounds, 1)) or "true"
            params = [cut for _, cut in bounds]
            unresolved = "false"
            if todo["low"] is not None:
                unresolved = f"trace_id BETWEEN ${len(params) + 1} AND ${len(params) + 2}"
                params += [todo["low"], todo["high"]]
            sql = CHECKPOINT_REWARDS_SQL.replace("{ids}", ids).replace("{unresolved}", unresolved)
            for r in self.rows(sql, params):
                total, rewarded = sums.get(r["version"], (0.0, 0))
                sums[r["version"]] = (total + (r["total"] or 0.0), rewarded + r["rewarded"])
        return {version: counted for version, counted in sums.items() if counted[1]}

    def usage(self) -> list[dict]:
        return rollups.usage(self._totals())

    def console(self, sql: str, limit: int) -> tuple[list[str], list[list[str]], bool]:
        """The SQL console's answer: column names, at most ``limit`` rows of cells cut to 300
        characters, and whether rows were left out."""
        table = self.table(sql, None, limit + 1, sealed=True)
        rows = [[_cell(v) for v in r] for r in _rows(table.slice(0, limit))]
        return table.column_names, rows, table.num_rows > limit

    def download(self, sql: str, format: str, max_rows: int) -> bytes:
        """The whole result as a CSV or Parquet file (at most ``max_rows`` rows)."""
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        table = self.table(sql, None, max_rows, sealed=True)
        out = io.BytesIO()
        if format == "csv":
            pacsv.write_csv(_as_text(table, lambda t: not any(is_type(t) for is_type in _CSV_TYPES)), out)
        else:  # Parquet has no interval of months, days and nanoseconds, nor a union
            pq.write_table(_as_text(table, lambda t: pa.types.is_interval(t) or pa.types.is_union(t)), out, compression="zstd")
        return out.getvalue()


def read(traces_dir: str, team: str | None, limits: QueryLimits, method: str, args: tuple):
    """``Reader(...).method(*args)``: what a query worker runs for a trace-browser page."""
    return getattr(Reader(traces_dir, team, limits.timeout_s, limits), method)(*args)


def _rows(table) -> list[list]:
    """Rows as Python values; a date or time Python cannot hold (year 0, 10000...) as text."""
    return [json.loads(r) for b in table.to_batches() for r in json_rows(b)]


def _cell(value) -> str:
    if value is None:
        return "NULL"
    text = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= 300 else text[:300] + "…"


_CSV_TYPES = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_boolean,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_decimal,
    pa.types.is_null,
    pa.types.is_timestamp,
    pa.types.is_date,
    pa.types.is_time,
)


def _as_text(table, needs_text):
    """``table`` with each column whose type ``needs_text`` written as text (JSON for the
    nested ones): CSV has only scalars, and Parquet lacks a few of DuckDB's types."""
    cols = []
    for name in table.column_names:
        col = table.column(name)
        if needs_text(col.type):
            values = [
                v
                for b in pa.Table.from_arrays([col], names=[name]).to_batches()
                for v in (json.loads(r)[0] for r in json_rows(b))
            ]
            col = pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], pa.string())
        cols.append(col)
    return pa.table(cols, names=table.column_names)
