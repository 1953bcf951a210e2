"""`flywheel up`, `down`, `status`, `manifests` and `model`: the local stack, its cluster
manifests and the models it serves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from deploy.cli.common import ProfileOpt, SetOpt, _config, console

model_app = typer.Typer(no_args_is_help=True, help="Make models.")


def up(
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    dry_run: bool = typer.Option(False, help="print the resolved config and exit"),
):
    """Start the local stack (Dynamo frontend, vLLM workers, gateway) and wait until healthy."""
    from deploy.stack.launcher import up as start
    from deploy.stack.netns import NetnsError
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
    except NetnsError as exc:
        console.print(f"[red]cannot create the hosts:[/] {exc}")
        raise typer.Exit(2)
    gw = cfg.resolved_gateway()
    console.print(f"stack up in {sum(timings.values()):.0f} s: [bold]{gw.url}/v1[/] (models: {', '.join(gw.models)})")


def manifests(
    profile: str = typer.Option("gb200-nvl72", "--profile", "-p", help="a profile with a [cluster] section"),
    set_: Optional[list[str]] = SetOpt,
    out: Optional[Path] = typer.Option(None, help="write here instead of standard output"),
    dedicated: Optional[Path] = typer.Option(
        None, help="the dedicated deployments' desired state (default: the profile's <home>/deployments.json, if any)"
    ),
    check: bool = typer.Option(
        True, help="validate offline (Kubernetes schemas, the Dynamo graph schema, Dynamo's and vLLM's own argument parsers)"
    ),
):
    """Render the Kubernetes manifests (Dynamo operator graph, Mooncake, IMEX domain) for a cluster
    profile, and one Dynamo graph per dedicated deployment."""
    import json

    from deploy.cluster.manifests import render, render_dedicated, to_yaml

    cfg = _config(profile, set_)
    state = dedicated or Path(cfg.resolved_gateway().deployments_file)
    try:
        deployments = list(json.loads(state.read_text()).values()) if state.exists() else []
    except ValueError as exc:
        console.print(f"[red]cannot read {state}:[/] {exc}")
        raise typer.Exit(2)
    if dedicated is not None and not state.exists():
        console.print(f"[red]no such file:[/] {state}")
        raise typer.Exit(2)
    try:
        docs = render(cfg) + render_dedicated(cfg, deployments)
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


def down(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Stop exactly the processes `flywheel up` started (by PID file)."""
    from deploy.stack.launcher import down as stop, running_elsewhere
    from deploy.stack.netns import NetnsError

    cfg = _config(profile, set_)
    try:
        stopped = stop(cfg)
    except NetnsError as exc:
        console.print(f"[red]cannot remove the hosts:[/] {exc}")
        raise typer.Exit(2)
    if stopped:
        console.print(f"stopped: {', '.join(stopped)}")
        return
    others = running_elsewhere(cfg)
    hint = "; ".join(f"profile {name} is up: flywheel down -p {name}" for name in others)
    console.print(f"stopped: nothing was running in {cfg.home_path}" + (f" ({hint})" if hint else ""))


def status(
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
):
    """Each component's URL, PID, health, restarts by the supervisor and last exit reason."""
    from deploy.stack.launcher import status as stack_status

    rows = stack_status(_config(profile, set_))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    hosts = any(r["host"] for r in rows)
    table = Table("component", *(["host"] if hosts else []), "pid", "url", "health", "restarts", "last exit")
    for r in rows:
        health = "[green]healthy[/]" if r["healthy"] else ("[yellow]starting[/]" if r["pid"] else "[red]down[/]")
        where = [r["host"] or "-"] if hosts else []
        table.add_row(r["name"], *where, str(r["pid"] or "-"), r["url"] or "-", health, str(r["restarts"]), r["last_exit"] or "-")
    console.print(table)


@model_app.command("tiny")
def model_tiny(out_dir: Path, seed: int = typer.Option(0, help="weights seed")):
    """Make the tiny GLM-style Qwen2 model (tokenizer trained here, random weights)."""
    from deploy.models.tiny_model import make_tiny_model

    path = make_tiny_model(out_dir, seed=seed)
    console.print(f"tiny model written to {path}")
