"""Data teams query traces over HTTP: their own rows only, and nothing but the store."""

import pytest


def q(client, key, sql):
    return client.post("/v1/traces/query", json={"sql": sql}, headers={"Authorization": f"Bearer {key}"} if key else {})


def test_a_team_key_sees_only_its_own_rows_and_the_admin_sees_all(setup):
    client, keys = setup
    r = q(client, keys["red"], "SELECT team, count(*) AS n FROM traces GROUP BY team")
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [["red", 4]] and r.json()["scope"] == "red"
    r = q(client, keys["admin"], "SELECT team, count(*) FROM traces GROUP BY team ORDER BY team")
    assert r.json()["rows"] == [["blue", 2], ["red", 4]]
    r = q(client, keys["red"], "WITH mine AS (SELECT * FROM traces_full) SELECT count(*) FROM mine LEFT JOIN sessions ON true")
    assert r.status_code == 200 and r.json()["rows"] == [[4]], r.text


@pytest.mark.parametrize(
    "sql",
    [
        "WITH _traces_raw AS (SELECT * FROM _traces_raw) SELECT team, trace_id FROM _traces_raw",
        "WITH RECURSIVE _traces_raw AS (SELECT * FROM _traces_raw) SELECT team, trace_id FROM _traces_raw",
        "SELECT team, trace_id FROM (WITH traces AS (SELECT * FROM _traces_raw) SELECT * FROM traces)",
    ],
)
def test_a_cte_named_after_an_internal_relation_reads_only_the_teams_rows(setup, sql):
    client, keys = setup
    r = q(client, keys["red"], sql)
    if r.status_code == 200:
        assert {row[0] for row in r.json()["rows"]} <= {"red"}, r.text
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == "sql"


def test_max_rows_cuts_the_result_and_says_so(setup):
    client, keys = setup
    r = client.post(
        "/v1/traces/query",
        json={"sql": "SELECT trace_id FROM traces ORDER BY trace_id", "max_rows": 2},
        headers={"Authorization": f"Bearer {keys['admin']}"},
    )
    assert r.json()["rows"] == [["tr-0"], ["tr-1"]] and r.json()["truncated"] is True
    assert r.json()["row_count"] == 2


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM traces",
        "CREATE TABLE x AS SELECT 1",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM traces WHERE trace_id IN (SELECT column0 FROM read_csv('/etc/passwd'))",
        "ATTACH '/tmp/other.db' AS other",
        "COPY (SELECT * FROM traces) TO '/tmp/leak.csv'",
        "SELECT * FROM _traces_raw",
        "SELECT * FROM read_parquet('**/*.parquet')",
        "SELECT 1; SELECT 2",
        "SET enable_external_access = true",
    ],
)
def test_writes_file_access_and_scope_escapes_are_refused_with_400(setup, sql):
    client, keys = setup
    for key in (keys["red"], keys["admin"]):
        r = q(client, key, sql)
        assert r.status_code == 400, (sql, r.text)
        err = r.json()["error"]
        assert err["param"] == "sql" and err["message"]


def test_missing_bad_or_revoked_keys_get_401(setup):
    client, keys = setup
    assert q(client, None, "SELECT 1").status_code == 401
    assert q(client, "fw-not-a-key", "SELECT 1").status_code == 401
    r = q(client, keys["revoked"], "SELECT 1")
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_sql_errors_are_400_not_500(setup):
    client, keys = setup
    r = q(client, keys["red"], "SELECT no_such_column FROM traces")
    assert r.status_code == 400 and "no_such_column" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "sql",
    [
        "SHOW TABLES",
        "SHOW ALL TABLES",
        "SELECT * FROM (SHOW TABLES)",
        "SELECT current_setting('temp_directory')",
        "SELECT current_setting('allowed_directories')",
        "SELECT getvariable('x')",
        "SELECT current_database()",
    ],
)
def test_internal_names_and_server_settings_are_not_readable(setup, sql):
    client, keys = setup
    for key in (keys["red"], keys["admin"]):
        r = q(client, key, sql)
        assert r.status_code == 400 and r.json()["error"]["param"] == "sql", (sql, r.text)


def test_a_view_can_still_be_described(setup):
    client, keys = setup
    r = q(client, keys["red"], "DESCRIBE traces")
    assert r.status_code == 200 and ["trace_id", "VARCHAR"] == r.json()["rows"][1][:2], r.text
