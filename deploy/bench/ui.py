"""Trace browser benchmark: the /ui pages' queries over a store of synthetic traces.

    .venv/bin/python -m deploy.bench.ui [--traces 1000000] [--dir /tmp/flywheel-ui-bench] [--repeats 15]
                                        [--chunks-per-file 8 | --compact [whole|levels]]

The store is generated once, vectorised (numpy/pyarrow), in the writer's layout: each 100k-trace
chunk's rows of a ``date=/model=`` partition are one row group of a zstd Parquet file, and a file
holds ``--chunks-per-file`` of them (8: the size the compactor merges a partition's files up to),
rewards through ``traces.feedback.write_feedback``. With ``--compact`` each chunk's rows of a
partition are a file of their own, as the mover writes them, and ``traces.housekeeping.compact``
merges each partition's files into one (``whole``, as ``flywheel traces compact``), or the
gateway's compactor merges them in levels of 8 up to 256 MiB inputs (``levels``,
``traces.compactor.compact_levels``: what a live store holds): DuckDB's writer, whose row groups
and encodings (a dictionary, hence a Bloom filter, for a column of few enough distinct values in
a row group: the session ids) differ from pyarrow's. Trace ids are the gateway's, led by their
millisecond. It is reused while its marker file says it holds this shape. Shape: 7 days, 2 models,
3 teams, 20 checkpoints over the week, 5-turn sessions with prefix references, 3 % errors, 10 %
tool calls, rewards on 5 %, Zipf-distributed words plus one topic word per trace out of 100 (so
each topic is in ~1 % of traces: the search).

Every query goes through a new ``serve.ui.queries.Reader``, so each one opens a fresh sandboxed
snapshot exactly as a page request does; that cost is in every figure. Each query runs once to
warm the page cache (its time is ``first``), then ``--repeats`` times, as the admin (all teams)
and as one team. The bench is one process, as a query worker is: the usage and checkpoints pages'
per-file totals (``traces.rollups``) are read at the admin's first run and kept, so their
``first`` is a worker's first visit and their p50 every later one. The goal is a list page
(``Reader.traces``) in under 300 ms at p50.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deploy.bench import pct
from serve.ui.queries import Reader, TraceFilters
from traces.feedback import write_feedback
from traces.compactor import compact_levels
from traces.housekeeping import compact, compact_feedback, partitions
from traces.schema import SCHEMA_VERSION, TRACE_SCHEMA
from traces.mover import model_dir

START_US = int(np.datetime64("2026-11-24T00:00:00", "us").astype(np.int64))
DAY_US, DAYS, TURNS, CHUNK = 86_400 * 10**6, 7, 5, 100_000  # CHUNK is a multiple of TURNS
MODELS, TEAMS = ["qwen3-8b", "llama-3.1-8b"], ["research", "evals", "product"]
ENVS, TOOLS = ["swe", "math", "browse", "chat"], ["search", "read_file", "run_tests", "edit"]
CHECKPOINTS, PAGE, MARKER = 20, 50, "_ui_bench.json"
ERRORS = [("upstream timeout after 60 s", 504), ("engine overloaded, retry", 503), ("context length exceeded", 400)]
WORDS = list(
    dict.fromkeys(
        """the a to of and in is for that it with on this be as are by we you
    not can from or an at have will if use but which file function test error value return code run
    should when one data all new list make add need what check fix first output input line type
    using case change also update call more build set like just then model step result path name
    string number each only any into out config read write class method import module package
    version install server client request response query table column row index key map array loop
    branch commit merge review patch diff log trace debug print assert raise exception handle retry
    timeout cache memory thread process queue worker batch token prompt train eval reward score
    metric loss gradient weight layer tensor shape dtype device kernel buffer stream socket port
    host url header body json parse format encode decode hash sort filter group join count sum mean
    max min range slice split strip replace match pattern regex date time zone second minute hour
    day week user team admin account password secret permission role policy rule limit quota rate
    budget cost price order item cart payment invoice email message notify event schedule job task
    plan goal idea note draft summary report chart plot figure image video audio text word sentence
    paragraph page section chapter title author source link reference example sample demo guide
    docs readme license issue ticket bug feature release deploy rollback monitor alert""".split()
    )
)
TOPICS = """aardvark baklava cormorant dulcimer eucalyptus flamingo gazpacho harpsichord iguana
    jacaranda kumquat lorikeet marzipan narwhal ocelot pangolin quetzal rambutan salamander tamarind
    ukulele vicuna wombat xylophone yodel zeppelin anchovy bonsai cassowary dromedary edelweiss
    falafel gondola hibiscus igloo jackal kiwifruit lemming mandolin nutmeg oregano papaya quinoa
    raccoon saffron toucan vanilla walrus yak zucchini armadillo bagpipe chinchilla
    dandelion emu fennel gecko hedgehog ibis jellyfish kayak lychee mongoose nectarine okapi
    platypus quokka radish sitar tapir uakari vulture wasabi yarrow zebu alpaca banjo capybara
    dingo eggplant ferret guava hyena impala jaguar koala llama manatee nightingale octopus
    penguin quail reindeer sturgeon turmeric urchin viola wolverine yucca zither""".split()
NEEDLE = "quokka"  # the search term: one topic, so ~1 % of traces
assert len(TOPICS) == 100 and not any(NEEDLE in w for w in WORDS + TOPICS if w != NEEDLE)
_HEX = np.array([f"{i:02x}".encode() for i in range(256)], "S2")
_ZIPF = 1 / (np.arange(len(WORDS)) + 5.0)


def _ids(rng, n: int, nbytes: int, prefix: str) -> pa.Array:
    """Random hex ids (sessions', tool calls'), without a Python loop."""
    digits = _HEX[rng.integers(0, 256, (n, nbytes), dtype=np.uint8)].view(f"S{2 * nbytes}").ravel()
    return pc.binary_join_element_wise(prefix, pa.array(digits).cast(pa.string()), "")


def _trace_ids(rng, received_us: np.ndarray) -> pa.Array:
    """Ids as the gateway makes them (``traces.ids.new_trace_id``): ``tr-``, the millisecond
    received in 12 hex digits, then 20 random ones."""
    ms = (received_us // 1000).astype(">u8").view(np.uint8).reshape(-1, 8)[:, 2:]
    stamp = pa.array(_HEX[ms].view("S12").ravel()).cast(pa.string())
    return pc.binary_join_element_wise("tr-", stamp, _ids(rng, len(received_us), 10, ""), "")


def _text(rng, n: int, k: int, topic: pa.Array | None = None) -> pa.Array:
    """n strings of k Zipf-distributed words (the topic word, if any, third)."""
    vocab = pa.array(WORDS)
    cols = [vocab.take(pa.array(rng.choice(len(WORDS), n, p=_ZIPF / _ZIPF.sum()))) for _ in range(k)]
    if topic is not None:
        cols.insert(2, topic)
    return pc.binary_join_element_wise(*cols, " ")


def _lists(rng, lengths: np.ndarray, make, null: np.ndarray | None = None) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(make(int(offsets[-1]))), mask=None if null is None else pa.array(null)
    )


def ts(us: np.ndarray) -> pa.Array:
    return pa.array(us, pa.timestamp("us", tz="UTC"))


def nulls(mask: np.ndarray, arr: pa.Array) -> pa.Array:
    """arr, null where mask is set."""
    return pc.if_else(pa.array(mask), pa.scalar(None, arr.type), arr)


def pick(options: list[str], idx: np.ndarray) -> pa.Array:
    return pa.array(options).take(pa.array(idx))


def _chunk(rng, first: int, n: int, total: int) -> pa.Table:
    """Traces first .. first+n-1 of total, as one table (sessions never cross a chunk)."""
    whole = -(-n // TURNS) * TURNS  # build whole sessions, cut the last one short
    sess = (first + np.arange(whole)) // TURNS
    turn = np.arange(whole) % TURNS
    # sessions start in order over the week (files are time-ordered, as the writer's are);
    # turns follow each other by 5-90 s
    span = DAYS * DAY_US - 3_600 * 10**6
    start = START_US + ((sess + rng.random(whole)) * span / -(-total // TURNS)).astype(np.int64)
    gaps = rng.integers(5, 90, (whole // TURNS, TURNS)) * 10**6
    received = start + (np.cumsum(gaps, axis=1) - gaps).ravel()
    error = rng.random(whole) < 0.03
    tools = ~error & (rng.random(whole) < 0.10)
    out_len = np.where(error, 0, rng.integers(30, 70, whole))
    # the prompt: the previous turn's prompt and completion (a prefix reference) plus 50 new ids
    before = (np.cumsum(out_len.reshape(-1, TURNS), axis=1) - out_len.reshape(-1, TURNS)).ravel()
    prefix_len = 50 * turn + before
    queue = rng.exponential(5.0, whole)
    ttft = 20 + rng.exponential(60.0, whole)
    itl = 8 + rng.exponential(4.0, whole)

    trace_id = _trace_ids(rng, received)
    session_id = _ids(rng, whole // TURNS, 8, "s-").take(pa.array(np.arange(whole) // TURNS))
    err_idx = rng.integers(0, len(ERRORS), whole)
    topic = pick(TOPICS, rng.integers(0, len(TOPICS), whole))
    user = _text(rng, whole, 34, topic)
    tool_call = pc.binary_join_element_wise(
        '[{"id": "call_',
        _ids(rng, whole, 6, ""),
        '", "type": "function", "function": {"name": "',
        pick(TOOLS, rng.integers(0, len(TOOLS), whole)),
        '", "arguments": "{\\"query\\": \\"',
        _text(rng, whole, 3),
        '\\"}"}}]',
        "",
    )
    cols = {
        "schema_version": pa.array(np.full(whole, SCHEMA_VERSION, np.int16)),
        "trace_id": trace_id,
        "gen_ai_conversation_id": session_id,
        "team": pick(TEAMS, sess % 3),
        "api_key_id": pick([f"key-{t}" for t in TEAMS], sess % 3),
        "gen_ai_operation_name": pick(["chat"], np.zeros(whole, int)),
        "gen_ai_request_model": pick(MODELS, sess % 2),
        "gen_ai_response_model": pick(MODELS, sess % 2),
        "checkpoint_version": pick(
            [f"rl-step-{(c + 1) * 100}" for c in range(CHECKPOINTS)],
            np.minimum((received - START_US) * CHECKPOINTS // span, CHECKPOINTS - 1),
        ),
        "deployment": pick(["pool-a", "pool-b"], sess % 2),
        "worker_id": pick(["w0", "w1", "w2", "w3"], sess % 4),
        "stream": pa.array(rng.random(whole) < 0.7),
        "gen_ai_input_messages": pc.binary_join_element_wise(
            '[{"role": "system", "content": "You are a careful agent. Use the tools when they help."}, '
            '{"role": "user", "content": "',
            user,
            '"}]',
            "",
        ),
        "sampling_params": pick(['{"temperature": 0.7, "max_tokens": 512}', '{"temperature": 1.0}'], sess % 2),
        "response_content": nulls(error | tools, _text(rng, whole, 28)),
        "response_reasoning": nulls(error | (rng.random(whole) > 0.3), _text(rng, whole, 16)),
        "response_tool_calls": nulls(~tools, tool_call),
        "finish_reason": nulls(error, pick(["stop", "tool_calls"], tools.astype(int))),
        "prompt_prefix_trace_id": nulls(turn == 0, pa.concat_arrays([pa.nulls(1, pa.string()), trace_id[:-1]])),
        "prompt_prefix_len": nulls(turn == 0, pa.array(prefix_len.astype(np.int32))),
        "prompt_new_token_ids": _lists(rng, np.full(whole, 50), lambda k: rng.integers(0, 150_000, k, np.int32)),
        "completion_token_ids": _lists(rng, out_len, lambda k: rng.integers(0, 150_000, k, np.int32), error),
        "completion_logprobs": _lists(rng, out_len, lambda k: -rng.exponential(0.3, k).astype(np.float32), error),
        "time_received": ts(received),
        "time_admitted": ts(received + (queue * 1e3).astype(np.int64)),
        "time_first_token": ts(received + ((queue + ttft) * 1e3).astype(np.int64)),
        "time_done": ts(received + ((queue + ttft + itl * out_len) * 1e3).astype(np.int64)),
        "queue_wait_ms": pa.array(queue),
        "ttft_ms": pa.array(ttft),
        "mean_itl_ms": pa.array(itl),
        "gen_ai_usage_input_tokens": pa.array((prefix_len + 50).astype(np.int32)),
        "gen_ai_usage_output_tokens": pa.array(out_len.astype(np.int32)),
        "gen_ai_usage_cache_read_input_tokens": pa.array(prefix_len.astype(np.int32)),
        "http_status": pa.array(np.where(error, np.array([c for _, c in ERRORS])[err_idx], 200).astype(np.int16)),
        "error": nulls(~error, pick([e for e, _ in ERRORS], err_idx)),
        "env_id": pick(ENVS, sess % len(ENVS)),
    }
    table = pa.Table.from_arrays(
        [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(whole, f.type) for f in TRACE_SCHEMA], schema=TRACE_SCHEMA
    )
    return table.slice(0, n)


def generate(root: Path, total: int, chunks_per_file: int, compacted: str | None = None) -> None:
    if compacted == "whole":
        _generate(root, total, 1)
        report = compact(root)
        print(f"compacted: {report['files_in']} files into {report['files_out']}, {report['rows']:,} rows")
    elif compacted == "levels":
        _generate(root, total, 1)
        parts = partitions(root)
        for n, part in enumerate(parts, 1):
            t0 = time.perf_counter()
            merged = _compact_as_written(root, part)
            print(
                f"compacted {part.relative_to(root)} ({n}/{len(parts)}): {merged} merges, "
                f"{len(list(part.glob('*.parquet')))} files now, {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
        t0 = time.perf_counter()
        report = compact_feedback(root)  # each reward's trace's checkpoint looked up (traces/feedback_checkpoints.py)
        took = time.perf_counter() - t0
        print(f"feedback merged: {report['files_in']} files, {report['rows']:,} rows, {took:.1f} s", flush=True)
    else:
        _generate(root, total, chunks_per_file)


def _compact_as_written(root: Path, part: Path) -> int:
    """The partition's files handed back one at a time, oldest first, the gateway's compactor
    looking after each as it does after the mover writes one: a level merges once it holds 8
    files (given all at once, the 40-odd files of a partition would be one merge). Returns the
    merges made."""
    waiting = part.with_name("_waiting-" + part.name)  # outside the partitions glob
    part.rename(waiting)
    part.mkdir()
    merges = 0
    for f in sorted(waiting.glob("*.parquet")):
        f.rename(part / f.name)
        merges += compact_levels(root, part, fanout=8, keep_inputs_s=0)["files_out"]
    waiting.rmdir()
    return merges


def _generate(root: Path, total: int, chunks_per_file: int) -> None:
    rng = np.random.default_rng(0)
    pending: list[dict] = []
    open_files: dict[Path, tuple[pq.ParquetWriter, int]] = {}  # a partition's file: its writer, row groups
    for c, first in enumerate(range(0, total, CHUNK)):
        table = _chunk(rng, first, min(CHUNK, total - first), total)
        day = (pc.cast(table["time_received"], pa.int64()).to_numpy() - START_US) // DAY_US
        model = table["gen_ai_request_model"].to_numpy(zero_copy_only=False)
        for d in np.unique(day):
            for m in MODELS:
                mask = (day == d) & (model == m)
                if mask.any():  # a chunk's rows of a partition are one row group, named like a writer's file
                    date = (np.datetime64("2026-11-24") + int(d)).astype(str)
                    part = root / f"date={date}" / f"model={model_dir(m)}"
                    if part not in open_files:
                        part.mkdir(parents=True, exist_ok=True)
                        path = part / f"bench-{c:05d}.parquet"
                        open_files[part] = (pq.ParquetWriter(path, TRACE_SCHEMA, compression="zstd"), 0)
                    writer, groups = open_files.pop(part)
                    writer.write_table(table.filter(pa.array(mask)), row_group_size=CHUNK)
                    if groups + 1 < chunks_per_file:
                        open_files[part] = (writer, groups + 1)
                    else:
                        writer.close()
        rewarded = table.filter(pa.array(rng.random(table.num_rows) < 0.05)).select(["trace_id", "team", "env_id"])
        rewards = np.round(rng.beta(2, 2, rewarded.num_rows), 3)
        pending += [
            {"trace_id": r["trace_id"], "team": r["team"], "name": "reward", "reward": float(v), "source": f"env:{r['env_id']}"}
            for r, v in zip(rewarded.to_pylist(), rewards)
        ]
        if len(pending) >= 25_000 or first + CHUNK >= total:  # a few large feedback files
            write_feedback(root, pending)
            pending = []
    for writer, _ in open_files.values():
        writer.close()


def ensure_store(root: Path, total: int, chunks_per_file: int, compacted: str | None = None) -> None:
    marker = root / MARKER
    # a whole-compacted store's marker is as it was before levels existed, so those stores are reused
    marked = {"whole": True, "levels": "levels"}
    shape = {"traces": total} | ({"compacted": marked[compacted]} if compacted else {"chunks_per_file": chunks_per_file})
    if marker.exists() and json.loads(marker.read_text()) == {**shape, "complete": True}:
        how = "reusing the store"
    else:
        if marker.exists():
            shutil.rmtree(root)  # ours, but of another size or from an interrupted run
        elif root.exists() and any(root.iterdir()):
            raise SystemExit(f"{root} is not empty and holds no {MARKER}: pick another --dir")
        root.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({**shape, "complete": False}))
        t0 = time.perf_counter()
        generate(root, total, chunks_per_file, compacted)
        marker.write_text(json.dumps({**shape, "complete": True}))
        how = f"generated in {time.perf_counter() - t0:.1f} s"
    files = list(root.rglob("*.parquet"))
    print(
        f"{total:,} traces {how}: {root}, {len(files)} Parquet files, "
        f"{sum(p.stat().st_size for p in files) / 2**20:,.0f} MiB on disk"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/flywheel-ui-bench")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument(
        "--chunks-per-file",
        type=int,
        default=8,
        help="row groups (100k-trace chunks) per file and partition: 8 makes files of ~200 MiB at "
        "100M traces, as the compactor leaves a partition (it merges up to 256 MiB); 1, a file per chunk",
    )
    ap.add_argument(
        "--compact",
        nargs="?",
        const="whole",
        choices=["whole", "levels"],
        help="a file per chunk and partition, as the mover writes them, merged by traces.housekeeping.compact "
        "into a file per partition (whole, the default) or by the gateway's compactor in levels of 8 (levels) "
        "(DuckDB's writer, as in a live store); ignores --chunks-per-file",
    )
    ap.add_argument("--only", default="", help="comma-separated query names to time (default: all), e.g. 'first page,trace(id)'")
    args = ap.parse_args()
    root = Path(args.dir)
    ensure_store(root, args.traces, args.chunks_per_file, args.compact)

    checkpoint = f"rl-step-{CHECKPOINTS // 2 * 100}"
    team = TEAMS[0]
    # a trace and session of that team, taken from the store so a reused one needs no bookkeeping
    probe = Reader(str(root), team, 120).traces(TraceFilters(checkpoint=checkpoint), 0, 1)[0][0]
    day = (np.datetime64("2026-11-24") + DAYS // 2).astype(str)
    F = TraceFilters
    lists = [
        ("first page", F(), 0),
        ("page 10", F(), 10),
        ("checkpoint", F(checkpoint=checkpoint), 0),
        ("model", F(model=MODELS[1]), 0),
        ("one day", F(since=day, until=f"{day}T23:59:59.999999"), 0),
        ("status=error", F(status="error"), 0),
        ("tool calls", F(tools="1"), 0),
        ("reward 0.9-1", F(reward_min="0.9", reward_max="1"), 0),
        (f"q={NEEDLE}", F(q=NEEDLE), 0),
        ("checkpoint + q", F(checkpoint=checkpoint, q=NEEDLE), 0),
    ]
    queries = [(name, True, lambda r, f=f, p=p: len(r.traces(f, p, PAGE)[0])) for name, f, p in lists]
    queries += [
        ("trace(id)", False, lambda r: int(r.trace(probe["trace_id"]) is not None)),
        ("session(id)", False, lambda r: len(r.session(probe["gen_ai_conversation_id"]))),
        ("by_checkpoint", False, lambda r: len(r.by_checkpoint())),
        ("usage", False, lambda r: len(r.usage())),
    ]

    if args.only:
        wanted = {n.strip() for n in args.only.split(",")}
        if unknown := wanted - {name for name, _, _ in queries}:
            raise SystemExit(f"--only: no query named {sorted(unknown)}; the names: {[name for name, _, _ in queries]}")
        queries = [q for q in queries if q[0] in wanted]
    results, list_ms = [], []
    for name, is_list, call in queries:
        for scope in (None, team):
            t0 = time.perf_counter()
            call(Reader(str(root), scope, 120))  # warm-up: page cache, DuckDB's first-use costs, the per-file totals
            first = (time.perf_counter() - t0) * 1e3
            ms = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                rows = call(Reader(str(root), scope, 120))  # a new snapshot, as for each page request
                ms.append((time.perf_counter() - t0) * 1e3)
            results.append((name, scope or "admin", first, pct(ms, 0.5), max(ms), rows, is_list))
            list_ms += ms if is_list else []
            print(f"  {name:<16} {scope or 'admin':<9} {pct(ms, 0.5):8.0f} ms", flush=True)

    print(f"\n{args.traces:,} traces, {args.repeats} repeats, page size {PAGE}; max stands in for p99 at so few")
    print(f"{'query':<16} {'scope':<9} {'first ms':>8} {'p50 ms':>8} {'max ms':>8} {'rows':>6}")
    for name, scope, first, p50, top, rows, _ in results:
        print(f"{name:<16} {scope:<9} {first:8.0f} {p50:8.0f} {top:8.0f} {rows:6d}{'  > 300 ms' if p50 > 300 else ''}")
    pairs = [r for r in results if r[6]]
    if pairs:
        print(
            f"list/filter queries: overall p50 {pct(list_ms, 0.5):.0f} ms against the 300 ms goal "
            f"({sum(1 for r in pairs if r[3] > 300)} of {len(pairs)} query/scope pairs over it)"
        )


if __name__ == "__main__":
    main()
