"""`flywheel keys`, `flywheel traces`, `flywheel checkpoint`: administration commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from deploy.cli.common import ProfileOpt, SetOpt, _config, console
from deploy.stack.config import StackConfig

keys_app = typer.Typer(no_args_is_help=True, help="API keys (stored hashed), one team each.")
traces_app = typer.Typer(no_args_is_help=True, help="Trace store housekeeping.")
ckpt_app = typer.Typer(no_args_is_help=True, help="Checkpoints: register, list, deploy, rollback.")


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
    registry = Registry(gw.checkpoints_file)
    return registry, HotSwap(gw.url, gw.admin_key, registry,
                             cfg.deployment_name, cfg.worker.served_model_name, cfg.model_path)


StrategyOpt = typer.Option("in-place", help="in-place: a LoRA beside the base weights, a full checkpoint "
                                            "reloaded into the serving workers; blue-green: a new "
                                            "deployment on the checkpoint (any architecture or size), "
                                            "the aliases move across, the old one drains and stops")


def _check_strategy(strategy: str) -> None:
    if strategy not in ("in-place", "blue-green"):
        console.print(f"[red]--strategy must be in-place or blue-green, not {strategy!r}[/]")
        raise typer.Exit(2)


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
def ckpt_deploy(version: str, alias: Optional[str] = typer.Option(None), strategy: str = StrategyOpt,
                profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Load a checkpoint on every worker, then move the alias to it (a LoRA is loaded beside the
    base weights; a full checkpoint is reloaded in place, pausing the deployment for the reload,
    or started as a new deployment with --strategy blue-green)."""
    from feedback.hotswap import HotSwapError
    from feedback.registry import RegistryError

    _check_strategy(strategy)
    cfg = _config(profile, set_)
    _, swap = _swap(cfg)
    try:
        if strategy == "blue-green":
            from deploy.stack.bluegreen import BlueGreen
            swap.blue_green(alias or cfg.worker.served_model_name, version, BlueGreen(cfg))
        else:
            swap.deploy(alias or cfg.worker.served_model_name, version)
    except (HotSwapError, RegistryError) as exc:
        console.print(f"[red]deploy failed:[/] {exc}")
        raise typer.Exit(1)
    console.print(f"{alias or cfg.worker.served_model_name} -> {version}")


@ckpt_app.command("rollback")
def ckpt_rollback(alias: Optional[str] = typer.Option(None), strategy: str = StrategyOpt,
                  profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Move the alias back to the version it served before."""
    from feedback.hotswap import HotSwapError
    from feedback.registry import RegistryError

    _check_strategy(strategy)
    cfg = _config(profile, set_)
    _, swap = _swap(cfg)
    try:
        if strategy == "blue-green":
            from deploy.stack.bluegreen import BlueGreen
            target = swap.rollback_blue_green(alias or cfg.worker.served_model_name, BlueGreen(cfg))
        else:
            target = swap.rollback(alias or cfg.worker.served_model_name)
    except (HotSwapError, RegistryError) as exc:
        console.print(f"[red]rollback failed:[/] {exc}")
        raise typer.Exit(1)
    console.print(f"{alias or cfg.worker.served_model_name} -> {target}")
