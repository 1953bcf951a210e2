"""Reading the trace store from object storage (S3 and compatibles).

The Parquet tree is the interface: copy (or write) ``date=*/model=*/*.parquet`` to a bucket and
any engine reads it. DuckDB's own ``httpfs`` extension cannot be installed offline, so here
pyarrow's S3 filesystem does the reading and DuckDB queries the Arrow dataset; with network
access, ``read_parquet('s3://bucket/traces/date=*/model=*/*.parquet', hive_partitioning=true)``
works directly (see README).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from traces.housekeeping import data_files, partitions, visible_files


def s3_filesystem(
    endpoint: str | None = None,
    region: str = "us-east-1",
    access_key: str | None = None,
    secret_key: str | None = None,
    allow_bucket_creation: bool = False,
) -> pafs.S3FileSystem:
    scheme = "http" if endpoint and endpoint.startswith("http://") else "https"
    return pafs.S3FileSystem(
        endpoint_override=endpoint.split("://", 1)[-1] if endpoint else None,
        scheme=scheme,
        region=region,
        access_key=access_key,
        secret_key=secret_key,
        allow_bucket_creation=allow_bucket_creation,
    )


def upload(root: str | Path, fs: pafs.FileSystem, prefix: str) -> int:
    """Copy the local store's Parquet tree under ``prefix`` (bucket/path): not its spool, nor a
    compaction's journal or the inputs it keeps a while beside its output (a reader of the bucket
    would count their rows twice)."""
    local = pafs.LocalFileSystem()
    root = Path(root)
    kept = {f for part in partitions(root) for f in set(data_files(part)) - set(visible_files(part))}
    n = 0
    for info in local.get_file_info(pafs.FileSelector(str(root), recursive=True)):
        rel = Path(info.path).relative_to(root)
        if info.type != pafs.FileType.File or rel.parts[0].startswith("_") or rel.name.startswith((".", "_")):
            continue
        if Path(info.path) in kept:
            continue
        pafs.copy_files(info.path, f"{prefix}/{rel.as_posix()}", source_filesystem=local, destination_filesystem=fs)
        n += 1
    return n


def connect(fs: pafs.FileSystem, prefix: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a ``traces`` view over the objects under ``prefix``."""
    dataset = ds.dataset(prefix, filesystem=fs, format="parquet", partitioning="hive", exclude_invalid_files=True)
    con = duckdb.connect()
    con.register("traces", dataset)
    return con
