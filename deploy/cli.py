"""The `flywheel` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from deploy.config import StackConfig, load_config

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Serve a model, capture every trajectory, train on it, hot-swap it back.")
model_app = typer.Typer(no_args_is_help=True, help="Make models.")
app.add_typer(model_app, name="model")
console = Console()

ProfileOpt = typer.Option("local", "--profile", "-p", envvar="FLYWHEEL_PROFILE",
                          help="deploy/profiles/<name>.toml, or a path to a .toml file")
SetOpt = typer.Option(None, "--set", help="override a config key: --set gateway.port=8001")


def _config(profile: str, overrides: Optional[list[str]]) -> StackConfig:
    try:
        return load_config(profile, overrides or [])
    except ValueError as exc:
        console.print(f"[red]config error:[/] {exc}")
        raise typer.Exit(2)


@app.command()
def up(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
       dry_run: bool = typer.Option(False, help="print the resolved config and exit")):
    """Start the local stack (Dynamo frontend, vLLM workers, gateway) and wait until healthy."""
    from deploy.launcher import up as start
    from deploy.processes import StartError

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
                  f"[bold]http://{gw.host}:{gw.port}/v1[/] (models: {', '.join(gw.models)})")


@app.command()
def down(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Stop exactly the processes `flywheel up` started (by PID file)."""
    from deploy.launcher import down as stop

    stopped = stop(_config(profile, set_))
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@app.command()
def status(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
           as_json: bool = typer.Option(False, "--json", help="machine-readable output")):
    """Each component's URL, PID and health."""
    from deploy.launcher import status as stack_status

    rows = stack_status(_config(profile, set_))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("component", "pid", "url", "health")
    for r in rows:
        health = "[green]healthy[/]" if r["healthy"] else ("[yellow]starting[/]" if r["pid"] else "[red]down[/]")
        table.add_row(r["name"], str(r["pid"] or "-"), r["url"] or "-", health)
    console.print(table)


@app.command()
def sql(query: str = typer.Argument(..., help="DuckDB SQL over the `traces` view"),
        profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
        traces_dir: Optional[Path] = typer.Option(None, help="defaults to the profile's trace dir"),
        max_rows: int = typer.Option(50, help="rows to print")):
    """Run SQL over the captured traces and print a table."""
    import duckdb

    from traces.store import TraceStore

    root = traces_dir or _config(profile, set_).traces_path
    try:
        result = TraceStore(root).sql(query)
    except duckdb.Error as exc:
        console.print(f"[red]SQL error:[/] {exc}")
        raise typer.Exit(1)
    console.print(arrow_table(result, max_rows))


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
    from deploy.tiny_model import make_tiny_model

    path = make_tiny_model(out_dir, seed=seed)
    console.print(f"tiny model written to {path}")


@app.command()
def demo(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
         keep_up: bool = typer.Option(False, help="leave the stack running afterwards")):
    """One turn of the loop: serve -> capture -> export -> fine-tune -> hot-swap -> serve again."""
    from deploy.demo import run_demo

    ok = run_demo(_config(profile, set_), keep_up=keep_up)
    sys.exit(0 if ok else 1)
if __name__ == "__main__":
    app()
