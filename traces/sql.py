"""Values written into DuckDB's SQL text where a bound parameter cannot go: the file list of a
``read_parquet`` (its files are opened when the query is bound), a ``SET`` statement's value, the
one SELECT an export takes. Quoted here only, so no caller forgets a quote in a path or a name."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def file_list(files: Iterable[Path | str]) -> str:
    """``files`` as a SQL list of string literals, for ``read_parquet``."""
    return "[" + ", ".join(sql_string(str(f)) for f in files) + "]"
