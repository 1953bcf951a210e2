"""What a data team's SQL may do through the gateway: read the store's views, nothing else.

DuckDB's own parser (``json_serialize_sql``) turns the query into a tree; we accept exactly one
SELECT whose tables are the store's views or its own CTEs, with no table functions
(``read_csv``, ``read_parquet``, ``glob``...) and no other catalog. The connection is locked
down as well (no file access outside the store): the guard is what keeps a team inside its own
rows, the lock is what keeps everyone out of the rest of the machine.
"""

from __future__ import annotations

import json

import duckdb


class QueryRefused(ValueError):
    """The statement is not a plain read of the store's views."""


def check_select(con: duckdb.DuckDBPyConnection, query: str, allowed_tables: set[str]) -> None:
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])
    if tree.get("error"):
        msg = tree.get("error_message", "")
        if "Only SELECT" in msg:
            raise QueryRefused("only SELECT statements are allowed")
        raise QueryRefused(f"could not parse the query: {msg}")
    if len(tree["statements"]) != 1:
        raise QueryRefused("send exactly one statement")
    _walk(tree["statements"][0], allowed_tables, set())


def _walk(node, allowed: set[str], ctes: set[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, allowed, ctes)
        return
    if not isinstance(node, dict):
        return
    cte_map = node.get("cte_map")
    if isinstance(cte_map, dict):
        ctes = ctes | {entry.get("key", "").lower() for entry in cte_map.get("map", [])}
    kind = node.get("type")
    if kind == "SHOW_REF" and node.get("table_name"):  # SHOW TABLES and kin list the whole catalog
        raise QueryRefused(
            f"SHOW lists internal names; the readable views are {sorted(allowed)} (DESCRIBE <view> gives a view's columns)"
        )
    if kind == "FUNCTION" and _internal_function((node.get("function_name") or "").lower()):
        raise QueryRefused(f"{node['function_name']}() reads the server's settings, not the store")
    if kind == "TABLE_FUNCTION":
        fn = (node.get("function") or {}).get("function_name", "?")
        raise QueryRefused(f"table function {fn}() is not allowed; query the views {sorted(allowed)}")
    if kind == "BASE_TABLE":
        name = node.get("table_name", "").lower()
        if node.get("schema_name") or node.get("catalog_name"):
            raise QueryRefused(f"only the store's views are readable, not {name!r} in another schema")
        if name not in allowed and name not in ctes:
            raise QueryRefused(f"unknown table {name!r}; readable views: {sorted(allowed)}")
    for value in node.values():
        if isinstance(value, (dict, list)):
            _walk(value, allowed, ctes)


# Scalar functions that read the server rather than the data: settings name paths on the host
_INTERNAL_FUNCTIONS = {
    "current_setting",
    "getvariable",
    "getenv",
    "which_secret",
    "current_schemas",
    "current_database",
    "current_catalog",
}


def _internal_function(name: str) -> bool:
    return name in _INTERNAL_FUNCTIONS or name.startswith(("duckdb_", "pragma_"))
