"""`flywheel keys`: API keys (stored hashed), one team each."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from deploy.cli.common import ProfileOpt, SetOpt, _config, console

keys_app = typer.Typer(no_args_is_help=True, help="API keys (stored hashed), one team each.")


@keys_app.command("create")
def keys_create(
    team: str = typer.Option(..., help="the team this key bills and sees"),
    name: str = typer.Option("", help="a label, e.g. who holds the key"),
    scope: Optional[list[str]] = typer.Option(
        None, "--scope", help="inference (the default) and/or deployments (create, scale, delete the team's); repeatable"
    ),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Create a key; the key itself is printed once and never stored."""
    from serve.keys import KeyStore

    try:
        rec, key = KeyStore(_config(profile, set_).resolved_gateway().keys_file).create(team, name, scope)
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2)
    console.print(f"created {rec.id} for team {rec.team!r} ({', '.join(rec.scopes)}); the key (shown once):", style="dim")
    print(key)


@keys_app.command("list")
def keys_list(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Key ids, teams and state (never the keys)."""
    from serve.keys import KeyStore

    table = Table("id", "team", "name", "scopes", "created", "state")
    for k in KeyStore(_config(profile, set_).resolved_gateway().keys_file).list():
        table.add_row(k.id, k.team, k.name, ",".join(k.scopes), k.created, "[red]revoked[/]" if k.revoked else "active")
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
