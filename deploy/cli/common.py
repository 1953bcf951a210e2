"""What the `flywheel` command modules share: the console, the profile options, config loading."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

from deploy.stack.config import StackConfig, load_config

console = Console()

ProfileOpt = typer.Option(
    "local", "--profile", "-p", envvar="FLYWHEEL_PROFILE", help="deploy/stack/profiles/<name>.toml, or a path to a .toml file"
)
SetOpt = typer.Option(None, "--set", help="override a config key: --set gateway.port=8001")


def _config(profile: str, overrides: Optional[list[str]]) -> StackConfig:
    try:
        return load_config(profile, overrides or [])
    except ValueError as exc:
        console.print(f"[red]config error:[/] {exc}")
        raise typer.Exit(2)
