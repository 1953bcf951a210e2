"""Trace store benchmark: durable ingest, where a row's time goes, bytes per agent turn, GROUP BY
at 1M / 10M rows.

    .venv/bin/python -m deploy.bench.traces [--rows 200000] [--big 10000000] [--stages-only]
    .venv/bin/python -m deploy.bench.traces --sustained 120 --rate 50000
    .venv/bin/python -m deploy.bench.traces --compaction-hour

Ingest runs pinned to one core with fsync on: a row counts once its future resolved (it is in
the spool on disk), and again once it is in Parquet. The stages run the writer's own steps one
after another on the same rows, each timed alone (best of 3): what the request path pays
(submit, up to the spool's fsync) and what the mover pays (spool to Parquet), per row, and the
Parquet codecs side by side. Everything is measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import pyarrow.parquet as pq

from deploy.stack.processes import cpu_seconds
from traces.prefix import PrefixEncoder
from traces.schema import SCHEMA_VERSION, SPOOL_HEADER, check_record, rows_to_table, to_row
from traces.housekeeping import partitions, visible_files
from traces.spool import frame, read_segment
from traces.store import TraceStore
from traces.mover import partition_of, read_rows
from traces.writer import TraceWriter


def chat_record(i: int, rng: random.Random, prompt_len: int, completion_len: int) -> dict:
    now = datetime.now(timezone.utc)
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": " ".join(f"word{rng.randrange(1000)}" for _ in range(prompt_len // 2))},
    ]
    return {
        "trace_id": f"tr-{i:012d}",
        "team": f"team{i % 7}",
        "api_key_id": "key-1",
        "gen_ai_operation_name": "chat",
        "gen_ai_request_model": "tiny",
        "gen_ai_response_model": "tiny",
        "checkpoint_version": "base",
        "deployment": "local",
        "worker_id": "123",
        "stream": bool(i % 2),
        "gen_ai_input_messages": json.dumps(msgs),
        "sampling_params": '{"max_tokens": 256}',
        "response_content": "x" * (completion_len * 4),
        "finish_reason": "stop",
        "prompt_token_ids": [rng.randrange(4096) for _ in range(prompt_len)],
        "completion_token_ids": [rng.randrange(4096) for _ in range(completion_len)],
        "completion_logprobs": [-rng.random() for _ in range(completion_len)],
        "time_received": now,
        "time_admitted": now,
        "time_first_token": now,
        "time_done": now,
        "queue_wait_ms": 0.1,
        "ttft_ms": 12.5,
        "mean_itl_ms": 3.1,
        "gen_ai_usage_input_tokens": prompt_len,
        "gen_ai_usage_output_tokens": completion_len,
        "http_status": 200,
    }


def best_of_3(step):
    """(the fastest of three runs of ``step`` in seconds, what its last run returned)."""
    best, out = float("inf"), None
    for _ in range(3):
        t0 = time.perf_counter()
        out = step()
        best = min(best, time.perf_counter() - t0)
    return best, out


def ingest(rows: int, prompt_len: int, completion_len: int) -> dict:
    rng = random.Random(0)
    pool = [chat_record(i, rng, prompt_len, completion_len) for i in range(min(rows, 2000))]
    root = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    try:
        writer = TraceWriter(root, "bench", max_batch=20_000, max_age_s=2.0)
        t0 = time.perf_counter()
        ticket = 0
        for i in range(rows):
            rec = dict(pool[i % len(pool)])
            rec["trace_id"] = f"tr-{i:012d}"
            ticket = writer.submit(rec)
        writer.wait_durable(ticket, timeout=None)
        durable_s = time.perf_counter() - t0
        writer.close()
        parquet_s = time.perf_counter() - t0
        spool_bytes = sum(len(json.dumps(r, default=str)) for r in pool) / len(pool) * rows
        on_disk = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        stored = TraceStore(root).count()
        assert stored == rows, (stored, rows)
        return {
            "rows": rows,
            "prompt_tokens": prompt_len,
            "completion_tokens": completion_len,
            "durable_rows_per_s": round(rows / durable_s),
            "parquet_rows_per_s": round(rows / parquet_s),
            "durable_MB_per_s": round(spool_bytes / durable_s / 1e6, 1),
            "parquet_bytes_per_row": round(on_disk / rows),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def pin(cores: set[int], pid: int | None = None) -> None:
    """Every thread of a process (this one by default) onto ``cores``."""
    for tid in os.listdir(f"/proc/{pid or os.getpid()}/task"):
        os.sched_setaffinity(int(tid), cores)


def pin_mover(writer: TraceWriter) -> None:
    """The writer's mover child, once it is started (and again after a restart), on core 1."""
    child = writer.mover_process.pid if writer.mover_process else None
    if child is not None and os.sched_getaffinity(child) != {1}:
        pin({1}, child)


def drain(writer: TraceWriter, root: Path, t0: float, rows: int) -> tuple[float, TraceStore, float | None]:
    """Every row in Parquet: the seconds since ``t0`` that took, the store, checked to hold
    exactly ``rows``, and the CPU seconds the mover child spent (None: a thread mover)."""
    waiting = writer.flush(timeout=600)
    caught_up_s = time.perf_counter() - t0
    child = writer.mover_process.pid if writer.mover_process else None
    mover_cpu_s = cpu_seconds(child) if child is not None else None
    writer.close()
    pin(set(range(os.cpu_count() or 1)))
    store = TraceStore(root)
    assert waiting == 0 and store.count() == rows, (waiting, store.count(), rows)
    return caught_up_s, store, mover_cpu_s


def files_open(root: Path) -> int:
    """The files a query of the whole store opens now."""
    return sum(len(visible_files(part)) for part in partitions(root))


def settle_compaction(root: Path, quiet_s: float = 60.0, timeout: float = 900.0) -> tuple[int, float]:
    """Wait until the compactor has merged nothing for ``quiet_s``: the files a query then opens
    and the seconds until the last change. After a sustained offer that left it no idle core, it
    merges each level's files all at once: one merge of a few million rows takes tens of seconds."""
    t0 = last_change = time.monotonic()
    files = files_open(root)
    while time.monotonic() - last_change < quiet_s and time.monotonic() - t0 < timeout:
        time.sleep(0.2)
        if (now_files := files_open(root)) != files:
            files, last_change = now_files, time.monotonic()
    return files, round(last_change - t0, 1)


def backlog_trend(timeline: list[tuple]) -> float:
    """MB per minute the spool's backlog grows over the second half of the offer, fitted by
    least squares: a segment converted or sealed moves one sample by ~40 MB, the fit does not
    take that for a trend."""
    import numpy as np

    half = timeline[len(timeline) // 2 :]
    seconds, spool_bytes = np.array([t[0] for t in half]), np.array([t[3] for t in half])
    return round(float(np.polyfit(seconds, spool_bytes, 1)[0]) * 60 / 1e6, 1)


def sustained(
    seconds: float, rate: int, mover: str, prompt_len: int = 150, completion_len: int = 50, compact_fanout: int | None = None
) -> dict:
    """Records offered at ``rate`` per second for ``seconds``, as a gateway process takes them
    (this process, its threads on core 0; ``mover="process"``: its mover child on core 1, and with
    ``compact_fanout`` its compactor too, as a gateway runs them). Each second: how many were
    offered, acknowledged (fsync'd) and how many bytes wait in the spool. Then the time the mover
    needs to catch up once the offer stops, and every row read back."""
    rng = random.Random(0)
    pool = [chat_record(i, rng, prompt_len, completion_len) for i in range(2000)]
    root = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    try:
        writer = TraceWriter(root, "bench", max_batch=20_000, max_age_s=1.0, mover=mover, compact_fanout=compact_fanout)
        pin({0})
        timeline, sent = [], 0
        t0 = time.perf_counter()
        next_second = t0 + 1
        while (now := time.perf_counter()) < t0 + seconds:
            due = min(int((now - t0) * rate), sent + rate // 100)  # at most 10 ms' worth at once
            while sent < due:
                writer.submit(dict(pool[sent % 2000], trace_id=f"tr-{sent:012d}"))
                sent += 1
            pin_mover(writer)
            if now >= next_second:
                spooled = writer.spool.bytes_on_disk()
                timeline.append((round(now - t0, 1), sent, writer.spool.durable_count, spooled, files_open(root)))
                next_second += 1
            if sent >= due:
                time.sleep(0.001)
        offered_s = time.perf_counter() - t0
        writer.wait_durable(sent - 1, timeout=None)
        acked_s = time.perf_counter() - t0
        converted_s = settled = None
        if compact_fanout:  # the merges the conversion held back, once it has caught up
            writer.flush(timeout=600)
            converted_s = time.perf_counter() - t0
            settled = settle_compaction(root)
        drained_s, _, mover_cpu_s = drain(writer, root, t0, sent)
        caught_up_s = converted_s or drained_s  # not the wait for the merges
        return {
            "mover": mover,
            "compact_fanout": compact_fanout,
            "offered_rows_per_s": rate,
            "seconds": seconds,
            "sent": sent,
            "acknowledged_rows_per_s": round(sent / acked_s),
            "converted_rows_per_s": round(sent / caught_up_s),
            "catch_up_after_offer_s": round(caught_up_s - offered_s, 1),
            "spool_backlog_MB_max": round(max(t[3] for t in timeline) / 1e6, 1),
            "spool_backlog_MB_end": round(timeline[-1][3] / 1e6, 1),
            "spool_backlog_trend_MB_per_min_second_half": backlog_trend(timeline),
            # the mover child's own CPU per row: the rate its core could convert at
            "mover_cpu_us_per_row": round(mover_cpu_s / sent * 1e6, 2) if mover_cpu_s else None,
            "mover_ceiling_rows_per_s": round(sent / mover_cpu_s) if mover_cpu_s else None,
            "files_a_query_opens_max": max(t[4] for t in timeline),
            "files_a_query_opens_end_of_offer": timeline[-1][4],
            "files_a_query_opens_and_seconds_once_compaction_caught_up": settled,
            "timeline_s_sent_acked_spool_bytes_files": timeline,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def agent_sustained(seconds: float, sessions: int = 16, prompt: int = 140_000, new: int = 6_000, turns: int = 10) -> dict:
    """Agent turns as fast as they are acknowledged for ``seconds``: ~140K-token prompts that
    extend the session's last turn, ``new`` tokens (and logprobs) generated per turn, stored
    as prefix references. A session's next turn comes once its last one is durable, as its
    agent gets the answer only then; ``sessions`` of them interleave. Engine tokens per second
    (prompt + completion) acknowledged and converted, with the mover in its process."""
    import numpy as np

    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    try:
        writer = TraceWriter(root, "bench", max_batch=500, max_age_s=1.0, mover="process")
        pin({0})
        state = [{"prompt": rng.integers(0, 151_936, prompt).tolist(), "turn": 0, "ticket": -1} for _ in range(sessions)]
        rows = tokens = 0
        t0 = time.perf_counter()
        while time.perf_counter() < t0 + seconds:
            s = state[rows % sessions]
            if s["ticket"] >= 0:
                writer.wait_durable(s["ticket"], timeout=None)
            completion = rng.integers(0, 151_936, new).tolist()
            s["ticket"] = writer.submit(
                {
                    "trace_id": f"tr-{rows:012d}",
                    "gen_ai_conversation_id": f"s{rows % sessions}-{s['turn'] // turns}",
                    "gen_ai_request_model": "m",
                    "prompt_token_ids": s["prompt"],
                    "completion_token_ids": completion,
                    "completion_logprobs": (-rng.random(new)).tolist(),
                    "time_received": datetime.now(timezone.utc),
                    "http_status": 200,
                }
            )
            tokens += len(s["prompt"]) + new
            rows += 1
            s["turn"] += 1
            if s["turn"] % turns == 0:  # a new session, back to a ~140K prompt
                s["prompt"] = rng.integers(0, 151_936, prompt).tolist()
            else:
                s["prompt"] = s["prompt"] + completion + rng.integers(0, 151_936, 200).tolist()
            pin_mover(writer)
        writer.wait_durable(rows - 1, timeout=None)
        acked_s = time.perf_counter() - t0
        spool = writer.spool.bytes_on_disk()
        caught_up_s, store, _ = drain(writer, root, t0, rows)
        refs = store.sql("SELECT count(*) AS n FROM traces WHERE prompt_prefix_trace_id IS NOT NULL").column("n")[0].as_py()
        on_disk = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        return {
            "seconds": seconds,
            "rows": rows,
            "rows_stored_as_prefix_reference": refs,
            "engine_tokens": tokens,
            "acknowledged_engine_tokens_per_s": round(tokens / acked_s),
            "converted_engine_tokens_per_s": round(tokens / caught_up_s),
            "acknowledged_rows_per_s": round(rows / acked_s, 1),
            "spool_MB_at_end_of_offer": round(spool / 1e6, 1),
            "parquet_bytes_per_row": round(on_disk / rows),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def compaction_hour(minutes: int = 60, rate: int = 1000, every_min: int = 5, fanout: int = 8, flush_age_s: float = 0.25) -> dict:
    """An hour of ingest at ``rate`` rows/s in simulated time (a segment sealed and converted
    every ``flush_age_s``, one file each, as the gateway's ``trace_flush_age_s`` makes them at
    that rate), compacted both ways side by side: ``flywheel traces compact`` every
    ``every_min`` minutes, and the gateway's compactor (levels of ``fanout``,
    traces/compactor.py) after each file."""
    from traces.compactor import compact_levels
    from traces.housekeeping import compact

    per_file, every = round(rate * flush_age_s), round(every_min * 60 / flush_age_s)

    def cron(root: Path, part: Path, n: int) -> dict | None:
        return compact(root) if (n + 1) % every == 0 else None

    def levels(root: Path, part: Path, n: int) -> dict | None:
        return compact_levels(root, part, fanout)

    files, at_5_min = round(minutes * 60 / flush_age_s), round(300 / flush_age_s)
    return {
        "rows_per_s": rate,
        "simulated_minutes": minutes,
        "rows_per_file": per_file,
        f"compact_every_{every_min}_min": _hour_compacted(files, per_file, flush_age_s, at_5_min, cron),
        f"levels_of_{fanout}": _hour_compacted(files, per_file, flush_age_s, at_5_min, levels),
    }


def _hour_compacted(n_files: int, per_file: int, every_s: float, at_5_min: int, policy) -> dict:
    """``n_files`` files of ``per_file`` rows, ``every_s`` apart, ``policy(root, partition, n)``
    after each; the partition's files a query opens (most, and every 5 minutes) and those on disk
    (a merge's inputs stay a while), the merges' time, the rows and bytes they rewrote over those
    stored; then every row read back once. The bench's rows repeat, so a big file takes far fewer
    bytes a row than a small one: the rows are the fairer measure of the work."""
    from traces.housekeeping import data_files

    rng = random.Random(0)
    pool = [chat_record(i, rng, 150, 50) for i in range(2000)]
    root = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    try:
        writer = TraceWriter(root, "bench", max_batch=10 * per_file, max_age_s=1e9)
        start, sent, most_files, most_on_disk, merges, rows_rewritten = (
            datetime(2026, 12, 5, 9, tzinfo=timezone.utc),
            0,
            0,
            0,
            0,
            0,
        )
        rewritten_bytes, merge_s, longest_s, files_every_5_min = 0, 0.0, 0.0, []
        for n in range(n_files):
            at = start + timedelta(seconds=n * every_s)
            for _ in range(per_file):
                writer.submit(dict(pool[sent % 2000], trace_id=f"tr-{sent:012d}", time_received=at))
                sent += 1
            writer.flush()
            (part,) = root.glob("date=*/model=*")
            files = data_files(part)
            most_files, most_on_disk = max(most_files, len(visible_files(part))), max(most_on_disk, len(files))
            t0 = time.perf_counter()
            report = policy(root, part, n)
            took = time.perf_counter() - t0
            if report and report["files_out"]:
                new = [f for f in data_files(part) if f not in files]
                rewritten_bytes += sum(f.stat().st_size for f in new)
                merges, rows_rewritten = merges + report["files_out"], rows_rewritten + report["rows"]
                merge_s, longest_s = merge_s + took, max(longest_s, took)
            if (n + 1) % at_5_min == 0:
                files_every_5_min.append(len(visible_files(part)))
        writer.close()
        stored = TraceStore(root).count()
        assert stored == sent, (stored, sent)
        stored_bytes = sum(f.stat().st_size for f in data_files(part))
        return {
            "rows": sent,
            "most_files_in_partition": most_files,
            "most_files_on_disk": most_on_disk,
            "files_every_5_min": files_every_5_min,
            "merges": merges,
            "merge_s_total": round(merge_s, 1),
            "merge_s_longest": round(longest_s, 2),
            "rows_rewritten": rows_rewritten,
            "rows_rewritten_over_stored": round(rows_rewritten / sent, 2),
            "bytes_rewritten_over_stored": round(rewritten_bytes / max(stored_bytes, 1), 1),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def stages(rows: int, prompt_len: int, completion_len: int) -> dict:
    """Microseconds per row of each step a 200-token row takes through the writer, and the
    Parquet file's bytes per row under each codec."""
    rng = random.Random(0)
    pool = [chat_record(i, rng, prompt_len, completion_len) for i in range(min(rows, 2000))]
    records = [dict(pool[i % len(pool)], trace_id=f"tr-{i:012d}") for i in range(rows)]
    encoder, root = msgspec.msgpack.Encoder(), Path(tempfile.mkdtemp(prefix="fw-bench-"))
    segment = root / "seg-bench-00000001.spool"
    took: dict[str, float] = {}

    def timed(name: str, step):
        seconds, out = best_of_3(step)
        took[name] = round(seconds / rows * 1e6, 2)
        return out

    def write() -> None:
        fd = os.open(segment, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, spooled)
        os.fsync(fd)
        os.close(fd)

    try:
        timed("submit: check_record", lambda: [check_record(r) for r in records])
        dates = timed("submit: partition_of", lambda: [partition_of(r)[0] for r in records])
        encoded = timed("submit: prefix references", lambda: [PrefixEncoder().encode(r, d)[0] for r, d in zip(records, dates)])
        positional = timed("submit: to_row (lists packed)", lambda: [to_row(dict(e)) for e in encoded])
        payloads = timed("submit: msgpack", lambda: [encoder.encode(r) for r in positional])
        spooled = timed("submit: frame + crc32", lambda: b"".join([frame(encoder.encode(SPOOL_HEADER)), *map(frame, payloads)]))
        timed("submit: write + fsync (one group)", write)
        timed("mover: read + decode segment", lambda: read_segment(segment))
        fields, rows_read = read_rows(segment)
        table = timed("mover: rows_to_table", lambda: rows_to_table(fields, rows_read))
        codecs = {}
        for codec in ("zstd", "lz4", "none"):
            path = root / f"{codec}.parquet"
            timed(f"mover: parquet {codec}", lambda: pq.write_table(table, path, compression=codec))
            codecs[codec] = round(path.stat().st_size / rows)
        submit = sum(v for k, v in took.items() if k.startswith("submit"))
        mover = sum(v for k, v in took.items() if k.startswith("mover") and "parquet" not in k) + took["mover: parquet zstd"]
        return {
            "rows": rows,
            "us_per_row": took,
            "submit_us_per_row": round(submit, 2),
            "mover_us_per_row_zstd": round(mover, 2),
            "one_core_ceiling_rows_per_s": round(1e6 / (submit + mover)),
            "parquet_bytes_per_row": codecs,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def agentic_bytes(turns: int, start: int, step: int, out: int) -> dict:
    """One long agent session, stored with prefix references and whole, side by side."""
    rng = random.Random(1)
    prompt = [rng.randrange(4096) for _ in range(start)]
    session = []
    for t in range(turns):
        completion = [rng.randrange(4096) for _ in range(out)]
        session.append((list(prompt), completion))
        prompt = prompt + completion + [rng.randrange(4096) for _ in range(step - out)]
    result = {"turns": turns, "first_prompt": start, "new_tokens_per_turn": step}
    for mode, refs in (("with_prefix_refs", True), ("whole_prompts", False)):
        root = Path(tempfile.mkdtemp(prefix="fw-bench-"))
        writer = TraceWriter(root, "bench", prefix_refs=refs)
        for t, (p, c) in enumerate(session):
            # durable before the next turn, as a client gets its answer only then (and only a
            # durable turn is a prefix reference)
            writer.write(
                {
                    "trace_id": f"turn-{t:03d}",
                    "gen_ai_conversation_id": "s",
                    "gen_ai_request_model": "m",
                    "prompt_token_ids": p,
                    "completion_token_ids": c,
                    "http_status": 200,
                }
            )
        writer.close()
        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        result[f"{mode}_bytes_per_turn"] = round(size / turns)
        if refs:
            full = TraceStore(root).prompt_token_ids([f"turn-{t:03d}" for t in range(turns)])
            assert all(full[f"turn-{t:03d}"] == session[t][0] for t in range(turns)), "not exact"
        shutil.rmtree(root, ignore_errors=True)
    # int32 ids compress little: ~4 bytes per new token is the floor
    result["new_tokens_only_bytes_per_turn"] = step * 4
    result["ratio_whole_over_refs"] = round(result["whole_prompts_bytes_per_turn"] / result["with_prefix_refs_bytes_per_turn"], 1)
    return result


def group_by(rows: int, files: int) -> dict:
    import duckdb

    root = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    try:
        con = duckdb.connect()
        per = rows // files
        for f in range(files):
            part = root / f"date=2026-11-{1 + f % 28:02d}" / f"model=m{f % 3}"
            part.mkdir(parents=True, exist_ok=True)
            con.execute(f"""COPY (SELECT 'tr-' || ({f * per} + i) AS trace_id, 'team' || (i % 50) AS team,
                  'm{f % 3}' AS gen_ai_request_model, 2::SMALLINT AS schema_version,
                  (i % 4000)::INTEGER AS gen_ai_usage_input_tokens, (i % 500)::INTEGER AS gen_ai_usage_output_tokens,
                  (i % 97) * 1.5 AS ttft_ms, 200::SMALLINT AS http_status,
                  TIMESTAMPTZ '2026-11-01 00:00:00+00' + to_seconds(i % 86400) AS time_received
                  FROM range({per}) t(i)) TO '{part}/part-{f}.parquet' (FORMAT parquet, COMPRESSION zstd)""")
        store = TraceStore(root)
        q = (
            "SELECT team, gen_ai_request_model, count(*) AS n, sum(gen_ai_usage_output_tokens) AS out, "
            "avg(ttft_ms) AS ttft FROM traces GROUP BY ALL"
        )
        store.sql(q)  # warm the file metadata cache once, as a long-lived reader would
        seconds, n = best_of_3(lambda: store.sql(q).num_rows)
        return {"rows": rows, "files": files, "groups": n, "group_by_s_best_of_3": round(seconds, 3)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def month(rows: int, ids: str = "time", days: int = 30, models: int = 3) -> dict:
    """A month of traffic as the mover lays it out (a partition per day and model, files of
    time-ordered rows, ids that begin with their millisecond as ``serve.capture`` makes them),
    narrow rows; then the store's own queries over it: the usage page's rollup by day, team and
    model, an ad-hoc GROUP BY over the month, and a trace by id as the trace browser finds it.
    ``ids="random"``: ids of 128 random bits instead, as they were before (the before/after of a
    lookup by id)."""
    import duckdb

    root = Path(tempfile.mkdtemp(prefix="fw-bench-"))
    try:
        con, per = duckdb.connect(), rows // (days * models)
        t0 = time.perf_counter()
        for d in range(days):
            for m in range(models):
                part = root / f"date=2026-11-{1 + d:02d}" / f"model=m{m}"
                part.mkdir(parents=True)
                start_ms = 1_793_491_200_000 + d * 86_400_000  # 2026-11-01 UTC
                ms = f"{start_ms} + i * 86400000 // {per}"
                if ids == "time":
                    trace_id = f"lpad(printf('%x', {ms}), 12, '0') || lpad(printf('%x', hash(i, {d}, {m}) >> 44), 20, '0')"
                else:
                    trace_id = f"lpad(printf('%x', hash(i, {d}, {m})), 16, '0') || lpad(printf('%x', hash({m}, {d}, i)), 16, '0')"
                con.execute(f"""COPY (SELECT 'tr-' || {trace_id} AS trace_id,
                      'team' || (hash(i, {m}) % 50) AS team, 'm{m}' AS gen_ai_request_model,
                      {SCHEMA_VERSION}::SMALLINT AS schema_version,
                      (i % 4000)::INTEGER AS gen_ai_usage_input_tokens, (i % 500)::INTEGER AS gen_ai_usage_output_tokens,
                      (i % 3000)::INTEGER AS gen_ai_usage_cache_read_input_tokens,
                      (i % 97) * 1.5 AS ttft_ms, 200::SMALLINT AS http_status,
                      make_timestamptz(({ms}) * 1000) AS time_received
                    FROM range({per}) t(i)) TO '{part}/part-0.parquet' (FORMAT parquet, COMPRESSION zstd)""")
        made_s = time.perf_counter() - t0
        store = TraceStore(root)
        probe = store.sql("SELECT trace_id FROM traces WHERE date = '2026-11-17' AND model = 'm1' LIMIT 1 OFFSET 1000")
        trace_id = probe.column("trace_id")[0].as_py()
        queries = {
            "usage_by_day_team_model": (
                "SELECT day, team, model, sum(requests), sum(input_tokens), sum(output_tokens), "
                "sum(cached_input_tokens) FROM usage_by_team GROUP BY ALL",
                None,
            ),
            "group_by_month": (
                "SELECT team, gen_ai_request_model, count(*), avg(ttft_ms), sum(gen_ai_usage_output_tokens) "
                "FROM traces WHERE time_received >= TIMESTAMPTZ '2026-11-01 00:00:00+00' "
                "AND time_received < TIMESTAMPTZ '2026-12-01 00:00:00+00' GROUP BY ALL",
                None,
            ),
            "trace_by_id": ("SELECT * FROM traces WHERE trace_id = $1", [trace_id]),
        }
        out = {"ids": ids, "rows": per * days * models, "partitions": days * models, "generated_s": round(made_s, 1)}
        for name, (q, params) in queries.items():
            store.sql(q, params=params)  # the file metadata cached once, as a long-lived reader has it
            seconds, out[f"{name}_rows"] = best_of_3(lambda: store.sql(q, params=params).num_rows)
            out[f"{name}_s_best_of_3"] = round(seconds, 3)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="rows for the ingest runs")
    ap.add_argument("--big", type=int, default=10_000_000, help="largest GROUP BY size")
    ap.add_argument("--stages-only", action="store_true", help="only where a row's time goes")
    ap.add_argument(
        "--sustained", type=float, default=0, help="only SECONDS of ingest offered at --rate, mover in a thread and in a process"
    )
    ap.add_argument("--rate", type=int, default=50_000, help="rows per second offered by --sustained")
    ap.add_argument(
        "--compaction-hour",
        action="store_true",
        help="only an hour at 1,000 rows/s in simulated time (a file every 0.25 s): compacted every 5 min, "
        "and in levels as it is written",
    )
    ap.add_argument(
        "--month", type=int, default=0, help="only a month of MONTH rows and the store's queries over it (both id layouts)"
    )
    args = ap.parse_args()
    if args.compaction_hour:
        print(json.dumps({"compaction_hour": compaction_hour()}, indent=2))
        return
    if args.sustained:
        runs = {f"200_tokens_mover_{m}": sustained(args.sustained, args.rate, m) for m in ("thread", "process")}
        # gateway.trace_compact_fanout = 8: compaction beside the mover, in its process
        runs["200_tokens_mover_process_compacting"] = sustained(args.sustained, args.rate, "process", compact_fanout=8)
        runs["agent_turns_mover_process"] = agent_sustained(args.sustained)
        print(json.dumps(runs, indent=2))
        return
    os.sched_setaffinity(0, {0})  # ingest on one core
    if args.month:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        print(json.dumps({f"month_{ids}_ids": month(args.month, ids) for ids in ("time", "random")}, indent=2))
        return
    if args.stages_only:
        print(json.dumps({"stages_200_tokens": stages(min(args.rows, 50_000), 150, 50)}, indent=2))
        return
    results = {
        "stages_200_tokens": stages(min(args.rows, 50_000), 150, 50),
        "ingest_200_tokens": ingest(args.rows, 150, 50),
        "ingest_2k_tokens": ingest(max(args.rows // 10, 1000), 1800, 200),
        "agentic_session": agentic_bytes(turns=20, start=140_000, step=6_000, out=1_000),
    }
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))  # queries may use both cores
    results["group_by_1M"] = group_by(1_000_000, 10)
    results["group_by_big"] = group_by(args.big, 20)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
