"""No SQL a tenant writes can take the gateway's memory, its event loop or its disk: each query
runs in a worker process with a memory cap and a deadline, and its answer is bounded in bytes."""

import asyncio
import json
import os
import time

import pytest

from serve.config import GatewayConfig, QueryConfig
from serve.query_pool import QueryDeadline, QueryPool, QueryTooLarge, QueryWorkerLost
from tests.unit.conftest import seeded_gateway


def rows(n: int) -> str:
    """A CTE ``r(i)`` of ``n`` rows (the sandbox allows no table function such as range())."""
    return f"WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r WHERE i < {n - 1}) "


def q(client, key, sql, **body):
    return client.post("/v1/traces/query", json={"sql": sql, **body}, headers={"Authorization": f"Bearer {key}"})


@pytest.fixture
def small(tmp_path):
    """A gateway whose queries may use 1 GB (DuckDB's pool 320 MB), spill 8 MB, answer 1 MiB
    and take 5 s (at the gateway's own CPU priority: these tests are about the bounds, and a
    niced worker on a busy host could meet the deadline before the bound)."""
    with seeded_gateway(
        tmp_path,
        query_timeout_s=5,
        query=QueryConfig(
            memory_mb=1024, max_result_bytes=1 << 20, max_spill_mb=8, spill_dir=str(tmp_path / "spill"), niceness=0
        ),
    ) as found:
        yield found


def test_a_query_that_builds_gigabytes_is_refused_with_413_and_the_gateway_keeps_serving(small):
    client, keys = small
    # DuckDB's memory_limit does not bound this: in-process it took 5.8 GB and a minute
    r = q(client, keys["red"], "SELECT length(repeat('x', 3000000000)) AS n")
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "query_too_large" and r.json()["error"]["param"] == "sql"
    assert client.get("/health").status_code == 200
    assert q(client, keys["red"], "SELECT count(*) FROM traces").json()["rows"] == [[4]]


def test_an_answer_stops_at_max_result_bytes_and_says_truncated(small):
    client, keys = small
    r = q(client, keys["red"], rows(1000) + "SELECT i, repeat('x', 10000) AS s FROM r")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["truncated"] is True and 0 < body["row_count"] < 1000
    assert body["row_count"] == len(body["rows"]) and len(r.content) <= (1 << 20) + 1024
    assert [row[0] for row in body["rows"]] == list(range(body["row_count"]))


def test_a_single_row_over_max_result_bytes_is_413(small):
    client, keys = small
    r = q(client, keys["red"], "SELECT repeat('x', 2000000) AS s")
    assert r.status_code == 413 and r.json()["error"]["code"] == "query_too_large", r.text


def test_a_query_past_its_deadline_is_408_and_the_next_query_runs(small):
    client, keys = small
    r = q(client, keys["blue"], rows(10**12) + "SELECT sum(i) FROM r")
    assert r.status_code == 408, r.text
    assert q(client, keys["blue"], "SELECT count(*) FROM traces").json()["rows"] == [[2]]


def test_spilling_is_bounded_and_outside_the_store(small, tmp_path):
    client, keys = small
    # a sort of ~400 MB in a 320 MB buffer pool must spill, more than the 8 MB allowed
    r = q(
        client,
        keys["red"],
        "SELECT count(*) FROM (SELECT i, repeat(md5(i::VARCHAR), 3) AS m "
        "FROM (SELECT unnest(generate_series(1, 4000000)) AS i) ORDER BY m)",
    )
    assert r.status_code == 413, r.text
    assert "max_temp_directory_size" in r.json()["error"]["message"]
    assert not list((tmp_path / "traces").rglob("*.tmp")), "spilled into the trace store"


def test_a_gateway_removes_its_workers_spill_folders_and_those_a_killed_one_left(tmp_path):
    spill = tmp_path / "spill"
    (spill / "999999999").mkdir(parents=True)  # a worker of a gateway killed outright (no such PID)
    query = QueryConfig(max_spill_mb=8, spill_dir=str(spill), niceness=0)
    with seeded_gateway(tmp_path, query=query) as (client, keys):
        assert q(client, keys["red"], "SELECT count(*) FROM traces").json()["rows"] == [[4]]
        assert [f.name for f in spill.iterdir()] != ["999999999"]  # the running worker's own only
        assert not (spill / "999999999").exists()
    assert list(spill.iterdir()) == []


def test_values_json_cannot_hold_come_back_as_valid_json(small):
    client, keys = small
    r = q(
        client,
        keys["red"],
        "SELECT 'NaN'::DOUBLE AS a, 'Infinity'::DOUBLE AS b, [-'Infinity'::DOUBLE] AS c, "
        "DATE '0001-01-01' - INTERVAL 1 DAY AS before_year_1, "
        "TIMESTAMP '9999-12-31 23:00:00' + INTERVAL 2 HOUR AS after_9999",
    )
    assert r.status_code == 200, r.text
    row = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))["rows"][0]
    assert row[:3] == ["NaN", "Infinity", ["-Infinity"]]
    assert "0000" in row[3] or "BC" in row[3] and "10000" in row[4]


def test_many_queries_at_once_all_get_an_answer(small):
    """More queries than workers: each waits for a free one, none is lost or mixed up."""
    client, keys = small
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda i: q(client, keys["red" if i % 2 else "blue"], f"SELECT {i} AS i, count(*) AS n FROM traces"), range(16)
            )
        )
    assert [a.json()["rows"] for a in answers] == [[[i, 4 if i % 2 else 2]] for i in range(16)]


# The pool itself: what a worker cannot say for itself.


def _pool(**query) -> QueryPool:
    return QueryPool(QueryConfig(**query), timeout_s=1.0)


def test_a_worker_stuck_past_the_deadline_is_killed_by_pid():
    pool = _pool(grace_s=0.5)

    async def go():
        pid = await pool.run(os.getpid)
        with pytest.raises(QueryDeadline):
            await pool.run(time.sleep, 60)
        return pid, await pool.run(os.getpid)

    try:
        first, after = asyncio.run(go())
    finally:
        pool.close()
    assert first != after, "the stuck worker was given the next query"
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)


def test_a_worker_that_dies_or_runs_out_of_memory_is_a_typed_failure_and_is_replaced():
    pool = _pool(memory_mb=768)

    async def go():
        with pytest.raises(QueryTooLarge):
            await pool.run(bytearray, 3 << 30)
        with pytest.raises(QueryWorkerLost):
            await pool.run(os._exit, 3)
        return await pool.run(sum, [1, 2, 3])

    try:
        assert asyncio.run(go()) == 6
    finally:
        pool.close()


def test_workers_run_below_the_gateways_cpu_priority():
    """On a busy host a heavy query waits for serving, not serving for it."""
    pool = _pool(niceness=7)
    try:
        pid = asyncio.run(pool.run(os.getpid))
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 7
    finally:
        pool.close()


def test_the_query_config_is_typed():
    with pytest.raises(ValueError):
        GatewayConfig(query={"workers": 0})
    with pytest.raises(ValueError):
        GatewayConfig(query={"memroy_mb": 1})


# The trace browser reads through the same workers.


def test_the_sql_console_and_downloads_are_bounded_and_take_every_column_type(small):
    from tests.unit.test_trace_browser_sessions import csrf_of, login

    client, keys = small
    login(client, keys["red"])
    odd = (
        "SELECT INTERVAL 1 DAY AS i, union_value(n := 1) AS u, '101'::BIT AS b, "
        "DATE '0001-01-01' - INTERVAL 1 DAY AS d, [1, 2] AS l"
    )
    for format in ("csv", "parquet"):
        r = client.get("/ui/sql/download", params={"sql": odd, "format": format})
        assert r.status_code == 200, r.text
    csv = client.get("/ui/sql/download", params={"sql": odd, "format": "csv"}).text.splitlines()
    assert csv[0] == '"i","u","b","d","l"' and "0000-12-31" in csv[1] and '"[1, 2]"' in csv[1]
    r = client.post("/ui/sql", data={"csrf": csrf_of(client), "sql": odd})
    assert r.status_code == 200 and "0000-12-31" in r.text
    r = client.get("/ui/sql/download", params={"sql": "SELECT length(repeat('x', 3000000000))"})
    assert r.status_code == 413 and "Query failed" in r.text
    big = rows(200) + "SELECT repeat('x', 10000) AS s FROM r"
    assert client.get("/ui/sql/download", params={"sql": big}).status_code == 413  # 2 MB > 1 MiB
    assert client.get("/ui/traces").status_code == 200


def test_running_out_of_memory_while_rows_stream_out_is_413_not_500():
    """DuckDB's error inside its Arrow stream reaches Python as pyarrow's OSError, its text
    DuckDB's ("Out of Memory Error: ArrowBuffer: failed to allocate 67108864 bytes" when a
    worker at its cap could not grow a batch): test_tenant_harm's attacker got it as a 500."""
    import duckdb

    from serve.trace_query import query_failure
    from traces.store import _snapshot_batches

    def stream(error):
        yield "a batch"
        raise error

    for error, status in (
        (OSError("Out of Memory Error: ArrowBuffer: failed to allocate 67108864 bytes"), 413),
        (OSError("INTERRUPT Error: Interrupted!"), 408),
        (OSError("Invalid Input Error: something else DuckDB said"), 400),
    ):
        batches = _snapshot_batches(stream(error))
        assert next(batches) == "a batch"
        with pytest.raises(duckdb.Error) as raised:
            next(batches)
        assert query_failure(raised.value, 30).status == status, (error, raised.value)
