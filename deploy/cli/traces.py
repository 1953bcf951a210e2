"""`flywheel sql`, `flywheel export` and `flywheel traces`: reading the trace store, and its
housekeeping."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from deploy.cli.common import ProfileOpt, SetOpt, _config, console

traces_app = typer.Typer(no_args_is_help=True, help="Trace store housekeeping.")


def sql(
    query: str = typer.Argument(..., help="DuckDB SQL over the views traces, traces_full, sessions, usage_by_team"),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    traces_dir: Optional[Path] = typer.Option(None, help="defaults to the profile's trace dir"),
    fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write here instead of stdout"),
    max_rows: int = typer.Option(50, help="rows to print as a table"),
):
    """Run SQL over the captured traces: print a table, or write CSV / JSON / Parquet."""
    import duckdb

    from traces.store import TraceStore

    if fmt not in ("table", "csv", "json", "parquet"):
        console.print(f"[red]unknown format {fmt!r}[/] (table, csv, json, parquet)")
        raise typer.Exit(2)
    if fmt == "parquet" and out is None:
        console.print("[red]--format parquet needs --out FILE[/]")
        raise typer.Exit(2)
    root = traces_dir or _config(profile, set_).traces_path
    store = TraceStore(root)
    try:
        if fmt == "table":
            console.print(arrow_table(store.sql(query), max_rows))
        else:  # DuckDB writes the file itself, so lists and timestamps keep their types
            import tempfile

            # (not /dev/stdout: DuckDB would truncate a redirected stdout file)
            with tempfile.TemporaryDirectory() as tmp:
                target = out or Path(tmp) / f"result.{fmt}"
                store.con.execute(
                    f"COPY ({query.strip().rstrip(';')}) TO '{str(target).replace(chr(39), chr(39) * 2)}' (FORMAT {fmt})"
                )
                if out is None:
                    sys.stdout.buffer.write(target.read_bytes())
    except duckdb.Error as exc:
        console.print(f"[red]SQL error:[/] {exc}")
        raise typer.Exit(1)


def arrow_table(result, max_rows: int = 50) -> Table:
    table = Table(*result.column_names, caption=f"{result.num_rows} row(s)")
    for row in result.slice(0, max_rows).to_pylist():
        table.add_row(*[_cell(v) for v in row.values()])
    return table


def _cell(v) -> str:
    text = "NULL" if v is None else str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def export_cmd(
    kind: str = typer.Argument(..., help="sft | rl | preference"),
    out: Path = typer.Option(..., "--out", "-o", help="dataset directory to write"),
    sql: str = typer.Option(None, help="SELECT over traces picking the trajectories (default: every successful trace)"),
    reward_name: str = typer.Option("reward", help="which reward joins as `reward`"),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    traces_dir: Optional[Path] = typer.Option(None),
):
    """Export traces as a Hugging Face dataset (save_to_disk + Parquet + manifest.json)."""
    from feedback.export import DEFAULT_SQL, export
    from traces.store import TraceStore

    store = TraceStore(traces_dir or _config(profile, set_).traces_path)
    try:
        manifest = export(store, kind, out, sql or DEFAULT_SQL, reward_name)
    except ValueError as exc:
        console.print(f"[red]export failed:[/] {exc}")
        raise typer.Exit(1)
    console.print(f"{manifest['rows']} {kind} rows -> {out} (content sha256 {manifest['content_hash'][:16]})")


def _traces_root(profile: str, set_: Optional[list[str]], traces_dir: Optional[Path]) -> Path:
    return traces_dir or _config(profile, set_).traces_path


TracesDirOpt = typer.Option(None, help="defaults to the profile's trace dir")


@traces_app.command("doctor")
def traces_doctor(
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    traces_dir: Optional[Path] = TracesDirOpt,
    as_json: bool = typer.Option(False, "--json"),
):
    """Spool backlog, file counts, schema versions, anything unreadable. Exit 1 if unhealthy."""
    from traces.housekeeping import doctor

    r = doctor(_traces_root(profile, set_, traces_dir))
    problems = r["unreadable"] + r["interrupted_compactions"] + r["stray_temp_files"]
    if as_json:
        print(json.dumps(r, indent=2))
    else:
        backlog = sum(s["records"] for s in r["spool"].values())
        console.print(
            f"store {r['root']}: {r['rows']:,} rows in {r['files']} files "
            f"({r['bytes'] / 1e6:.1f} MB, {r['partitions']} partitions, "
            f"{r['small_files']} small); schema versions {r['schema_versions']}"
        )
        console.print(
            f"spool backlog: {backlog} records in "
            f"{sum(s['segments'] for s in r['spool'].values())} segments "
            f"({', '.join(r['spool']) or 'no writers'})"
        )
        if r["compacting"]:
            console.print("a compaction is under way (its journal and temporary file are not looked at)")
        for p in problems:
            console.print(f"[red]problem:[/] {p}")
        if r["small_files"] > 100:
            console.print("[yellow]many small files: run `flywheel traces compact`[/]")
    raise typer.Exit(1 if problems else 0)


@traces_app.command("compact")
def traces_compact(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt, traces_dir: Optional[Path] = TracesDirOpt):
    """Merge each partition's small Parquet files into one (safe while gateways write)."""
    from traces.housekeeping import compact

    r = compact(_traces_root(profile, set_, traces_dir))
    console.print(f"compacted {r['files_in']} files into {r['files_out']} ({r['rows']:,} rows, {r['partitions']} partitions)")


@traces_app.command("retain")
def traces_retain(
    days: int = typer.Option(..., help="keep this many days"),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    traces_dir: Optional[Path] = TracesDirOpt,
):
    """Delete date partitions older than --days."""
    from traces.housekeeping import retain

    removed = retain(_traces_root(profile, set_, traces_dir), days)
    console.print(f"removed {len(removed)} day(s): {', '.join(removed) or '-'}")
