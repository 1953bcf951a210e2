"""`flywheel up / status / down`: the local stack as processes under one run directory.

Order: Dynamo frontend (KV router; file discovery, or etcd on several hosts) -> workers ->
gateway. Each step waits for health with a progress display; if a process dies, the launcher
stops what it started and shows that process's log tail. `up` is idempotent (what runs is left
alone) and leaves the supervisor running (deploy/stack/supervisor.py; one per host on several),
which restarts what crashes; `down` stops it first. On several hosts `up` first creates them
(deploy/stack/netns.py) and `down` removes them last.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from deploy.stack.adapters import reload_adapters
from deploy.stack import host_tier
from deploy.stack.config import PROFILES_DIR, StackConfig, load_config
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.etcd_server import etcd_component
from deploy.stack.graphs import graph_processes
from deploy.stack import netns
from deploy.stack.netns import place
from deploy.stack.processes import Component, ProcessManager, StartError, log_tail
from deploy.stack.reconciler import Reconciler
from deploy.stack.serverless import retired, worker_index
from deploy.stack.run_state import load_state, stack_lock, state_files
from serve.config import GatewayConfig
from serve.secret_files import write_private

console = Console(stderr=True)


def components(cfg: StackConfig) -> list[Component]:
    """Everything `up` starts, in order: the stack's shared parts (etcd on several hosts, Redis,
    the host tier), the profile's serverless graph (unless a blue-green deploy retired it), the
    gateway (one per gateway host)."""
    comps = [etcd_component(cfg)] if cfg.hosts.enabled else []
    if cfg.redis.enabled:
        comps.append(redis_component(cfg))
    if cfg.host_tier.enabled:
        comps += host_tier.host_tier_components(cfg)
    if retired(cfg.run_dir) is None:
        comps += deployment_components(cfg)
    comps += gateway_components(cfg)
    return comps


def redis_component(cfg: StackConfig) -> Component:
    """Redis for the gateways' shared state; on several hosts it listens beyond loopback, so it
    wants the run dir's password, from the 0600 config file `up` writes (not on its command line)."""
    argv = [
        shutil.which("redis-server") or "redis-server",
        *([str(redis_conf(cfg))] if cfg.hosts.enabled else []),
        "--port",
        str(cfg.redis.port),
        "--bind",
        cfg.control_address,
        "--save",
        "",
        "--dir",
        str(cfg.run_dir),
        *(["--appendonly", "yes", "--appendfsync", "everysec"] if cfg.redis.appendonly else ["--appendonly", "no"]),
    ]
    return place(Component(name="redis", ports=[cfg.redis.port], argv=argv), cfg.hosts, cfg.control_host)


def redis_conf(cfg: StackConfig) -> Path:
    return cfg.run_dir / "redis.conf"


def write_redis_conf(cfg: StackConfig) -> None:
    """On several hosts, before anything names Redis: its password (made once for the run dir)
    where Redis reads it; the gateways' configs take it from the run dir."""
    if cfg.redis.enabled:
        write_private(redis_conf(cfg), f"requirepass {cfg.ensure_redis_password()}\n")


def gateway_components(cfg: StackConfig) -> list[Component]:
    """The gateway; on a multi-host profile one replica per gateway host (the first one is
    ``gateway``, the one commands talk to), each with its own trace spool."""
    gw = cfg.resolved_gateway()
    if not cfg.hosts.enabled:
        return [gateway_component(cfg, gw)]
    comps = []
    for i, host in enumerate(cfg.hosts.with_role("gateway")):
        replica = gw.model_copy(update={"host": host.address, "instance": gw.instance or f"gateway-{host.name}"})
        comps.append(place(gateway_component(cfg, replica, "gateway" if i == 0 else f"gateway-{host.name}"), cfg.hosts, host))
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
        address=gw.host,
    )


def ensure_model(cfg: StackConfig) -> None:
    if not (cfg.model_path / "config.json").exists():
        from deploy.models.tiny_model import make_tiny_model

        console.print(f"making the tiny model in {cfg.model_path}")
        make_tiny_model(cfg.model_path, seed=cfg.seed)


def supervisor_components(cfg: StackConfig) -> list[Component]:
    """The supervisor; on several hosts also one per host (a node agent: it restarts what dies
    on its host), the first one then playing the hosts' init (it restarts a host's agent that died
    with its host) and the dedicated deployments' controller."""
    path = cfg.run_dir / "stack.json"
    write_private(path, cfg.anchored().model_dump_json(indent=2))
    argv = [sys.executable, "-m", "deploy.stack.supervisor", "--config", str(path)]
    env = {"PYTHONUNBUFFERED": "1"}
    comps = [Component(name="supervisor", argv=argv, env=env)]
    for host in cfg.hosts.hosts:
        agent = Component(name=f"supervisor-{host.name}", argv=[*argv, "--host", host.name], env=env)
        comps.append(place(agent, cfg.hosts, host))
    return comps


def up(cfg: StackConfig) -> dict[str, float]:
    """Start what is not running and wait until every component is healthy; components that
    already run are left alone, so `up` on a half-dead stack starts only what is missing. Then
    the supervisor keeps them up. Returns seconds each component took to become healthy."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    cfg.ensure_admin_key()
    ensure_model(cfg)
    pm = ProcessManager(cfg.run_dir)
    with stack_lock(cfg.run_dir):
        if cfg.hosts.enabled:
            write_redis_conf(cfg)
            made = netns.create(cfg.hosts)
            if made:
                console.print(f"hosts (network namespaces on {cfg.hosts.bridge}, {cfg.hosts.subnet}): {', '.join(made)}")
        timings, started = start_components(cfg, components(cfg))
        try:
            _reload_adapters(cfg, [n for n in started if n.startswith("worker-")])
            if cfg.supervisor.enabled:
                _start_dedicated(cfg, pm)
            if cfg.supervisor.enabled:
                start_supervisors(cfg, pm)
        except BaseException:
            for name in reversed(started):
                pm.stop(name)
            raise
    return timings


def start_supervisors(cfg: StackConfig, pm: ProcessManager) -> None:
    """Those not running: each host's agent first, so the hosts' init finds them up."""
    for comp in reversed(supervisor_components(cfg)):
        if pm.pid(comp.name) is None:
            pm.start(comp, boost=False)


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
    """Stop the supervisors first (so they restart nothing), then every component `up` started."""
    pm = ProcessManager(cfg.run_dir)
    names = [c.name for c in supervisor_components(cfg)] + [c.name for c in reversed(components(cfg))]
    extra = [p.stem for p in cfg.run_dir.glob("*.pid") if p.stem not in names]
    stopped = [n for n in names + extra if pm.stop(n)]
    for record in state_files(cfg.run_dir):  # the next `up` starts counting afresh
        record.unlink(missing_ok=True)
    if cfg.hosts.enabled:
        netns.remove(cfg.hosts)
    return stopped


def running_elsewhere(cfg: StackConfig) -> list[str]:
    """The stock profiles whose stack has a live process in a home other than ``cfg``'s (one
    name per home): what a `down` that found nothing to stop points to."""
    homes: dict[Path, str] = {}
    for path in sorted(PROFILES_DIR.glob("*.toml")):
        try:
            other = load_config(path.stem)
        except ValueError:
            continue
        run_dir = other.run_dir
        if run_dir == cfg.run_dir or run_dir in homes:
            continue
        pm = ProcessManager(run_dir)
        if any(pm.pid(pid_file.stem) for pid_file in run_dir.glob("*.pid")):
            homes[run_dir] = path.stem
    return list(homes.values())


def status(cfg: StackConfig) -> list[dict]:
    """Each component's PID, URL, health, and what the supervisor did to it."""
    pm = ProcessManager(cfg.run_dir)
    watched = load_state(cfg.run_dir)
    rows = [_row(pm, comp, watched) for comp in components(cfg)]
    for names in graph_processes(cfg.run_dir).values():  # dedicated deployments' (the supervisor's to heal)
        for name in sorted(names):
            pid = pm.pid(name)
            rows.append(
                {
                    "name": name,
                    "host": None,
                    "pid": pid,
                    "url": None,
                    "healthy": pid is not None,
                    "restarts": 0,
                    "last_exit": None if pid else pm.exit_reason(name),
                    "registered_at": None,
                    "log": str(pm.log_file(name)),
                }
            )
    return rows + [_row(pm, comp, watched) for comp in supervisor_components(cfg)]


def _row(pm: ProcessManager, comp: Component, watched: dict) -> dict:
    """A component's status row (one without a health URL or ports, a supervisor, is healthy
    while its process lives)."""
    pid = pm.pid(comp.name)
    healthy = False
    if pid:
        try:
            healthy = pm.check_ready(comp)
        except StartError:
            healthy = False
    seen = watched.get(comp.name, {})
    return {
        "name": comp.name,
        "host": comp.host,
        "pid": pid,
        "url": comp.health_url.rsplit("/", 1)[0] if comp.health_url else None,
        "healthy": healthy,
        "restarts": seen.get("restarts", 0),
        "last_exit": seen.get("last_exit"),
        "registered_at": seen.get("registered_at"),  # a worker: since when the frontend routes to it
        "log": str(pm.log_file(comp.name)),
    }
