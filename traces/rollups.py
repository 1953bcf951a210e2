"""Each trace file's totals by team, model, day and checkpoint (requests, tokens, the newest
time), read once per process and kept while the file is: a file is never rewritten, a
compaction writes new ones. The usage page and the checkpoints page add these up instead of
scanning every trace at every visit; only the files written since the last visit are read (in a
live store, the mover's newest and the compactor's merges).

A query worker (serve/query_pool.py) keeps them for its life, a few dozen rows a file. They are
computed by our own statement on a connection of their own, never the caller's: a team's
snapshot may open no file, and its totals are cut to its team here, as its views are.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from traces.store import READ_FAILED, RETRIES, file_gone, file_schema, once_per_file, trace_files

ROLLUP_SCHEMA = pa.schema(
    [
        ("team", pa.string()),
        ("model", pa.string()),  # the model asked for (gen_ai_request_model), as usage_by_team has it
        ("day", pa.date32()),  # the partition's day, as usage_by_team has it
        ("checkpoint_version", pa.string()),
        ("requests", pa.int64()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cached_input_tokens", pa.int64()),
        ("last_received", pa.timestamp("us", tz="UTC")),
    ]
)
_SUMS = {
    "input_tokens": "gen_ai_usage_input_tokens",
    "output_tokens": "gen_ai_usage_output_tokens",
    "cached_input_tokens": "gen_ai_usage_cache_read_input_tokens",
}
_FILE_ROLLUPS: dict[tuple[str, int, int], pa.Table] = {}
_local = threading.local()


def _connection() -> duckdb.DuckDBPyConnection:
    """This thread's connection: one thread, a small buffer pool, no spill (a file's totals are
    a few dozen groups)."""
    if getattr(_local, "con", None) is None:
        con = duckdb.connect(":memory:")
        con.execute("SET threads = 1")
        con.execute("SET memory_limit = '256MB'")
        con.execute("SET temp_directory = ''")
        _local.con = con
    return _local.con


def _day(path: Path) -> str:
    return next(p for p in reversed(path.parts) if p.startswith("date="))[len("date=") :]


def _read(path: Path) -> pa.Table:
    have = set(file_schema(path).names)

    def col(name: str, sql_type: str) -> str:  # a column older files lack reads as null, as in the views
        return name if name in have else f"NULL::{sql_type}"

    sums = ", ".join(f"sum({col(c, 'BIGINT')})::BIGINT AS {out}" for out, c in _SUMS.items())
    sql = (
        f"SELECT {col('team', 'VARCHAR')} AS team, {col('gen_ai_request_model', 'VARCHAR')} AS model, "
        f"$2::DATE AS day, {col('checkpoint_version', 'VARCHAR')} AS checkpoint_version, "
        f"count(*) AS requests, {sums}, max({col('time_received', 'TIMESTAMPTZ')}) AS last_received "
        "FROM read_parquet($1, hive_partitioning = false) GROUP BY ALL"
    )
    return _connection().sql(sql, params=[str(path), _day(path)]).to_arrow_table().cast(ROLLUP_SCHEMA)


def file_rollup(path: Path) -> pa.Table:
    """Trace file ``path``'s totals (:data:`ROLLUP_SCHEMA`), read once per process."""
    return once_per_file(_FILE_ROLLUPS, path, _read)


def rollups(root: Path, team: str | None, timeout_s: float) -> pa.Table:
    """The totals of the store's trace files as a query would list them now, one row per file
    and group; only ``team``'s rows unless None. Past ``timeout_s`` (reading files not seen
    before) it raises duckdb.InterruptException, as a query past its deadline does. A file merged
    away between the listing and its reading means listing again (``RETRIES`` times)."""
    deadline = time.monotonic() + timeout_s
    for attempt in range(RETRIES + 1):
        current, legacy = trace_files(root)
        try:
            tables = []
            for f in current + legacy:
                if time.monotonic() > deadline:
                    raise duckdb.InterruptException(f"the store's totals took over {timeout_s:g} s")
                tables.append(file_rollup(f))
            break
        except FileNotFoundError:
            if attempt == RETRIES:
                raise
        except READ_FAILED as exc:
            if not file_gone(exc) or attempt == RETRIES:
                raise
    table = pa.concat_tables(tables) if tables else ROLLUP_SCHEMA.empty_table()
    return table if team is None else table.filter(pc.equal(table["team"], team))


def usage(totals: pa.Table) -> list[dict]:
    """``usage_by_team``'s requests and tokens by day, team and model, in that order (a
    ``GROUP BY`` of the view gives the same rows)."""
    keys, sums = ["day", "team", "model"], ["requests", *_SUMS]
    table = totals.group_by(keys).aggregate([(c, "sum") for c in sums])
    table = pa.table({**{k: table[k] for k in keys}, **{c: pc.fill_null(table[f"{c}_sum"], 0) for c in sums}})
    return table.sort_by([(k, "ascending") for k in keys]).to_pylist()


def served_by_checkpoint(totals: pa.Table) -> list[dict]:
    """Traces served and the newest of them by checkpoint (``base`` for none)."""
    versions = pc.coalesce(totals["checkpoint_version"], pa.scalar("base"))
    table = pa.table({"version": versions, "traces": totals["requests"], "last_served": totals["last_received"]})
    table = table.group_by("version").aggregate([("traces", "sum"), ("last_served", "max")])
    named = table.select(["version", "traces_sum", "last_served_max"])
    return named.rename_columns(["version", "traces", "last_served"]).to_pylist()
