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
keys_app = typer.Typer(no_args_is_help=True, help="API keys (stored hashed), one team each.")
traces_app = typer.Typer(no_args_is_help=True, help="Trace store housekeeping.")
ckpt_app = typer.Typer(no_args_is_help=True, help="Checkpoints: register, list, deploy, rollback.")
app.add_typer(ckpt_app, name="checkpoint")
app.add_typer(model_app, name="model")
app.add_typer(keys_app, name="keys")
app.add_typer(traces_app, name="traces")
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
    from deploy.tiny_model import make_tiny_model

    path = make_tiny_model(out_dir, seed=seed)
    console.print(f"tiny model written to {path}")


@app.command()
def demo(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
         turns: int = typer.Option(1, help="turns of the loop to run"),
         seed: int = typer.Option(0, help="task sample and sampling seed"),
         keep_up: bool = typer.Option(False, help="leave the stack running afterwards")):
    """Turns of the loop: eval -> rollouts -> rewards -> export -> fine-tune -> hot-swap -> eval."""
    from deploy.demo import run_demo

    result = run_demo(_config(profile, set_), keep_up=keep_up, turns=turns, seed=seed)
    sys.exit(0 if result["ok"] else 1)


@keys_app.command("create")
def keys_create(team: str = typer.Option(..., help="the team this key bills and sees"),
                name: str = typer.Option("", help="a label, e.g. who holds the key"),
                profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Create a key; the key itself is printed once and never stored."""
    from serve.keys import KeyStore

    try:
        rec, key = KeyStore(_config(profile, set_).resolved_gateway().keys_file).create(team, name)
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2)
    console.print(f"created {rec.id} for team {rec.team!r}; the key (shown once):", style="dim")
    print(key)


@keys_app.command("list")
def keys_list(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Key ids, teams and state (never the keys)."""
    from serve.keys import KeyStore

    table = Table("id", "team", "name", "created", "state")
    for k in KeyStore(_config(profile, set_).resolved_gateway().keys_file).list():
        table.add_row(k.id, k.team, k.name, k.created, "[red]revoked[/]" if k.revoked else "active")
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str, profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Revoke a key by id; gateways refuse it from their next request on."""
    from serve.keys import KeyStore

    try:
        KeyStore(_config(profile, set_).resolved_gateway().keys_file).revoke(key_id)
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/]")
        raise typer.Exit(1)
    console.print(f"revoked {key_id}")



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


def _traces_root(profile: str, set_: Optional[list[str]], traces_dir: Optional[Path]) -> Path:
    return traces_dir or _config(profile, set_).traces_path


TracesDirOpt = typer.Option(None, help="defaults to the profile's trace dir")


@traces_app.command("doctor")
def traces_doctor(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
                  traces_dir: Optional[Path] = TracesDirOpt,
                  as_json: bool = typer.Option(False, "--json")):
    """Spool backlog, file counts, schema versions, anything unreadable. Exit 1 if unhealthy."""
    from traces.housekeeping import doctor

    r = doctor(_traces_root(profile, set_, traces_dir))
    problems = r["unreadable"] + r["interrupted_compactions"] + r["stray_temp_files"]
    if as_json:
        print(json.dumps(r, indent=2))
    else:
        backlog = sum(s["records"] for s in r["spool"].values())
        console.print(f"store {r['root']}: {r['rows']:,} rows in {r['files']} files "
                      f"({r['bytes'] / 1e6:.1f} MB, {r['partitions']} partitions, "
                      f"{r['small_files']} small); schema versions {r['schema_versions']}")
        console.print(f"spool backlog: {backlog} records in "
                      f"{sum(s['segments'] for s in r['spool'].values())} segments "
                      f"({', '.join(r['spool']) or 'no writers'})")
        for p in problems:
            console.print(f"[red]problem:[/] {p}")
        if r["small_files"] > 100:
            console.print("[yellow]many small files: run `flywheel traces compact`[/]")
    raise typer.Exit(1 if problems else 0)


@traces_app.command("compact")
def traces_compact(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
                   traces_dir: Optional[Path] = TracesDirOpt):
    """Merge each partition's small Parquet files into one (safe while gateways write)."""
    from traces.housekeeping import compact

    r = compact(_traces_root(profile, set_, traces_dir))
    console.print(f"compacted {r['files_in']} files into {r['files_out']} "
                  f"({r['rows']:,} rows, {r['partitions']} partitions)")


@traces_app.command("retain")
def traces_retain(days: int = typer.Option(..., help="keep this many days"),
                  profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
                  traces_dir: Optional[Path] = TracesDirOpt):
    """Delete date partitions older than --days."""
    from traces.housekeeping import retain

    removed = retain(_traces_root(profile, set_, traces_dir), days)
    console.print(f"removed {len(removed)} day(s): {', '.join(removed) or '-'}")



def _swap(cfg: StackConfig):
    from feedback.hotswap import HotSwap
    from feedback.registry import Registry

    gw = cfg.resolved_gateway()
    registry = Registry(cfg.home_path / "checkpoints.json")
    return registry, HotSwap(f"http://{gw.host}:{gw.port}", gw.admin_key, registry,
                             gw.deployments[0].name, cfg.worker.served_model_name)


@ckpt_app.command("register")
def ckpt_register(version: str, path: Path, kind: str = typer.Option("lora", help="lora | full"),
                  parent: Optional[str] = typer.Option(None, help="the checkpoint it was trained from"),
                  dataset: Optional[Path] = typer.Option(None, help="the export it was trained on"),
                  profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Register a trained checkpoint with its lineage."""
    from feedback.registry import RegistryError

    cfg = _config(profile, set_)
    registry, _ = _swap(cfg)
    manifest = json.loads((dataset / "manifest.json").read_text()) if dataset else None
    try:
        registry.register(version, kind, path, str(cfg.model_path), parent=parent, dataset=manifest)
    except RegistryError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2)
    console.print(f"registered {version} ({kind}) from {path}")


@ckpt_app.command("list")
def ckpt_list(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Registered checkpoints, their lineage, and what each alias serves."""
    cfg = _config(profile, set_)
    registry, _ = _swap(cfg)
    table = Table("version", "kind", "parent", "dataset rows", "dataset sha256", "created")
    for c in registry.list():
        ds = c.dataset or {}
        table.add_row(c.version, c.kind, c.parent or "-", str(ds.get("rows", "-")),
                      (ds.get("content_hash") or "-")[:12], c.created)
    console.print(table)
    alias = cfg.worker.served_model_name
    console.print(f"alias {alias!r} serves {registry.current(alias)}")


@ckpt_app.command("deploy")
def ckpt_deploy(version: str, alias: Optional[str] = typer.Option(None),
                profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Load a checkpoint on every worker, then move the alias to it."""
    from feedback.hotswap import HotSwapError
    from feedback.registry import RegistryError

    cfg = _config(profile, set_)
    _, swap = _swap(cfg)
    try:
        swap.deploy(alias or cfg.worker.served_model_name, version)
    except (HotSwapError, RegistryError) as exc:
        console.print(f"[red]deploy failed:[/] {exc}")
        raise typer.Exit(1)
    console.print(f"{alias or cfg.worker.served_model_name} -> {version}")


@ckpt_app.command("rollback")
def ckpt_rollback(alias: Optional[str] = typer.Option(None),
                  profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Move the alias back to the version it served before."""
    from feedback.hotswap import HotSwapError
    from feedback.registry import RegistryError

    cfg = _config(profile, set_)
    _, swap = _swap(cfg)
    try:
        target = swap.rollback(alias or cfg.worker.served_model_name)
    except (HotSwapError, RegistryError) as exc:
        console.print(f"[red]rollback failed:[/] {exc}")
        raise typer.Exit(1)
    console.print(f"{alias or cfg.worker.served_model_name} -> {target}")


if __name__ == "__main__":
    app()
