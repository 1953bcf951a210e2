"""A team's SQL sandbox holds nothing but that team's rows: no SQL a team key can send, and no
SQL run on the sandbox's connection with the guard bypassed, returns another team's rows."""

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces.feedback import write_feedback
from traces.guard import QueryRefused
from traces.store import TraceStore
from traces.writer import TraceWriter

SECRET = "blue-secret-content"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    writer = TraceWriter(root, "seed")
    for i in range(8):
        team = "red" if i < 3 else "blue"
        writer.submit(
            {
                "trace_id": f"{team}-tr-{i}",
                "team": team,
                "gen_ai_request_model": "tiny",
                "gen_ai_conversation_id": f"{team}-session",
                "http_status": 200,
                "response_content": SECRET if team == "blue" else "red text",
                "prompt_token_ids": [1, 2, 3],
                "completion_token_ids": [i],
            }
        )
    writer.close()
    write_feedback(
        root,
        [
            {"trace_id": "blue-tr-5", "team": "blue", "name": "reward", "reward": 1.0, "comment": SECRET},
            {"trace_id": "red-tr-0", "team": "red", "name": "reward", "reward": 0.5},
        ],
    )
    return root


def leaks(table) -> bool:
    """Does any cell mention the blue team, its traces or its secret?"""
    for column in table.columns:
        for value in column.to_pylist():
            text = str(value)
            if "blue" in text or SECRET in text:
                return True
    return False


ATTACKS = [
    "WITH _traces_raw AS (SELECT * FROM _traces_raw) SELECT * FROM _traces_raw",
    "WITH RECURSIVE _traces_raw AS (SELECT * FROM _traces_raw) SELECT * FROM _traces_raw",
    "WITH t AS MATERIALIZED (SELECT * FROM _traces_raw) SELECT * FROM t",
    "SELECT * FROM (WITH _traces_raw AS (SELECT * FROM _traces_raw) SELECT * FROM _traces_raw)",
    "SELECT * FROM traces UNION ALL SELECT * FROM _traces_raw",
    "SELECT * FROM traces, LATERAL (SELECT * FROM _traces_raw) x",
    "SELECT * FROM _feedback_raw",
    "SELECT * FROM memory.main._traces_raw",
    "SELECT * FROM information_schema.tables",
    "SELECT sql FROM duckdb_views()",
    "SELECT * FROM duckdb_tables()",
    "SUMMARIZE _traces_raw",
    "SUMMARIZE SELECT * FROM _traces_raw",
    "PIVOT _traces_raw ON team USING count(*)",
    "SELECT * FROM query('SELECT * FROM _traces_raw')",
    "SELECT * FROM query_table('_traces_raw')",
    "SELECT * FROM read_parquet('**/*.parquet')",
    "SELECT * FROM parquet_scan('date=*/model=*/*.parquet', hive_partitioning = true)",
    "SELECT * FROM glob('**')",
    "FROM _traces_raw",
    "SELECT * FROM traces_full",
    "SELECT * FROM feedback",
    "SELECT * FROM rewards",
    "SELECT * FROM sessions",
    "SELECT * FROM usage_by_team",
]


@pytest.mark.parametrize("sql", ATTACKS)
def test_no_query_a_team_sends_returns_another_teams_rows(root, sql):
    store = TraceStore(root, team="red")
    try:
        result = store.sql(sql)
    except (QueryRefused, duckdb.Error):
        result = None
    assert result is None or not leaks(result), sql
    # the second wall: the same SQL on the sandbox's own connection, with no guard at all
    try:
        raw = store.con.sql(sql)
        raw = raw.to_arrow_table() if raw is not None else None
    except duckdb.Error:
        raw = None
    assert raw is None or not leaks(raw), f"the connection itself leaks: {sql}"


def test_the_team_still_reads_all_of_its_own_rows_and_feedback(root):
    store = TraceStore(root, team="red")
    assert sorted(store.sql("SELECT trace_id FROM traces").column(0).to_pylist()) == ["red-tr-0", "red-tr-1", "red-tr-2"]
    assert store.sql("SELECT trace_id, reward FROM rewards").to_pylist() == [{"trace_id": "red-tr-0", "reward": 0.5}]
    assert store.sql("SELECT turns FROM sessions").to_pylist() == [{"turns": 3}]
    assert TraceStore(root).sql("SELECT count(*) AS n FROM traces").to_pylist() == [{"n": 8}]


def test_the_sandbox_opens_no_file_at_all(root):
    store = TraceStore(root, team="red")
    for sql in (
        f"SELECT * FROM read_parquet('{root}/**/*.parquet')",
        f"SELECT * FROM read_text('{root}/_spool')",
        "SET enable_external_access = true",
    ):
        with pytest.raises(duckdb.Error):
            store.con.sql(sql).fetchall()


NAMES = st.sampled_from(
    [
        "traces",
        "traces_full",
        "sessions",
        "usage_by_team",
        "feedback",
        "rewards",
        "_traces_raw",
        "_feedback_raw",
        "_empty_traces",
        "information_schema.tables",
        "information_schema.columns",
        "duckdb_views()",
        "duckdb_tables()",
        "memory.main._traces_raw",
        "system.main.duckdb_views()",
    ]
)


@st.composite
def queries(draw, depth=0):
    source = draw(NAMES)
    if depth < 2 and draw(st.booleans()):
        source = f"({draw(queries(depth=depth + 1))}) AS q{depth}"
    shape = draw(st.sampled_from(["plain", "cte", "union", "lateral", "where"]))
    if shape == "cte":
        name = draw(st.sampled_from(["_traces_raw", "traces", "t"]))
        return f"WITH {name} AS (SELECT * FROM {source}) SELECT * FROM {name}"
    if shape == "union":
        return f"SELECT * FROM {source} UNION ALL BY NAME SELECT * FROM {draw(NAMES)}"
    if shape == "lateral":
        return f"SELECT * FROM {source}, LATERAL (SELECT * FROM {draw(NAMES)}) l"
    if shape == "where":
        return f"SELECT * FROM {source} WHERE team <> 'red' OR true"
    return f"SELECT * FROM {source}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=queries())
def test_generated_queries_never_return_another_teams_rows(root, sql):
    test_no_query_a_team_sends_returns_another_teams_rows(root, sql)
