"""The `flywheel` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from deploy.cli.admin import ckpt_app, keys_app, traces_app
from deploy.cli.batch import batch_app
from deploy.cli.common import ProfileOpt, SetOpt, _config, console
from deploy.cli.loop import demo, loop

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Serve a model, capture every trajectory, train on it, hot-swap it back.")
model_app = typer.Typer(no_args_is_help=True, help="Make models.")
app.add_typer(model_app, name="model")
app.add_typer(keys_app, name="keys")
app.add_typer(traces_app, name="traces")
app.add_typer(ckpt_app, name="checkpoint")
app.add_typer(batch_app, name="batch")
app.command()(demo)
app.command()(loop)


@app.command()
def up(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
       dry_run: bool = typer.Option(False, help="print the resolved config and exit")):
    """Start the local stack (Dynamo frontend, vLLM workers, gateway) and wait until healthy."""
    from deploy.stack.launcher import up as start
    from deploy.stack.processes import StartError

    cfg = _config(profile, set_)
    if dry_run:
        print(cfg.model_dump_json(indent=2))
        return
    try:
        timings = start(cfg)
    except StartError as exc:
        console.print(f"[red]start-up failed:[/] {exc}")
        raise typer.Exit(1)
    gw = cfg.resolved_gateway()
    console.print(f"stack up in {sum(timings.values()):.0f} s: "
                  f"[bold]{gw.url}/v1[/] (models: {', '.join(gw.models)})")


@app.command()
def manifests(profile: str = typer.Option("gb200-nvl72", "--profile", "-p", help="a profile with a [cluster] section"),
              set_: Optional[list[str]] = SetOpt,
              out: Optional[Path] = typer.Option(None, help="write here instead of standard output"),
              check: bool = typer.Option(True, help="validate offline (Kubernetes schemas, the Dynamo "
                                                    "graph schema, Dynamo's and vLLM's own argument parsers)")):
    """Render the Kubernetes manifests (Dynamo operator graph, Mooncake, IMEX domain) for a cluster profile."""
    from deploy.cluster.manifests import render, to_yaml

    cfg = _config(profile, set_)
    try:
        docs = render(cfg)
    except ValueError as exc:
        console.print(f"[red]cannot render {profile}:[/] {exc}")
        raise typer.Exit(2)
    if check:
        from deploy.cluster.manifest_check import K8S_VERSION, validate
        errors = validate(docs)
        for line in errors:
            console.print(f"[red]invalid:[/] {line}")
        if errors:
            raise typer.Exit(1)
        console.print(f"{len(docs)} documents valid (Kubernetes {K8S_VERSION} schemas, strict)")
    text = to_yaml(docs, cfg)
    if out is None:
        print(text, end="")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        console.print(f"wrote {out}")


@app.command()
def down(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Stop exactly the processes `flywheel up` started (by PID file)."""
    from deploy.stack.launcher import down as stop

    stopped = stop(_config(profile, set_))
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@app.command()
def status(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
           as_json: bool = typer.Option(False, "--json", help="machine-readable output")):
    """Each component's URL, PID, health, restarts by the supervisor and last exit reason."""
    from deploy.stack.launcher import status as stack_status

    rows = stack_status(_config(profile, set_))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("component", "pid", "url", "health", "restarts", "last exit")
    for r in rows:
        health = "[green]healthy[/]" if r["healthy"] else ("[yellow]starting[/]" if r["pid"] else "[red]down[/]")
        table.add_row(r["name"], str(r["pid"] or "-"), r["url"] or "-", health, str(r["restarts"]),
                      r["last_exit"] or "-")
    console.print(table)


@app.command()
def sql(query: str = typer.Argument(..., help="DuckDB SQL over the views traces, traces_full, "
                                               "sessions, usage_by_team"),
        profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
        traces_dir: Optional[Path] = typer.Option(None, help="defaults to the profile's trace dir"),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="write here instead of stdout"),
        max_rows: int = typer.Option(50, help="rows to print as a table")):
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
                store.con.execute(f"COPY ({query.strip().rstrip(';')}) TO "
                                  f"'{str(target).replace(chr(39), chr(39) * 2)}' (FORMAT {fmt})")
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


@model_app.command("tiny")
def model_tiny(out_dir: Path, seed: int = typer.Option(0, help="weights seed")):
    """Make the tiny GLM-style Qwen2 model (tokenizer trained here, random weights)."""
    from deploy.models.tiny_model import make_tiny_model

    path = make_tiny_model(out_dir, seed=seed)
    console.print(f"tiny model written to {path}")


@app.command("export")
def export_cmd(kind: str = typer.Argument(..., help="sft | rl | preference"),
               out: Path = typer.Option(..., "--out", "-o", help="dataset directory to write"),
               sql: str = typer.Option(None, help="SELECT over traces picking the trajectories "
                                                  "(default: every successful trace)"),
               reward_name: str = typer.Option("reward", help="which reward joins as `reward`"),
               profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
               traces_dir: Optional[Path] = typer.Option(None)):
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



if __name__ == "__main__":
    app()
