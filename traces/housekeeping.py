"""Keeping the store fast and bounded: compaction, retention, and a doctor that says what is wrong.

Compaction merges a partition's small files into one. It is crash-safe: a journal naming the
inputs and the output is written first; the output appears by rename; then the inputs go, then
the journal. ``recover`` finishes or undoes an interrupted compaction, and readers skip inputs
whose output already exists (``visible_files``), so no row is ever seen twice or lost. The
compactor that runs beside the writer (``traces/compactor.py``) keeps a merge's inputs, hidden,
for a while after (each merge has a journal of its own until then): a query's snapshot taken
before the merge still finds its files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from traces.feedback_checkpoints import with_checkpoints
from traces.files import seal
from traces.schema import FEEDBACK_DIR, SCHEMA_VERSION
from traces.sql import file_list
from traces.spool import SEGMENT_GLOB, converted_name, fsync_path, read_segment

JOURNAL = "_compaction.json"
JOURNALS = "_compaction*.json"  # JOURNAL, and the compactor's one per merge whose inputs it keeps


def partitions(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("date=*/model=*") if p.is_dir())


# How long a merge that runs while the store is read (the compactor's, feedback's) keeps its inputs:
# twice a query's default deadline (serve/config.py's query_timeout_s is 30 s), so that a query
# whose snapshot listed them before the merge still reads them.
KEEP_INPUTS_S = 60.0


def data_files(part: Path) -> list[Path]:
    return sorted(p for p in part.glob("*.parquet") if not p.name.startswith("."))


def visible_files(part: Path) -> list[Path]:
    """The partition's files a reader should see: a compaction's inputs are hidden once its
    output is among the files listed. Listing first and reading the journals second is what
    makes this safe without a lock: a journal is removed only after its inputs are gone, so an
    input listed beside its output is either hidden here or already deleted (and the query that
    would read it fails and is retried, see ``TraceStore.sql``); it is never read twice."""
    files = data_files(part)
    listed, hidden = {f.name for f in files}, set()
    for j in _journal_entries(part):
        if j["output"] in listed:
            hidden.update(j["inputs"])
    return [f for f in files if f.name not in hidden] if hidden else files


def _journal_entries(part: Path):
    """The partition's journals as written, less any finished meanwhile or still being written
    (that one has no output yet)."""
    for journal in sorted(part.glob(JOURNALS)):
        try:
            yield json.loads(journal.read_text())
        except (FileNotFoundError, ValueError):
            continue


@contextmanager
def housekeeping_lock(root: Path, wait: bool = True):
    """The store's housekeeping lock (one compaction or retention at a time, across processes);
    yields whether it is held: without ``wait``, False while another holds it."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "_housekeeping.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def journals(root: Path) -> list[Path]:
    return [*root.glob(f"date=*/model=*/{JOURNALS}"), *root.glob(f"{FEEDBACK_DIR}/date=*/{JOURNALS}")]


def recover(root: Path, keep_s: float = 0.0, part: Path | None = None) -> int:
    """Finish (output exists) or roll back (it does not) interrupted compactions; a finished
    merge's inputs are kept until its journal is ``keep_s`` old. Under the housekeeping lock.
    A kept merge whose output a later merge took has no output left: that merge's journal
    carried its inputs (``_kept_behind``), so its own journal only goes. ``part``: that
    partition's only (the compactor's, before it merges there: the whole store's journals,
    read before every merge, were most of its cost)."""
    fixed, now = 0, time.time()
    for journal in journals(root) if part is None else part.glob(JOURNALS):
        folder = journal.parent
        j = json.loads(journal.read_text())
        if (folder / j["output"]).exists():
            if now - journal.stat().st_mtime < keep_s:
                continue
            for name in j["inputs"]:
                (folder / name).unlink(missing_ok=True)
        else:
            (folder / f".{j['output']}.tmp").unlink(missing_ok=True)
        journal.unlink()
        fixed += 1
    return fixed


def being_converted(root: Path) -> set[str]:
    """The names of the trace files whose spool segment is still there: their conversion is
    unfinished and will write them again, so they must not be merged away beside it."""
    return {converted_name(spool.name, seg) for spool in (root / "_spool").glob("*") for seg in spool.glob(SEGMENT_GLOB)}


def compact(root: str | Path, min_files: int = 2, max_file_bytes: int = 256 << 20) -> dict:
    """Merge each partition's files smaller than ``max_file_bytes`` into one file (the trace
    partitions, then the feedback days, their traces' checkpoints looked up). A file whose spool
    segment is still being converted waits for a later compaction."""
    root = Path(root)
    report = {"partitions": 0, "files_in": 0, "files_out": 0, "rows": 0}
    with housekeeping_lock(root):
        recover(root)
        con = duckdb.connect()
        converting = being_converted(root)
        for part in partitions(root):
            inputs = [f for f in data_files(part) if f.stat().st_size < max_file_bytes and f.name not in converting]
            merge_part(con, part, inputs, min_files, report, TRACE_ROWS)
        for part in feedback_partitions(root):
            inputs = [f for f in data_files(part) if f.stat().st_size < max_file_bytes]
            merge_part(con, part, inputs, min_files, report, FEEDBACK_ROWS, fill=_checkpoints_of_traces(root))
    return report


def compact_feedback(
    root: str | Path, parts: list[Path] | None = None, max_file_bytes: int = 256 << 20, keep_inputs_s: float = 0.0
) -> dict:
    """Merge each feedback day's files (or only ``parts``') into one, each row's trace's
    checkpoint looked up where it is not yet known; with ``keep_inputs_s``, the merged files
    stay that long for queries that listed them (``KEEP_INPUTS_S``)."""
    root = Path(root)
    report = {"partitions": 0, "files_in": 0, "files_out": 0, "rows": 0}
    with housekeeping_lock(root):
        recover(root, keep_s=keep_inputs_s)
        con, fill = duckdb.connect(), _checkpoints_of_traces(root)
        for part in parts if parts is not None else feedback_partitions(root):
            inputs = [f for f in visible_files(part) if f.stat().st_size < max_file_bytes]
            merge_part(con, part, inputs, 2, report, FEEDBACK_ROWS, keep_inputs=keep_inputs_s > 0, fill=fill)
    return report


def _checkpoints_of_traces(root: Path):
    """A feedback merge's ``fill``: each row's trace's checkpoint, looked up in the trace files a
    reader sees now, of the days the trace id names."""

    def day_files(days: list[date]) -> list[Path]:
        return [f for d in days for part in sorted(root.glob(f"date={d.isoformat()}/model=*")) for f in visible_files(part)]

    return partial(with_checkpoints, trace_files=day_files)


def feedback_partitions(root: Path) -> list[Path]:
    return sorted(p for p in (root / FEEDBACK_DIR).glob("date=*") if p.is_dir())


# (the column naming a row, the column that says which copy is newest, the merged file's row
# order, the schema's version key). The order keeps each row group's statistics narrow for the
# readers' bounds: the trace browser walks spans of time_received; a reward's lookup bounds the
# feedback by trace_id. Without it the de-duplicating window interleaves the row groups.
TRACE_ROWS = ("trace_id", "time_done", "time_received, trace_id", "flywheel.schema_version")
FEEDBACK_ROWS = ("feedback_id", "time_created", "trace_id, feedback_id", "flywheel.feedback_schema_version")


# How a merged file's row groups are cut. A page's lookups (one trace, the newest rows of a
# span) decode each row group they cannot skip whole: at 10M traces, DuckDB's default of 122,880
# rows took a trace by id 344-370 ms, 32,768 rows 134-143 ms, while the usage page, which scans
# every row, took 12-16 % longer (16,384 rows: 1.4-2x). A string column with at most 16,384 distinct
# values in a group (in a full group, a session id of two turns or more) is dictionary-encoded,
# and DuckDB writes a Bloom filter for it: an admin's session lookup skips the groups without
# the id (409 -> 95 ms). Trace ids and texts, nearly all distinct, stay plain in a full group
# (in a smaller one, +7 % bytes). deploy/bench/results/2026-12-06/ui-10M-compact-*.txt
MERGED_LAYOUT = "ROW_GROUP_SIZE 32768, DICTIONARY_SIZE_LIMIT 16384"


def merge_part(
    con,
    part: Path,
    inputs: list[Path],
    min_files: int,
    report: dict,
    rows_of: tuple,
    prefix: str = "compact-",
    keep_inputs: bool = False,
    fill: Callable[[duckdb.DuckDBPyConnection, str], str] | None = None,
) -> None:
    """Journal, write the merged file (one row per key, its newest copy, in ``rows_of``'s
    order), rename it in, remove the inputs, remove the journal: a crash anywhere is finished
    or undone by ``recover``, and ``visible_files`` never shows a row twice meanwhile. With
    ``keep_inputs`` the inputs and a journal of this merge's own stay, for a later ``recover``
    to remove. ``fill(con, rows_sql)`` gives the rows as written, columns filled in (feedback's
    checkpoints: ``traces.feedback_checkpoints``)."""
    key, newest, order, version_key = rows_of
    if len(inputs) < min_files:
        return
    names = [f.name for f in inputs]
    output = prefix + hashlib.sha256("\n".join(names).encode()).hexdigest()[:16] + ".parquet"
    journal = part / (f"_compaction.{output}.json" if keep_inputs else JOURNAL)
    hidden = names + (_kept_behind(part, set(names)) if keep_inputs else [])
    journal.write_text(json.dumps({"inputs": hidden, "output": output}))
    fsync_path(journal)
    tmp = part / f".{output}.tmp"
    rows_sql = (
        f"SELECT * FROM read_parquet({file_list(inputs)}, union_by_name = true, hive_partitioning = false) "
        f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY {newest} DESC NULLS LAST) = 1"
    )
    if fill is not None:
        rows_sql = fill(con, rows_sql)
    rows = con.execute(
        f"COPY (SELECT * FROM ({rows_sql}) ORDER BY {order}) "
        f"TO '{str(tmp).replace(chr(39), chr(39) * 2)}' (FORMAT parquet, COMPRESSION zstd, {MERGED_LAYOUT}, "
        f"KV_METADATA {{'{version_key}': '{_max_version(inputs, version_key)}'}})"
    ).fetchall()[0][0]
    seal(tmp, part / output)
    if not keep_inputs:
        for f in inputs:
            f.unlink()
        fsync_path(part)
        journal.unlink()
    report["partitions"] += 1
    report["files_in"] += len(inputs)
    report["files_out"] += 1
    report["rows"] += rows


def _kept_behind(part: Path, names: set[str]) -> list[str]:
    """The inputs still kept of the merges whose outputs are among ``names``: the new merge's
    journal hides (and at last removes) them too. Their own journals stay until ``recover``
    ends them, so a reader that listed the files before this merge's output appeared still
    finds them hidden by those."""
    return [name for j in _journal_entries(part) if j["output"] in names for name in j["inputs"]]


def _max_version(files: list[Path], key: str = "flywheel.schema_version") -> int:
    versions = [int((pq.read_metadata(f).metadata or {}).get(key.encode(), b"1")) for f in files]
    return max(versions + [1]) if versions else SCHEMA_VERSION


def retain(root: str | Path, days: int, today: date | None = None) -> list[str]:
    """Delete date partitions older than ``days`` days; returns the dates removed."""
    root = Path(root)
    cutoff = (today or datetime.now(timezone.utc).date()) - timedelta(days=days)
    removed = []
    with housekeeping_lock(root):
        for d in sorted(root.glob("date=*")):
            try:
                day = date.fromisoformat(d.name.split("=", 1)[1])
            except ValueError:
                continue
            if day < cutoff:
                shutil.rmtree(d)
                removed.append(day.isoformat())
    return removed


def doctor(root: str | Path) -> dict:
    """Spool backlog, files, schema versions and anything unreadable, for `flywheel traces doctor`."""
    root = Path(root)
    report: dict = {
        "root": str(root),
        "spool": {},
        "partitions": 0,
        "files": 0,
        "bytes": 0,
        "small_files": 0,
        "rows": 0,
        "schema_versions": {},
        "unreadable": [],
        "interrupted_compactions": [],
        "stray_temp_files": [],
    }
    for inst in sorted((root / "_spool").glob("*")):
        segs = sorted(inst.glob(SEGMENT_GLOB))
        report["spool"][inst.name] = {
            "segments": len(segs),
            "bytes": sum(s.stat().st_size for s in segs),
            # minus each segment's header frame
            "records": sum(max(len(read_segment(s)[0]) - 1, 0) for s in segs),
        }
    for f in sorted(root.glob("date=*/**/*.parquet")):
        if f.name.startswith("."):
            continue
        report["files"] += 1
        size = f.stat().st_size
        report["bytes"] += size
        report["small_files"] += size < (8 << 20)
        try:
            meta = pq.read_metadata(f)
        except Exception as exc:
            report["unreadable"].append(f"{f.relative_to(root)}: {exc}")
            continue
        report["rows"] += meta.num_rows
        kv = meta.metadata or {}
        version = kv.get(b"flywheel.schema_version", b"?").decode()
        if version == "?" and "schema_version" in meta.schema.names:
            version = "unlabelled"
        report["schema_versions"][version] = report["schema_versions"].get(version, 0) + 1
    report["partitions"] = len({f.parent for f in root.glob("date=*/**/*.parquet")})
    with housekeeping_lock(root, wait=False) as idle:  # a compaction under way has its journal and temp file
        report["compacting"] = not idle
        if idle:
            report["interrupted_compactions"] = [str(j.relative_to(root)) for j in journals(root) if not _finished(j)]
            report["stray_temp_files"] = [str(t.relative_to(root)) for t in root.glob("date=*/**/.*.tmp")]
    return report


def _finished(journal: Path) -> bool:
    """A journal whose output is in place: a merge whose inputs are kept a while (or whose
    removal a crash cut short, which the next compaction ends)."""
    try:
        return (journal.parent / json.loads(journal.read_text())["output"]).exists()
    except (FileNotFoundError, ValueError, KeyError):
        return False
