"""DuckDB over the trace Parquet files: views, SQL, team scoping, full-prompt reconstruction.

The store opens an in-memory DuckDB and defines views over the files; it never owns a database
file, so any number of readers run while gateways keep writing. Views:

- ``traces``: one row per trajectory, every schema version normalised to the current columns,
  plus the partition columns ``date`` and ``model``;
- ``traces_full``: ``traces`` plus ``prompt_token_ids``, the full prompt rebuilt from prefix
  references (a recursive query: filter by session when the store is large);
- ``sessions``: one row per session (turns, tokens, first/last time);
- ``usage_by_team``: requests, errors and tokens by team, model and day (the partition's: the
  UTC day of ``time_received``; read from the path, not cast from 100M timestamps);
- ``feedback``: every reward / score / label / comment posted (``traces.feedback``);
- ``rewards``: the latest feedback per (trace, reward name), for traces of the same team
  (admin feedback applies to any team's trace).

A sandboxed store (``sandbox=True``, implied by ``team=...``) cannot read or write any file
outside the store and accepts only guarded SELECTs (``traces.guard``); a team-scoped one also
sees only that team's rows.
"""

from __future__ import annotations

from datetime import date, datetime
from pathlib import Path
from typing import Iterator

import duckdb
import pyarrow as pa

from traces.feedback import FEEDBACK_SCHEMA
from traces.guard import check_select
from traces.housekeeping import feedback_partitions, partitions, visible_files
from traces.prefix import reconstruct_prompts
from traces.schema import FEEDBACK_VISIBLE_SQL, TRACE_SCHEMA
from traces.sql import file_list, sql_string

LAYOUTS = (
    "date=*/model=*/*.parquet",  # schema v2 and later
    "date=*/*.parquet",
)  # the first cut's layout (schema v1)
VIEWS = ("traces", "traces_full", "sessions", "usage_by_team", "feedback", "rewards")
OWN_VIEWS = ("traces", "feedback")  # what the trace browser's own statements read (an unsealed store)

_FULL_SQL = """
WITH RECURSIVE chain(trace_id, prompt_token_ids, seq) AS (
    SELECT trace_id, prompt_new_token_ids,
           list_concat(prompt_new_token_ids, coalesce(completion_token_ids, []))
    FROM traces WHERE prompt_prefix_trace_id IS NULL
  UNION ALL
    SELECT c.trace_id, list_concat(p.seq[1:c.prompt_prefix_len], c.prompt_new_token_ids),
           list_concat(p.seq[1:c.prompt_prefix_len], c.prompt_new_token_ids,
                       coalesce(c.completion_token_ids, []))
    FROM traces c JOIN chain p ON c.prompt_prefix_trace_id = p.trace_id
)
SELECT t.*, chain.prompt_token_ids FROM traces t JOIN chain USING (trace_id)
"""

_SESSIONS_SQL = """
SELECT gen_ai_conversation_id AS session_id, team, count(*) AS turns,
       min(time_received) AS started, max(time_done) AS ended,
       sum(gen_ai_usage_input_tokens) AS input_tokens,
       sum(gen_ai_usage_output_tokens) AS output_tokens,
       sum(gen_ai_usage_cache_read_input_tokens) AS cached_input_tokens,
       sum(len(prompt_new_token_ids))::BIGINT AS stored_prompt_tokens
FROM traces WHERE gen_ai_conversation_id IS NOT NULL GROUP BY ALL
"""

_USAGE_SQL = """
SELECT team, gen_ai_request_model AS model, CAST(date AS DATE) AS day,
       count(*) AS requests, count(error) AS errors,
       sum(gen_ai_usage_input_tokens) AS input_tokens,
       sum(gen_ai_usage_output_tokens) AS output_tokens,
       sum(gen_ai_usage_cache_read_input_tokens) AS cached_input_tokens
FROM traces GROUP BY ALL
"""


_REWARDS_SQL = f"""
SELECT f.trace_id, f.name,
       arg_max(f.reward, f.time_created) AS reward, arg_max(f.score, f.time_created) AS score,
       arg_max(f.label, f.time_created) AS label, arg_max(f.comment, f.time_created) AS comment,
       max(f.time_created) AS time_created
FROM feedback f JOIN traces t ON f.trace_id = t.trace_id AND {FEEDBACK_VISIBLE_SQL}
GROUP BY f.trace_id, f.name
"""


class TraceStore:
    def __init__(
        self,
        root: str | Path,
        team: str | None = None,
        sandbox: bool = False,
        threads: int | None = None,
        memory_limit: str = "1GB",
        spill_dir: str | Path | None = None,
        max_spill_bytes: int = 0,
        sealed: bool = True,
    ):
        """``memory_limit`` bounds DuckDB's buffer pool (not every string an expression builds:
        a sandboxed caller bounds the process too, see ``serve.query_pool``). A sandboxed store
        spills at most ``max_spill_bytes`` into ``spill_dir`` (0 or no directory: never).

        A store is sealed, fit for a user's SQL: every view is defined, and a team's rows come
        through Arrow datasets filtered to the team, DuckDB opening no file, whatever SQL it is
        sent. ``sealed=False`` is for statements we write (the trace browser's pages), never a
        user's: only the views they read (``OWN_VIEWS``; each view costs its definition at every
        snapshot), and a team's rows filtered out of DuckDB's own Parquet reader, which skips row
        groups by their Bloom filters and reads a row's other columns only once its filters
        matched; an Arrow scan reads every projected column of each row group it cannot skip
        before it filters."""
        self.root = Path(root)
        self.team, self.memory_limit, self.sealed = team, memory_limit, sealed
        self.arrow_scoped = sealed and team is not None
        self.spill_dir, self.max_spill_bytes = spill_dir, max_spill_bytes
        self.sandbox = sandbox or team is not None
        self.con = duckdb.connect(":memory:")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        # each view's definition reads every file's footer; cached, they are read once
        self.con.execute("SET parquet_metadata_cache = true")
        self.refresh()
        if self.sandbox:
            self._lock_down()

    def refresh(self) -> None:
        """Take a new snapshot: (re)define the views over the files there are now. Defining a
        view reads its files' footers: a file housekeeping removes between the listing and the
        definition (a feedback compaction, at hundreds of posts a minute) means listing again,
        up to ``RETRIES`` times."""
        if getattr(self, "_locked", False):
            raise RuntimeError("a sandboxed store is fixed at creation; open a new one")
        for attempt in range(RETRIES + 1):
            try:
                return self._define_views()
            except READ_FAILED as exc:
                if not file_gone(exc) or attempt == RETRIES:
                    raise
            except FileNotFoundError:  # a team's views are Arrow datasets: Arrow says it so
                if attempt == RETRIES:
                    raise

    def _define_views(self) -> None:
        # The current layout is bound as an explicit list of files, so every query of this
        # snapshot reads the same files: a glob would be expanded again at each query and could
        # see a compaction's output beside its inputs.
        current, legacy = trace_files(self.root)
        if self.arrow_scoped:
            # A sealed team's connection holds nothing unfiltered: its rows come through an Arrow
            # dataset filtered to the team, and DuckDB itself may open no file at all, so no
            # name, table function or catalog trick can reach another team's rows.
            self.con.register("_traces_raw", _team_dataset(self.root, current + legacy, TRACE_SCHEMA, self.team, hive=True))
        else:
            sources = [_parquet_source(group, hive=True) for group in _by_schema(current)]
            if legacy:
                sources.append(
                    f"SELECT * FROM read_parquet({sql_string(str(self.root / LAYOUTS[1]))}, "
                    f"hive_partitioning = true, union_by_name = true)"
                )
            if sources:
                raw = " UNION ALL BY NAME ".join(sources)
            else:  # a glob that matches nothing is an error in DuckDB: serve an empty, typed view
                self.con.register("_empty_traces", pa.Table.from_pylist([], schema=TRACE_SCHEMA))
                raw = "SELECT *, NULL::DATE AS date, NULL::VARCHAR AS model FROM _empty_traces"
            self.con.execute(f"CREATE OR REPLACE VIEW _traces_raw AS {raw}")
        have = {r[0] for r in self.con.execute("DESCRIBE _traces_raw").fetchall()}
        cols = []
        for f in TRACE_SCHEMA:
            if f.name == "prompt_new_token_ids" and "prompt_token_ids" in have:
                cols.append(
                    "coalesce(prompt_new_token_ids, prompt_token_ids) AS prompt_new_token_ids"
                    if f.name in have
                    else "prompt_token_ids AS prompt_new_token_ids"
                )
            elif f.name in have:
                cols.append(f.name)
            else:  # a column newer than every file: null, typed
                cols.append(f"NULL::{_duck_type(f.type)} AS {f.name}")
        cols += [c for c in ("date", "model") if c in have]
        where = f" WHERE team = {sql_string(self.team)}" if self.team is not None else ""
        self.con.execute(f"CREATE OR REPLACE VIEW traces AS SELECT {', '.join(cols)} FROM _traces_raw{where}")
        # bound as a list of files, as the traces are, so a compaction cannot show a row twice
        fb_files = [f for part in feedback_partitions(self.root) for f in visible_files(part)]
        if self.arrow_scoped:
            self.con.register("_feedback_raw", _team_dataset(self.root, fb_files, FEEDBACK_SCHEMA, self.team, hive=False))
            fb = "SELECT * FROM _feedback_raw"
        elif fb_files:
            fb = " UNION ALL BY NAME ".join(_parquet_source(group) for group in _by_schema(fb_files))
        else:
            self.con.register("_empty_feedback", pa.Table.from_pylist([], schema=FEEDBACK_SCHEMA))
            fb = "SELECT * FROM _empty_feedback"
        # every schema version's columns, as the traces view has them: a store whose feedback
        # was all written before a column (checkpoint_version) still has the column, NULL
        self.con.execute(f"CREATE OR REPLACE VIEW _feedback_any AS {fb}")
        have = {r[0] for r in self.con.execute("DESCRIBE _feedback_any").fetchall()}
        cols = ", ".join(f.name if f.name in have else f"NULL::{_duck_type(f.type)} AS {f.name}" for f in FEEDBACK_SCHEMA)
        self.con.execute(f"CREATE OR REPLACE VIEW feedback AS SELECT {cols} FROM _feedback_any{where}")
        if self.sealed:  # the views over those two, for a user's SQL
            for name, sql in (
                ("traces_full", _FULL_SQL),
                ("sessions", _SESSIONS_SQL),
                ("usage_by_team", _USAGE_SQL),
                ("rewards", _REWARDS_SQL),
            ):
                self.con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")

    def _lock_down(self) -> None:
        if not self.arrow_scoped:  # the admin's sandbox (or an unsealed team's) reads the files themselves, and only those
            self.con.execute(f"SET allowed_directories = [{sql_string(str(self.root.resolve()) + '/')}]")
        self.con.execute(f"SET memory_limit = {sql_string(self.memory_limit)}")
        # DuckDB's default spills, unbounded, into a .tmp folder where the process was started
        if self.spill_dir and self.max_spill_bytes > 0:
            self.con.execute(f"SET temp_directory = {sql_string(str(self.spill_dir))}")
            self.con.execute(f"SET max_temp_directory_size = '{int(self.max_spill_bytes)}B'")
        else:
            self.con.execute("SET temp_directory = ''")
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")
        self._locked = True

    def relation(self, query: str, params: list | None = None) -> duckdb.DuckDBPyRelation:
        if self.sandbox:
            check_select(self.con, query, allowed_tables=set(VIEWS if self.sealed else OWN_VIEWS))
        return self.con.sql(query, params=params)

    def sql(self, query: str, limit: int | None = None, params: list | None = None) -> pa.Table:
        """Run a query over this store's snapshot (its last ``refresh``) and return an Arrow
        table (its first ``limit`` rows, if given). If housekeeping removed a file of the
        snapshot meanwhile (a compaction's inputs, an expired day), an unlocked store takes a
        new snapshot and runs the query again, up to ``RETRIES`` times (feedback posted at
        hundreds a minute is compacted that often); a sandboxed one raises
        :class:`SnapshotGone` (open a new store). ``params`` fill the query's ``$1``, ``$2``...
        placeholders."""
        for attempt in range(RETRIES + 1):
            try:
                if attempt:
                    self.refresh()
                return self._fetch(query, limit, params)
            except READ_FAILED as exc:
                if not file_gone(exc) or attempt == RETRIES:
                    raise
                if getattr(self, "_locked", False):
                    raise SnapshotGone(str(exc)) from None

    def batches(
        self, query: str, params: list | None = None, rows_per_batch: int = 256
    ) -> tuple[list[str], Iterator[pa.RecordBatch]]:
        """The query's column names and its rows as they stream out of DuckDB, a batch at a
        time, so a caller can stop once it has read enough. A file of the snapshot removed
        meanwhile raises :class:`SnapshotGone`, as ``sql`` does on a sandboxed store."""
        rel = self.relation(query, params)
        if rel is None:
            return [], iter(())
        try:
            reader = rel.to_arrow_reader(rows_per_batch)
        except READ_FAILED as exc:
            raise (SnapshotGone(str(exc)) if file_gone(exc) else exc) from None
        return list(reader.schema.names), _snapshot_batches(reader)

    def _fetch(self, query: str, limit: int | None, params: list | None) -> pa.Table:
        rel = self.relation(query, params)
        if rel is None:
            return pa.table({})
        return (rel.limit(limit) if limit is not None else rel).to_arrow_table()

    def count(self) -> int:
        return self.con.execute("SELECT count(*) FROM traces").fetchall()[0][0]

    def prompt_token_ids(self, trace_ids: list[str]) -> dict[str, list[int]]:
        """Full prompt ids for these traces, rebuilt from their sessions' prefix chains."""
        if not trace_ids:
            return {}
        cols = "trace_id, prompt_prefix_trace_id, prompt_prefix_len, prompt_new_token_ids, completion_token_ids"
        ids = ", ".join(sql_string(t) for t in trace_ids)
        # One scan for the sessions involved; references normally stay inside a session.
        rows = {
            r["trace_id"]: r
            for r in self.con.sql(
                f"SELECT {cols} FROM traces WHERE trace_id IN ({ids}) OR gen_ai_conversation_id IN "
                f"(SELECT gen_ai_conversation_id FROM traces WHERE trace_id IN ({ids}))"
            )
            .to_arrow_table()
            .to_pylist()
        }
        while True:  # follow references that leave the session (explicit X-Parent-Trace-ID)
            missing = {
                r["prompt_prefix_trace_id"]
                for r in rows.values()
                if r["prompt_prefix_trace_id"] and r["prompt_prefix_trace_id"] not in rows
            }
            if not missing:
                break
            more = self.con.sql(
                f"SELECT {cols} FROM traces WHERE trace_id IN ({', '.join(sql_string(t) for t in missing)})"
            ).to_arrow_table()
            if more.num_rows == 0:
                break
            rows.update({r["trace_id"]: r for r in more.to_pylist()})
        full = reconstruct_prompts(rows)
        return {t: full[t] for t in trace_ids if t in full}


_PARTITIONS = pa.schema([("date", pa.date32()), ("model", pa.string())])

# Each file's schema, kept for the life of the process (a query worker's: serve/query_pool.py),
# keyed by path, size and mtime (a file is never rewritten in place; compaction writes new ones).
# Files of one schema share one entry of _SCHEMAS, so an entry is a few dozen bytes.
_FILE_SCHEMAS: dict[tuple[str, int, int], pa.Schema] = {}
_SCHEMAS: dict[pa.Schema, pa.Schema] = {}
_MAX_FILES_KNOWN = 500_000


def once_per_file(cache: dict, path: Path, read):
    """``read(path)``, kept in ``cache`` by path, size and mtime (a file is never rewritten in
    place), at most ``_MAX_FILES_KNOWN`` entries."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in cache:
        if len(cache) >= _MAX_FILES_KNOWN:
            cache.clear()
        cache[key] = read(path)
    return cache[key]


def file_schema(path: Path) -> pa.Schema:
    """The Arrow schema of Parquet file ``path``, its footer read once per process."""
    import pyarrow.parquet as pq

    def read(path: Path) -> pa.Schema:
        schema = pq.read_schema(path).remove_metadata()
        return _SCHEMAS.setdefault(schema, schema)

    return once_per_file(_FILE_SCHEMAS, path, read)


# the columns whose row-group statistics a reader uses: the ids' (feedback slices), the times'
# (where a list page starts) and those a list page's filters compare for equality
STATS_COLUMNS = ("trace_id", "time_received", "gen_ai_request_model", "checkpoint_version", "gen_ai_conversation_id", "env_id")
_FILE_GROUPS: dict[tuple[str, int, int], list[dict]] = {}


def file_groups(path: Path) -> list[dict]:
    """Each row group of Parquet file ``path`` as ``{"rows": n, column: (min, max, nulls)}``
    for the :data:`STATS_COLUMNS` its footer has statistics for (a column without them is
    absent), the footer read once per process (4 ms for a file of the 100M bench)."""
    import pyarrow.parquet as pq

    def read(path: Path) -> list[dict]:
        meta = pq.read_metadata(path)
        groups = []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            found: dict = {"rows": group.num_rows}
            for c in range(group.num_columns):
                column = group.column(c)
                stats = column.statistics
                if column.path_in_schema in STATS_COLUMNS and stats and stats.has_min_max:
                    found[column.path_in_schema] = (stats.min, stats.max, stats.null_count if stats.has_null_count else None)
            groups.append(found)
        return groups

    return once_per_file(_FILE_GROUPS, path, read)


def file_newest(path: Path) -> datetime | None:
    """The newest ``time_received`` in Parquet file ``path``, from its row groups' statistics
    (None: not known)."""
    newest = max((g["time_received"][1] for g in file_groups(path) if "time_received" in g), default=None)
    return newest if isinstance(newest, datetime) and newest.tzinfo else None


def file_id_groups(path: Path) -> list[tuple[str, int]]:
    """Each row group of Parquet file ``path`` as its smallest ``trace_id`` and its rows (a
    group without statistics is left out)."""
    return [(g["trace_id"][0], g["rows"]) for g in file_groups(path) if "trace_id" in g]


def newest_received(root: Path, day: date) -> datetime | None:
    """The newest ``time_received`` of day ``day``'s files by their statistics (None: not
    known). A list page starts its walk there rather than at the day's end or now: a store whose
    traffic stopped hours ago would otherwise ask that many empty spans first."""
    newest = None
    for f in _day_files(root, day):
        try:
            top = file_newest(f)
        except FileNotFoundError:  # merged away since the listing: its rows are in another file
            continue
        if top is not None and (newest is None or top > newest):
            newest = top
    return newest


def _day_files(root: Path, day: date) -> list[Path]:
    """The visible trace files of day ``day``, in the current layout."""
    return [f for part in (root / f"date={day.isoformat()}").glob("model=*") for f in visible_files(part)]


def newest_that_may_match(root: Path, days: list[date], equal: dict[str, str]) -> tuple[bool, datetime | None]:
    """Where, by the row groups' statistics, the newest row of ``days`` whose columns equal
    ``equal`` ({column: value}) may be: (False, None) when no row group may hold one; (True,
    the newest time such a row group holds) when that is known; (True, None) when it is not (a
    group without time statistics, or with rows without a time). A list page filtered on a
    checkpoint of last week skips ahead from there at once, not after an empty first span; one
    no file may hold costs no query. The time is an upper bound, never below the row's."""
    found, newest = False, None
    for day in days:
        first_cut = sorted(p for p in (root / f"date={day.isoformat()}").glob("*.parquet") if not p.name.startswith("."))
        for f in _day_files(root, day) + first_cut:
            try:
                groups = file_groups(f)
            except FileNotFoundError:  # merged away since the listing, into a file not listed
                return True, None
            for g in groups:
                if any(c in g and not g[c][0] <= v <= g[c][1] for c, v in equal.items()):
                    continue
                _, high, nulls = g.get("time_received", (None, None, None))
                if nulls != 0 or not isinstance(high, datetime) or high.tzinfo is None:
                    return True, None
                found, newest = True, max(newest or high, high)
    return found, newest


def trace_files(root: Path) -> tuple[list[Path], list[Path]]:
    """The trace files a snapshot taken now reads: the current layout's visible ones (newest
    first, see :func:`_newest_first`) and the first cut's (never compacted)."""
    current = _newest_first([f for part in partitions(root) for f in visible_files(part)])
    return current, sorted(root.glob(LAYOUTS[1]))


def _newest_first(files: list[Path]) -> list[Path]:
    """``files`` newest day first, and in a day the file written last first (its rows are the
    newest, a compaction's output aside). DuckDB reads the files of a view in this order, and a
    query for the newest rows (``ORDER BY time_received DESC LIMIT n``: every list page) pushes
    the n-th newest time it has found so far into the scan as a filter, which skips each later
    row group whose time statistics are older. Oldest first, the scan finds that bound only at
    the end: over 100M traces the newest 51 took 6.5 s that way and 0.1 s this way."""
    return sorted(files, key=lambda f: (f.parent.parent.name, f.stat().st_mtime_ns, f.name), reverse=True)


def _by_schema(files: list[Path]) -> list[list[Path]]:
    """``files`` grouped by schema (columns, their types and order), in the order first seen."""
    groups: dict[int, list[Path]] = {}
    for f in files:  # file_schema gives one object per distinct schema: its id is cheaper to hash
        groups.setdefault(id(file_schema(f)), []).append(f)
    return list(groups.values())


def _parquet_source(files: list[Path], hive: bool | None = None) -> str:
    """A SELECT over files of one schema. Binding ``read_parquet`` with ``union_by_name`` reads
    every file's footer, at every query of a view built on it: 18-37 ms for 231 files, and ~250 ms
    to open a snapshot's six views (measured at 10M traces). Files of one schema need none of it;
    the groups are joined ``UNION ALL BY NAME``, which fills a column a group lacks with NULL.
    ``hive`` None leaves the partition columns to DuckDB's guess from the paths, as before."""
    partitioning = "" if hive is None else f", hive_partitioning = {str(hive).lower()}"  # None: DuckDB's own guess
    return f"SELECT * FROM read_parquet({file_list(files)}{partitioning})"


def _team_dataset(root: Path, files: list[Path], schema: pa.Schema, team: str, hive: bool):
    """These files' rows of one team, as a lazily scanned Arrow dataset (DuckDB pushes its
    projections and filters into the scan). Columns absent from older files read as nulls."""
    import pyarrow.dataset as ds

    distinct = dict.fromkeys(map(file_schema, files))  # each schema once, in the order first seen
    unified = pa.unify_schemas([*distinct, schema] + ([_PARTITIONS] if hive else []), promote_options="permissive")
    dataset = ds.dataset(
        [str(f) for f in files],
        schema=unified,
        format="parquet",
        partitioning=ds.partitioning(_PARTITIONS, flavor="hive") if hive else None,
        partition_base_dir=str(root) if hive else None,
    )
    return dataset.filter(ds.field("team") == team)


def _snapshot_batches(reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    try:
        yield from reader
    except READ_FAILED as exc:
        raise (SnapshotGone(str(exc)) if file_gone(exc) else exc) from None
    except OSError as exc:  # DuckDB's error from inside its Arrow stream, as pyarrow raises it
        raise _duckdb_error(str(exc)) from None


def _duckdb_error(text: str) -> Exception:
    """The DuckDB exception whose message is ``text`` (its kind is the message's first words)."""
    if text.startswith("Out of Memory Error"):
        return duckdb.OutOfMemoryException(text)
    if text.startswith("INTERRUPT Error"):
        return duckdb.InterruptException(text)
    if file_gone(text):
        return SnapshotGone(text)
    return duckdb.Error(text)


class SnapshotGone(RuntimeError):
    """A file of a sandboxed store's snapshot was removed by housekeeping; open a new store."""


RETRIES = 3  # new snapshots an unlocked store's query takes after files vanished under it
# a file DuckDB reads itself fails as an IOException; one a registered Arrow dataset reads (a
# team's feedback) as an InvalidInputException around the same IOError
READ_FAILED = (duckdb.IOException, duckdb.InvalidInputException)


def file_gone(exc: duckdb.Error | str) -> bool:
    text = str(exc)
    return "No such file" in text or "No files found" in text or "Cannot open file" in text


def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return _duck_type(t.value_type) + "[]"
    return {
        pa.string(): "VARCHAR",
        pa.int16(): "SMALLINT",
        pa.int32(): "INTEGER",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.bool_(): "BOOLEAN",
        pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    }[t]
