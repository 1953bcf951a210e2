"""`flywheel up / status / down`: the local stack as processes under one run directory.

Order: Dynamo frontend (KV router, file discovery) -> dynamo.vllm workers -> gateway. Each step
waits for health with a progress display; if a process dies, the launcher stops what it started
and shows that process's log tail. `up` is idempotent (what runs is left alone) and leaves the
supervisor running (deploy/stack/supervisor.py), which restarts what crashes; `down` stops it first.
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import httpx
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from deploy.stack.adapters import reload_adapters
from deploy.stack import host_tier
from deploy.stack.config import StackConfig
from deploy.stack.event_broker import broker_url
from deploy.stack.processes import Component, ProcessManager, StartError, log_tail
from deploy.stack.slots import worker_index
from deploy.stack.run_state import STATE_FILE, load_state, stack_lock
from serve.config import GatewayConfig
from serve.secret_files import write_private

console = Console(stderr=True)


def dynamo_env(cfg: StackConfig) -> dict[str, str]:
    """Dynamo without etcd/NATS: file discovery, TCP requests, ZMQ events through the stack's
    broker, all on loopback."""
    run = cfg.run_dir
    return {
        "DYN_ZMQ_BROKER_URL": broker_url(*cfg.event_broker_ports),
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(run / f"discovery{cfg.suffix}"),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "HOME": str(run / "home"),  # Dynamo caches under $HOME/.cache/dynamo
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _worker_ready(cfg: StackConfig, listed: bool = True):
    """The worker's own status server says its generate endpoint is up, and (``listed``) the
    frontend lists the model (discovery has propagated), so the first request cannot get a 404.
    A prefill worker alone is never listed: the model appears once a decode worker joins."""

    def check(resp: httpx.Response) -> bool:
        if resp.json().get("endpoints", {}).get("generate") != "ready":
            return False
        if not listed:
            return True
        models = httpx.get(f"{cfg.frontend_url}/v1/models", timeout=2).json().get("data", [])
        return any(m.get("id") == cfg.worker.served_model_name for m in models)

    return check


def components(cfg: StackConfig) -> list[Component]:
    """Everything `up` starts, in order: the stack's shared parts, the serving slot's deployment,
    the gateway."""
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


def deployment_components(cfg: StackConfig) -> list[Component]:
    """One slot's deployment (deploy/stack/slots.py): its event broker, frontend and workers."""
    py, w, sfx = sys.executable, cfg.worker, cfg.suffix
    env = dynamo_env(cfg)
    comps = [
        Component(
            name=f"event-broker{sfx}",
            ports=list(cfg.event_broker_ports),
            argv=[py, "-m", "deploy.stack.event_broker", *map(str, cfg.event_broker_ports)],
        )
    ]
    comps.append(
        Component(
            name=f"frontend{sfx}",
            argv=[
                py,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(cfg.frontend.port),
                "--router-mode",
                cfg.frontend.router_mode,
                "--kv-cache-block-size",
                str(w.block_size),
                *_router_args(cfg),
            ],
            env=env,
            health_url=f"{cfg.frontend_url}/health",
            ports=[cfg.frontend.port],
        )
    )
    for i in range(w.count):
        comps.append(_mocker(cfg, i, env) if w.engine == "mocker" else _vllm_worker(cfg, i, env))
    return comps


def _router_args(cfg: StackConfig) -> list[str]:
    f, args = cfg.frontend, []
    if f.migration_limit:
        args += ["--migration-limit", str(f.migration_limit)]
    if f.overlap_score_credit is not None:
        args += ["--router-kv-overlap-score-credit", str(f.overlap_score_credit)]
    if f.session_affinity_ttl_s:
        args += ["--router-session-affinity-ttl-secs", str(f.session_affinity_ttl_s)]
    return args


def _engine_args(cfg: StackConfig, i: int) -> list[str]:
    """Arguments vLLM and the mocker share: prefill budget, cache size, P/D role."""
    w, args = cfg.worker, []
    if w.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(w.max_num_batched_tokens)]
    if w.num_kv_blocks:
        args += ["--num-gpu-blocks-override", str(w.num_kv_blocks)]
    if w.disaggregated:
        args += ["--disaggregation-mode", "prefill" if is_prefill(cfg, i) else "decode"]
    return args


def is_prefill(cfg: StackConfig, i: int) -> bool:
    return cfg.worker.disaggregated and i < cfg.worker.prefill_count


def _vllm_worker(cfg: StackConfig, i: int, env: dict[str, str]) -> Component:
    w = cfg.worker
    system_port = w.system_port_base + i
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "topic": "",
        "endpoint": f"ipc://{cfg.run_dir}/kv-events-{i}{cfg.suffix}.ipc",
    }
    argv = [
        sys.executable,
        "-m",
        "dynamo.vllm",
        "--model",
        str(cfg.serving_model_path),
        "--served-model-name",
        w.served_model_name,
        "--max-model-len",
        str(w.max_model_len),
        "--dtype",
        "bfloat16",
        "--block-size",
        str(w.block_size),
        "--enable-prefix-caching",
        "--kv-events-config",
        json.dumps(kv_events),
        "--enable-lora",
        "--max-lora-rank",
        str(w.max_lora_rank),
        "--max-loras",
        str(w.max_loras),
        *_engine_args(cfg, i),
    ]
    if w.enforce_eager:
        argv.append("--enforce-eager")
    extra_env = {}
    connectors = []
    if w.disaggregated:
        connectors.append({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})
        # loopback only: UCX, and the NIXL side channel Dynamo would otherwise bind to the
        # address of the outbound interface
        extra_env |= {
            "UCX_NET_DEVICES": "lo",
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "NIXL_PTHR_DELAY_US": str(w.nixl_progress_delay_us),
        }  # deploy/engine/patches.py
    if cfg.host_tier.enabled:
        connectors.append({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"})
        extra_env |= host_tier.worker_env(cfg)
    if connectors:
        kv = (
            connectors[0]
            if len(connectors) == 1
            else {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"connectors": connectors}}
        )
        argv += ["--kv-transfer-config", json.dumps(kv)]
    return Component(
        name=f"worker-{i}{cfg.suffix}",
        argv=argv,
        ports=[system_port],
        env={
            **env,
            "DYN_SYSTEM_PORT": str(system_port),
            "DYN_SYSTEM_ENABLED": "true",
            # one core per engine; the other slot's engines take the other core (two engines
            # bound to one core slowed a blue-green start to a standstill)
            "VLLM_CPU_OMP_THREADS_BIND": str((i + cfg.slot) % 2),
            "VLLM_CPU_KVCACHE_SPACE": str(w.kv_cache_gib),
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(w.nixl_port_base + i),
            "DYN_LORA_ENABLED": "true",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            # the same adapter name with a new path (prime-rl, every step) replaces the weights;
            # without it Dynamo answers "already loaded" and keeps serving the old ones
            "DYN_LORA_HOTSWAP_ENABLED": "true",
            "DYN_LORA_PATH": str(cfg.run_dir / "loras"),
            **extra_env,
        },
        health_url=f"{cfg.worker_admin_url(i)}/health",
        ready=_worker_ready(cfg, listed=not is_prefill(cfg, i)),
    )


def _mocker(cfg: StackConfig, i: int, env: dict[str, str]) -> Component:
    w = cfg.worker
    system_port = w.system_port_base + i
    argv = [
        sys.executable,
        "-m",
        "dynamo.mocker",
        "--model-path",
        str(cfg.serving_model_path),
        "--model-name",
        w.served_model_name,
        "--block-size",
        str(w.block_size),
        "--max-model-len",
        str(w.max_model_len),
        "--speedup-ratio",
        str(w.speedup_ratio),
        "--enable-prefix-caching",
        *_engine_args(cfg, i),
    ]
    return Component(
        name=f"worker-{i}{cfg.suffix}",
        argv=argv,
        ports=[system_port],
        env={**env, "DYN_SYSTEM_PORT": str(system_port), "DYN_SYSTEM_ENABLED": "true"},
        health_url=f"{cfg.worker_admin_url(i)}/health",
        ready=_worker_ready(cfg, listed=not is_prefill(cfg, i)),
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
            if cfg.supervisor.enabled and pm.pid("supervisor") is None:
                pm.start(supervisor_component(cfg), boost=False)
        except BaseException:
            for name in reversed(started):
                pm.stop(name)
            raise
    return timings


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
