"""`flywheel up / status / down`: the local stack as processes under one run directory.

Order: Dynamo frontend (KV router, file discovery) -> dynamo.vllm workers -> gateway. Each step
waits for health with a progress display; if a process dies, the launcher stops what it started
and shows that process's log tail. `up` is idempotent (what runs is left alone) and leaves the
supervisor running (deploy/stack/supervisor.py), which restarts what crashes; `down` stops it first.
"""

from __future__ import annotations

import shutil
import sys
import time

import httpx
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from deploy.stack.adapters import reload_adapters
from deploy.stack import host_tier
from deploy.stack.config import StackConfig
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.graphs import graph_processes
from deploy.stack.processes import Component, ProcessManager, StartError, log_tail
from deploy.stack.reconciler import Reconciler
from deploy.stack.serverless import retired, worker_index
from deploy.stack.run_state import STATE_FILE, load_state, stack_lock
from serve.config import GatewayConfig
from serve.secret_files import write_private

console = Console(stderr=True)


def components(cfg: StackConfig) -> list[Component]:
    """Everything `up` starts, in order: the stack's shared parts, the profile's serverless graph
    (unless a blue-green deploy retired it), the gateway."""
    comps = []
    if cfg.redis.enabled:
        comps.append(
            Component(
                name="redis",
                ports=[cfg.redis.port],
                argv=[
                    shutil.which("redis-server") or "redis-server",
                    "--port",
                    str(cfg.redis.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--dir",
                    str(cfg.run_dir),
                    *(["--appendonly", "yes", "--appendfsync", "everysec"] if cfg.redis.appendonly else ["--appendonly", "no"]),
                ],
            )
        )
    if cfg.host_tier.enabled:
        comps += host_tier.host_tier_components(cfg)
    if retired(cfg.run_dir) is None:
        comps += deployment_components(cfg)
    comps.append(gateway_component(cfg, cfg.resolved_gateway()))
    return comps


def gateway_component(cfg: StackConfig, gw: GatewayConfig, name: str = "gateway") -> Component:
    """A gateway process on ``gw`` (written to ``<run>/<name>.json``: it holds the admin key)."""
    gw_path = cfg.run_dir / f"{name}.json"
    write_private(gw_path, gw.model_dump_json(indent=2))
    return Component(
        name=name,
        argv=[sys.executable, "-m", "serve", "--config", str(gw_path)],
        env={"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"},
        health_url=f"{gw.url}/health",
        ports=[gw.port],
    )


def ensure_model(cfg: StackConfig) -> None:
    if not (cfg.model_path / "config.json").exists():
        from deploy.models.tiny_model import make_tiny_model

        console.print(f"making the tiny model in {cfg.model_path}")
        make_tiny_model(cfg.model_path, seed=cfg.seed)


def supervisor_component(cfg: StackConfig) -> Component:
    path = cfg.run_dir / "stack.json"
    write_private(path, cfg.anchored().model_dump_json(indent=2))
    return Component(
        name="supervisor",
        argv=[sys.executable, "-m", "deploy.stack.supervisor", "--config", str(path)],
        env={"PYTHONUNBUFFERED": "1"},
    )


def up(cfg: StackConfig) -> dict[str, float]:
    """Start what is not running and wait until every component is healthy; components that
    already run are left alone, so `up` on a half-dead stack starts only what is missing. Then
    the supervisor keeps them up. Returns seconds each component took to become healthy."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    cfg.ensure_admin_key()
    ensure_model(cfg)
    pm = ProcessManager(cfg.run_dir)
    with stack_lock(cfg.run_dir):
        timings, started = start_components(cfg, components(cfg))
        try:
            _reload_adapters(cfg, [n for n in started if n.startswith("worker-")])
            if cfg.supervisor.enabled:
                _start_dedicated(cfg, pm)
            if cfg.supervisor.enabled and pm.pid("supervisor") is None:
                pm.start(supervisor_component(cfg), boost=False)
        except BaseException:
            for name in reversed(started):
                pm.stop(name)
            raise
    return timings


def _start_dedicated(cfg: StackConfig, pm: ProcessManager) -> None:
    """Start the dedicated deployments' graphs that are not running and tell the gateway what
    runs, so none shows RUNNING from before a `down` (the supervisor carries on from there)."""
    Reconciler(cfg, pm).tick()


def start_components(cfg: StackConfig, comps: list[Component]) -> tuple[dict[str, float], list[str]]:
    """Start those of ``comps`` not running, in order, each waited for until healthy (with a
    progress display); on any failure stop what this call started. Returns seconds to healthy
    per component and the names it started."""
    pm = ProcessManager(cfg.run_dir)
    timings: dict[str, float] = {}
    started: list[str] = []
    try:
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False
        ) as progress:
            for comp in comps:
                t0 = time.monotonic()
                pid = pm.pid(comp.name)
                if pid is None:
                    pm.stop(comp.name, timeout=5)  # whatever a dead one left of its process group
                    task = progress.add_task(f"starting {comp.name}", total=None)
                    pid = pm.start(comp)
                    started.append(comp.name)
                    verb = "ready"
                else:
                    task = progress.add_task(f"{comp.name} already running (pid {pid})", total=None)
                    verb = "already running"
                while not pm.check_ready(comp):
                    if time.monotonic() - t0 > cfg.start_timeout_s:
                        raise StartError(
                            f"{comp.name} not healthy after {cfg.start_timeout_s:.0f} s; "
                            f"processes: {pm.describe_group(comp.name)}; last lines of "
                            f"{pm.log_file(comp.name)}:\n{log_tail(pm.log_file(comp.name))}"
                        )
                    time.sleep(0.5)
                pm.settle(comp.name)
                timings[comp.name] = time.monotonic() - t0
                progress.update(task, description=f"[green]{comp.name}[/] {verb} (pid {pid})", completed=1, total=1)
    except BaseException:
        for name in reversed(started):
            pm.stop(name)
        raise
    return timings, started


def _reload_adapters(cfg: StackConfig, workers: list[str]) -> None:
    """Workers this `up` started have no adapters; the persisted alias table may name some."""
    for name in workers:
        try:
            loaded = reload_adapters(cfg, worker_index(name))
        except (RuntimeError, httpx.HTTPError, ValueError) as exc:
            console.print(f"[yellow]{name}: could not load the alias table's adapters:[/] {exc}")
            continue
        if loaded:
            console.print(f"{name}: loaded {', '.join(loaded)} (named by the alias table)")


def down(cfg: StackConfig) -> list[str]:
    """Stop the supervisor first (so it restarts nothing), then every component `up` started."""
    pm = ProcessManager(cfg.run_dir)
    names = ["supervisor"] + [c.name for c in reversed(components(cfg))]
    extra = [p.stem for p in cfg.run_dir.glob("*.pid") if p.stem not in names]
    stopped = [n for n in names + extra if pm.stop(n)]
    (cfg.run_dir / STATE_FILE).unlink(missing_ok=True)  # the next `up` starts counting afresh
    return stopped


def status(cfg: StackConfig) -> list[dict]:
    """Each component's PID, URL, health, and what the supervisor did to it."""
    pm = ProcessManager(cfg.run_dir)
    watched = load_state(cfg.run_dir)
    rows = []
    for comp in components(cfg):
        pid = pm.pid(comp.name)
        healthy = False
        if pid:
            try:
                healthy = pm.check_ready(comp)
            except StartError:
                healthy = False
        url = comp.health_url.rsplit("/", 1)[0] if comp.health_url else None
        seen = watched.get(comp.name, {})
        rows.append(
            {
                "name": comp.name,
                "pid": pid,
                "url": url,
                "healthy": healthy,
                "restarts": seen.get("restarts", 0),
                "last_exit": seen.get("last_exit"),
                "log": str(pm.log_file(comp.name)),
            }
        )
    for names in graph_processes(cfg.run_dir).values():  # dedicated deployments' (the supervisor's to heal)
        for name in sorted(names):
            pid = pm.pid(name)
            rows.append(
                {
                    "name": name,
                    "pid": pid,
                    "url": None,
                    "healthy": pid is not None,
                    "restarts": 0,
                    "last_exit": None if pid else pm.exit_reason(name),
                    "log": str(pm.log_file(name)),
                }
            )
    sup = pm.pid("supervisor")
    rows.append(
        {
            "name": "supervisor",
            "pid": sup,
            "url": None,
            "healthy": sup is not None,
            "restarts": 0,
            "last_exit": None,
            "log": str(pm.log_file("supervisor")),
        }
    )
    return rows
