"""`flywheel checkpoint`: register, list, deploy, split, canary, rollback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from deploy.cli.common import ProfileOpt, SetOpt, _config, console
from deploy.stack.config import StackConfig
from deploy.stack.serverless import serving_deployment

ckpt_app = typer.Typer(no_args_is_help=True, help="Checkpoints: register, list, deploy, split, canary, rollback.")


def _swap(cfg: StackConfig, alias: str | None = None):
    from feedback.hotswap import HotSwap
    from feedback.registry import Registry

    gw = cfg.resolved_gateway()
    registry = Registry(gw.checkpoints_file)
    deployment = serving_deployment(cfg, alias)  # after a blue-green deploy, not the profile's graph
    return registry, HotSwap(gw.url, gw.admin_key, registry, deployment, cfg.worker.served_model_name, cfg.model_path)


StrategyOpt = typer.Option(
    "in-place",
    help="in-place: a LoRA beside the base weights, a full checkpoint "
    "reloaded into the serving workers; blue-green: a new "
    "deployment on the checkpoint (any architecture or size), "
    "the aliases move across, the old one drains and stops",
)


def _check_strategy(strategy: str) -> None:
    if strategy not in ("in-place", "blue-green"):
        console.print(f"[red]--strategy must be in-place or blue-green, not {strategy!r}[/]")
        raise typer.Exit(2)


@ckpt_app.command("register")
def ckpt_register(
    version: str,
    path: Path,
    kind: str = typer.Option("lora", help="lora | full"),
    parent: Optional[str] = typer.Option(None, help="the checkpoint it was trained from"),
    dataset: Optional[Path] = typer.Option(None, help="the export it was trained on"),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
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
        table.add_row(
            c.version, c.kind, c.parent or "-", str(ds.get("rows", "-")), (ds.get("content_hash") or "-")[:12], c.created
        )
    console.print(table)
    alias = cfg.worker.served_model_name
    console.print(f"alias {alias!r} serves {registry.current(alias)}")


@ckpt_app.command("deploy")
def ckpt_deploy(
    version: str,
    alias: Optional[str] = typer.Option(None),
    strategy: str = StrategyOpt,
    dedicated: bool = typer.Option(
        False, "--dedicated", help="on capacity of its own for a team (flywheel deployments), not by moving an alias"
    ),
    replicas: int = typer.Option(1, min=1, help="--dedicated: replicas"),
    team: Optional[str] = typer.Option(None, help="--dedicated: whose deployment (default: the checkpoint's team)"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="--dedicated: show progress until RUNNING"),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Load a checkpoint on every worker, then move the alias to it (a LoRA is loaded beside the
    base weights; a full checkpoint is reloaded in place, pausing the deployment for the reload,
    or started as a new deployment with --strategy blue-green). With --dedicated: a deployment of
    its own (also for a checkpoint the loop registered while its run goes on)."""
    from feedback.hotswap import HotSwapError
    from feedback.registry import Registry, RegistryError

    cfg = _config(profile, set_)
    if dedicated:
        from deploy.cli.deployments import Api, create

        try:
            owner = team or Registry(cfg.resolved_gateway().checkpoints_file).get(version).team
        except RegistryError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(1)
        create(Api(profile, set_, None, None), version, alias, {"replicas": replicas}, owner, wait)
        return
    _check_strategy(strategy)
    _, swap = _swap(cfg, alias)
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


@ckpt_app.command("split")
def ckpt_split(
    arms: list[str] = typer.Argument(..., help="VERSION=WEIGHT for each arm (weights summing to 1), e.g. v3=0.9 v4=0.1"),
    alias: Optional[str] = typer.Option(None),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Serve the alias from several versions at once, each a share of its sessions (sticky per
    session; each trace's `arm` says which): a canary of a LoRA beside the one serving now."""
    from feedback.hotswap import HotSwapError
    from feedback.registry import RegistryError

    weights = {}
    for item in arms:
        version, _, weight = item.partition("=")
        try:
            weights[version] = float(weight)
        except ValueError:
            raise typer.BadParameter(f"{item!r}: give VERSION=WEIGHT, e.g. v4=0.1") from None
    cfg = _config(profile, set_)
    _, swap = _swap(cfg, alias)
    name = alias or cfg.worker.served_model_name
    try:
        swap.split(name, weights)
    except (HotSwapError, RegistryError) as exc:
        console.print(f"[red]split failed:[/] {exc}")
        raise typer.Exit(1)
    console.print(f"{name} -> " + ", ".join(f"{v} {w:.0%}" for v, w in weights.items()))


def _canary_line(version: str, decision) -> str:
    f = decision.figures
    if decision.action == "wait":
        return f"canary {version}: waiting ({decision.reason})"
    from feedback.canary import DONE

    seen = ""
    if f.get("candidate"):
        seen = f"; rewarded baseline {f['baseline']['rewarded']}, candidate {f['candidate']['rewarded']}"
    return f"canary {version}: {DONE[decision.action]}: {decision.reason}{seen}"


def _policy(knob: str) -> str:
    """A canary flag's help, from the policy's own field (its defaults live there alone)."""
    from feedback.canary import CanaryPolicy

    field = CanaryPolicy.model_fields[knob]
    return f"{field.description} (default {field.default})"


@ckpt_app.command("canary")
def ckpt_canary(
    version: Optional[str] = typer.Argument(None, help="the registered checkpoint to release"),
    alias: Optional[str] = typer.Option(None),
    share: Optional[float] = typer.Option(None, help=_policy("share")),
    shadow: bool = typer.Option(False, "--shadow", help=_policy("shadow")),
    metric: Optional[str] = typer.Option(None, help=_policy("metric")),
    min_samples: Optional[int] = typer.Option(None, help=_policy("min_samples")),
    max_regression: Optional[float] = typer.Option(None, help=_policy("max_regression")),
    confidence: Optional[float] = typer.Option(None, help=_policy("confidence")),
    max_hours: Optional[float] = typer.Option(None, help=_policy("max_hours")),
    max_error_increase: Optional[float] = typer.Option(None, help=_policy("max_error_increase")),
    max_ttft_ratio: Optional[float] = typer.Option(None, help=_policy("max_ttft_ratio")),
    interval_s: Optional[float] = typer.Option(None, help=_policy("interval_s")),
    resume: bool = typer.Option(False, "--resume", help="watch the canary running on the alias until it decides"),
    stop: bool = typer.Option(False, "--stop", help="roll the running canary back now"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="watch until the decision (the canary holds its share meanwhile)"),
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Release a checkpoint as a canary: a share of the alias's sessions, promoted to all of them or
    rolled back by itself on the arms' online reward (feedback joined to traces), error rate and
    TTFT. The decision and its figures go in the registry's lineage and on /ui/checkpoints."""
    from pydantic import ValidationError

    from feedback.canary import DONE, CanaryController, CanaryError, CanaryPolicy
    from feedback.hotswap import HotSwapError
    from feedback.registry import RegistryError
    from traces.store import TraceStore

    if (version is None) != (resume or stop) or (resume and stop):
        console.print("[red]give a VERSION to start a canary, or --resume / --stop (no VERSION) for the one running[/]")
        raise typer.Exit(2)
    flags = dict(
        share=share,
        metric=metric,
        min_samples=min_samples,
        max_regression=max_regression,
        confidence=confidence,
        max_hours=max_hours,
        max_error_increase=max_error_increase,
        max_ttft_ratio=max_ttft_ratio,
        interval_s=interval_s,
    )
    try:
        policy = CanaryPolicy.model_validate({k: v for k, v in flags.items() if v is not None} | {"shadow": shadow})
    except ValidationError as exc:
        bad = "; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in exc.errors())
        console.print(f"[red]{bad}[/]")
        raise typer.Exit(2)
    cfg = _config(profile, set_)
    registry, swap = _swap(cfg, alias)
    name = alias or cfg.worker.served_model_name
    controller = CanaryController(swap, registry, TraceStore(cfg.traces_path))
    try:
        if stop:
            running = registry.canaries().get(name, {}).get("candidate")
            console.print(_canary_line(running, controller.stop(name)))
            return
        if version is not None:
            record = controller.start(name, version, policy)
            mode = "a shadow copy of" if policy.shadow else "serving"
            console.print(f"canary {version} on {name}: {mode} {policy.share:.0%} of sessions beside {record['baseline']}")
            if not wait:
                return
        running = registry.canaries().get(name, {}).get("candidate") or version
        if running is None:
            last = [d for d in registry.decisions() if d.get("alias") == name]
            said = f" (the last, {last[-1]['candidate']}, was {DONE[last[-1]['action']]} {last[-1]['decided']})" if last else ""
            console.print(f"[red]no canary is running on {name!r}{said}[/]")
            raise typer.Exit(1)
        decision = controller.watch(name, on_look=lambda d: console.print(_canary_line(running, d)))
    except (CanaryError, HotSwapError, RegistryError) as exc:
        console.print(f"[red]canary failed:[/] {exc}")
        raise typer.Exit(1)
    raise typer.Exit(0 if decision.action == "promote" else 3)


@ckpt_app.command("rollback")
def ckpt_rollback(
    alias: Optional[str] = typer.Option(None),
    strategy: str = StrategyOpt,
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
):
    """Move the alias back to the version it served before."""
    from feedback.hotswap import HotSwapError
    from feedback.registry import RegistryError

    _check_strategy(strategy)
    cfg = _config(profile, set_)
    _, swap = _swap(cfg, alias)
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
