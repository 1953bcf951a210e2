"""DuckDB over the trace Parquet files.

The store opens an in-memory DuckDB and defines views over the files; it never owns a database
file, so any number of readers can run while gateways keep writing.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from traces.schema import TRACE_SCHEMA


class TraceStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.con = duckdb.connect(":memory:")
        self.refresh()

    def refresh(self) -> None:
        """(Re)define the views so they see files written since the last call."""
        files = sorted(str(p) for p in self.root.glob("date=*/*.parquet"))
        if files:
            glob = str(self.root / "date=*" / "*.parquet").replace("'", "''")
            source = f"read_parquet('{glob}', hive_partitioning = true, union_by_name = true)"
        else:  # a glob that matches nothing is an error in DuckDB: serve an empty, typed view
            self.con.register("_empty_traces", pa.Table.from_pylist([], schema=TRACE_SCHEMA))
            source = "_empty_traces"
        self.con.execute(f"CREATE OR REPLACE VIEW traces AS SELECT * FROM {source}")

    def sql(self, query: str) -> pa.Table:
        """Run a query and return the result as an Arrow table."""
        rel = self.con.sql(query)
        return rel.to_arrow_table() if rel is not None else pa.table({})

    def count(self) -> int:
        return self.con.execute("SELECT count(*) FROM traces").fetchall()[0][0]
