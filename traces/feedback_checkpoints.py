"""The checkpoint that served each rated trace, written into its feedback rows when a day's
feedback files are merged (``traces.housekeeping.compact_feedback``).

The checkpoints page sums each rated trace's latest reward by the checkpoint that served the
trace. Joined at read time, that is a lookup of every rated trace among all the traces: 12-13 s
at 100M traces with 5M rewards (deploy/bench/results/2026-12-06/ui-100M-compact-levels-run2.txt),
on every visit. A stored trace's checkpoint never changes, so a merge looks it up once, for the
rows that lack it, and the page reads it from the feedback alone. A row stays NULL while its
trace is not in Parquet yet (a later merge of the day tries again), when its trace is not visible
to its team (``FEEDBACK_VISIBLE_SQL``: it never counts) and for an id the gateway did not make
(``traces.ids``: no day to look in); the page joins those few at read time, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import date
from pathlib import Path

import duckdb
import pyarrow as pa

from traces.ids import id_days
from traces.schema import FEEDBACK_VISIBLE_SQL
from traces.sql import file_list

log = logging.getLogger(__name__)

COLUMN = "checkpoint_version"
FOUND_SCHEMA = pa.schema([("trace_id", pa.string()), ("team", pa.string()), ("version", pa.string())])


def with_checkpoints(con: duckdb.DuckDBPyConnection, rows_sql: str, trace_files: Callable[[list[date]], list[Path]]) -> str:
    """``rows_sql`` (a SELECT of feedback rows) with ``checkpoint_version`` filled where it was
    NULL and the trace is found, looked up in ``trace_files(days)``: the visible trace files of
    those days. A failed lookup leaves the rows as they were: the merge goes on without it."""
    have = {r[0] for r in con.execute(f"DESCRIBE ({rows_sql})").fetchall()}
    unresolved = f"SELECT DISTINCT trace_id FROM ({rows_sql})" + (f" WHERE {COLUMN} IS NULL" if COLUMN in have else "")
    try:
        found = _lookup(con, [r[0] for r in con.execute(unresolved).fetchall()], trace_files)
    except (duckdb.Error, OSError) as exc:
        log.warning("feedback merge: the traces' checkpoints were not looked up (%s); they stay unresolved", exc)
        return rows_sql
    con.register("_found_checkpoints", found)
    resolved = f"CASE WHEN t.trace_id IS NOT NULL AND {FEEDBACK_VISIBLE_SQL} THEN t.version END"
    if COLUMN in have:
        filled = f"f.* REPLACE (coalesce(f.{COLUMN}, {resolved}) AS {COLUMN})"
    else:  # inputs written before the column was
        filled = f"f.*, {resolved} AS {COLUMN}"
    return f"SELECT {filled} FROM ({rows_sql}) f LEFT JOIN _found_checkpoints t ON f.trace_id = t.trace_id"


def _lookup(con, ids: list[str | None], trace_files: Callable[[list[date]], list[Path]]) -> pa.Table:
    """The team and checkpoint ('base' for none) of each of ``ids`` found, one day's ids at a
    time: each query reads only the files of the days an id names, and only their row groups
    whose id range meets the day's lowest and highest id (ids sort by the time they were made)."""
    by_days: dict[tuple[date, ...], list[str]] = {}
    for trace_id in ids:
        days = tuple(id_days(trace_id)) if trace_id else ()
        if days:
            by_days.setdefault(days, []).append(trace_id)
    tables = [FOUND_SCHEMA.empty_table()]
    for days, group in sorted(by_days.items()):
        files = trace_files(list(days))
        if not files:
            continue
        source = f"read_parquet({file_list(files)}, union_by_name = true, hive_partitioning = false)"
        if COLUMN not in {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}:
            continue  # a schema older than the column: left to the read-time join, as the view reads them
        sql = (
            f"SELECT trace_id, any_value(team) AS team, any_value(coalesce({COLUMN}, 'base')) AS version FROM {source} "
            "WHERE trace_id BETWEEN $1 AND $2 AND trace_id IN (SELECT unnest($3)) GROUP BY trace_id"
        )
        tables.append(con.sql(sql, params=[min(group), max(group), group]).to_arrow_table().cast(FOUND_SCHEMA))
    return pa.concat_tables(tables)
