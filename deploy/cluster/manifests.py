"""Kubernetes manifests for a Dynamo graph, rendered from the stack config (`flywheel manifests`).

One document set per profile: an IMEX ComputeDomain (multi-node NVLink inside the NVL72 rack), the
Mooncake store's master (host-DRAM KV tier shared by all workers) and its config, and the Dynamo
operator's DynamoGraphDeployment: KV-routing frontends, a prefill pool and a decode pool of
`dynamo.vllm` workers moving KV over NIXL. `deploy.cluster.manifest_check` validates the result offline.
"""

from __future__ import annotations

import json

import yaml

from deploy.stack.config import ClusterConfig, PoolConfig, StackConfig, mooncake_store_config

MOONCAKE_DIR = "/etc/mooncake"
MOONCAKE_MASTER_PORT = 50051
MOONCAKE_METADATA_PORT = 8080


def nodes(c: ClusterConfig, pool: PoolConfig) -> int:
    return -(-pool.gpus // c.gpus_per_node)


def total_gpus(c: ClusterConfig) -> int:
    return c.prefill.replicas * c.prefill.gpus + c.decode.replicas * c.decode.gpus


def check_shape(c: ClusterConfig) -> None:
    """Refuse shapes the hardware cannot hold, before rendering anything."""
    for name, pool in (("prefill", c.prefill), ("decode", c.decode)):
        if pool.gpus > c.gpus_per_node and pool.gpus % c.gpus_per_node:
            raise ValueError(f"{name}: {pool.gpus} GPUs per worker do not fill whole {c.gpus_per_node}-GPU nodes")
    if total_gpus(c) > c.domain_gpus:
        raise ValueError(f"{total_gpus(c)} GPUs requested; one NVLink domain has {c.domain_gpus}")


def kv_transfer_config(c: ClusterConfig) -> dict:
    """NIXL for prefill -> decode, the Mooncake store as the shared host-DRAM tier behind both."""
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cuda",
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cuda"},
                {
                    "kv_connector": "MooncakeStoreConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"load_async": True},
                },
            ]
        },
    }


def mooncake_config(c: ClusterConfig) -> dict:
    return mooncake_store_config(
        f"{c.name}-mooncake-master.{c.namespace}.svc.cluster.local",
        MOONCAKE_MASTER_PORT,
        MOONCAKE_METADATA_PORT,
        c.mooncake_protocol,
        f"{c.host_tier_gb}GB",
        "4GB",
    )


def worker_args(cfg: StackConfig, role: str, model: str | None = None, served: str | None = None) -> list[str]:
    """A worker of ``role`` (prefill, decode, or aggregated: a dedicated deployment's, in the
    decode pool's shape, moving no KV) serving ``model`` as ``served`` (default: the cluster's)."""
    c = cfg.cluster
    pool = c.prefill if role == "prefill" else c.decode
    args = ["--model", model or c.model, "--served-model-name", served or cfg.worker.served_model_name]
    if role != "aggregated":
        args += ["--disaggregation-mode", role]
    args += ["--kv-cache-dtype", c.kv_cache_dtype, "--block-size", str(c.block_size), "--enable-prefix-caching"]
    if role != "aggregated":
        args += ["--kv-transfer-config", json.dumps(kv_transfer_config(c), separators=(",", ":"))]
    if pool.parallel == "dep":
        args += ["--data-parallel-size", str(pool.gpus), "--enable-expert-parallel"]
    else:
        args += ["--tensor-parallel-size", str(pool.gpus)]
    if pool.tokens_per_step_per_gpu:
        # DEP: every GPU is its own engine rank with its own scheduler, so the flag is per GPU;
        # TP: one scheduler drives all the worker's GPUs
        per_engine = pool.tokens_per_step_per_gpu * (1 if pool.parallel == "dep" else pool.gpus)
        args += ["--max-num-batched-tokens", str(per_engine)]
    return args


def _env(pairs: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def _worker(cfg: StackConfig, role: str) -> dict:
    c = cfg.cluster
    pool = c.prefill if role == "prefill" else c.decode
    per_node = min(pool.gpus, c.gpus_per_node)
    svc = {
        "componentType": "worker",
        "subComponentType": role,
        "replicas": pool.replicas,
        "resources": {"limits": {"gpu": str(per_node)}, "claims": [{"name": "compute-domain-channel"}]},
        "sharedMemory": {"size": "80Gi"},
        "envs": _env(
            {
                "VLLM_KV_CACHE_LAYOUT": c.kv_layout,
                "MOONCAKE_CONFIG_PATH": f"{MOONCAKE_DIR}/mooncake.json",
                "NCCL_MNNVL_ENABLE": "1",
                "NCCL_CUMEM_ENABLE": "1",
            }
        ),
        "extraPodSpec": {
            "resourceClaims": [{"name": "compute-domain-channel", "resourceClaimTemplateName": f"{c.name}-channel"}],
            "volumes": [{"name": "mooncake", "configMap": {"name": f"{c.name}-mooncake"}}],
            "mainContainer": {
                "image": c.image,
                "workingDir": "/workspace",
                "command": ["python3", "-m", "dynamo.vllm"],
                "args": worker_args(cfg, role),
                "volumeMounts": [{"name": "mooncake", "mountPath": MOONCAKE_DIR, "readOnly": True}],
            },
        },
    }
    if nodes(c, pool) > 1:
        svc["multinode"] = {"nodeCount": nodes(c, pool)}
    if c.hf_token_secret:
        svc["envFromSecret"] = c.hf_token_secret
    return svc


def _frontend(cfg: StackConfig) -> dict:
    c, f = cfg.cluster, cfg.frontend
    args = ["--router-mode", f.router_mode, "--kv-cache-block-size", str(c.block_size)]
    if f.session_affinity_ttl_s:
        args += ["--router-session-affinity-ttl-secs", str(f.session_affinity_ttl_s)]
    return {
        "componentType": "frontend",
        "replicas": c.frontend_replicas,
        "extraPodSpec": {"mainContainer": {"image": c.image, "command": ["python3", "-m", "dynamo.frontend"], "args": args}},
    }


def _mooncake_master(c: ClusterConfig) -> list[dict]:
    labels = {"app.kubernetes.io/name": f"{c.name}-mooncake-master"}
    meta = {"name": f"{c.name}-mooncake-master", "namespace": c.namespace, "labels": labels}
    container = {
        "name": "master",
        "image": c.image,
        "command": ["mooncake_master"],
        "args": [
            f"--rpc_port={MOONCAKE_MASTER_PORT}",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_port={MOONCAKE_METADATA_PORT}",
            "--eviction_high_watermark_ratio=0.9",
        ],
        "ports": [
            {"name": "rpc", "containerPort": MOONCAKE_MASTER_PORT},
            {"name": "metadata", "containerPort": MOONCAKE_METADATA_PORT},
        ],
        "resources": {"requests": {"cpu": "4", "memory": "8Gi"}},
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "selector": labels,
                "ports": [
                    {"name": "rpc", "port": MOONCAKE_MASTER_PORT, "targetPort": "rpc"},
                    {"name": "metadata", "port": MOONCAKE_METADATA_PORT, "targetPort": "metadata"},
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{c.name}-mooncake", "namespace": c.namespace},
            "data": {"mooncake.json": json.dumps(mooncake_config(c), indent=2)},
        },
    ]


def render(cfg: StackConfig) -> list[dict]:
    c = cfg.cluster
    check_shape(c)
    worker_nodes = c.prefill.replicas * nodes(c, c.prefill) + c.decode.replicas * nodes(c, c.decode)
    domain = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": f"{c.name}-domain", "namespace": c.namespace},
        "spec": {"numNodes": worker_nodes, "channel": {"resourceClaimTemplate": {"name": f"{c.name}-channel"}}},
    }
    graph = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": c.name, "namespace": c.namespace, "labels": {"app.kubernetes.io/part-of": "flywheel"}},
        "spec": {
            "backendFramework": "vllm",
            "services": {
                "Frontend": _frontend(cfg),
                "VllmPrefillWorker": _worker(cfg, "prefill"),
                "VllmDecodeWorker": _worker(cfg, "decode"),
            },
        },
    }
    return [domain, *_mooncake_master(c), graph]


def render_dedicated(cfg: StackConfig, deployments: list[dict]) -> list[dict]:
    """One DynamoGraphDeployment per dedicated deployment (the gateway's desired state,
    serve/deployments.py): its own frontend and ``replicas`` aggregated workers of the decode
    pool's shape, serving its checkpoint (a path the workers mount) or the cluster's model, a
    LoRA checkpoint as an adapter over it. Deleted and stopped deployments render nothing."""
    c = cfg.cluster
    docs = []
    for dep in deployments:
        if dep.get("status") in ("DELETING", "STOPPED", "FAILED"):
            continue
        lora = dep.get("lora_path")
        own_weights = dep["checkpoint_version"] != "base" and not lora
        args = worker_args(
            cfg, "aggregated", dep["model_path"] if own_weights else None, dep["served_model"] + ("@base" if lora else "")
        )
        worker = _worker(cfg, "decode")
        worker["replicas"] = dep["replicas"]["desired"]
        worker["extraPodSpec"]["mainContainer"]["args"] = args + (["--enable-lora"] if lora else [])
        if lora:  # loaded through each worker's LoRA route once it is up, as the local supervisor does
            worker["envs"] += _env({"DYN_LORA_ENABLED": "true"})
        worker.pop("subComponentType")
        worker.pop("multinode", None)
        worker["resources"]["limits"]["gpu"] = str(min(c.decode.gpus, c.gpus_per_node))
        frontend = _frontend(cfg)
        frontend["replicas"] = 1
        docs.append(
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "DynamoGraphDeployment",
                "metadata": {
                    "name": f"{c.name}-{dep['id']}",
                    "namespace": c.namespace,
                    "labels": {"app.kubernetes.io/part-of": "flywheel", "flywheel/team": dep["team"] or "shared"},
                    "annotations": {
                        "flywheel/served-model": dep["served_model"],
                        "flywheel/checkpoint-version": dep["checkpoint_version"],
                        **({"flywheel/lora-path": lora} if lora else {}),
                    },
                },
                "spec": {"backendFramework": "vllm", "services": {"Frontend": frontend, "VllmWorker": worker}},
            }
        )
    return docs


def to_yaml(docs: list[dict], cfg: StackConfig) -> str:
    c = cfg.cluster
    head = (
        f"# Rendered by `flywheel manifests -p {cfg.profile}`; edit deploy/stack/profiles/{cfg.profile}.toml, "
        f"not this file.\n# {total_gpus(c)} GPUs: prefill {c.prefill.replicas} x {c.prefill.parallel.upper()}"
        f"{c.prefill.gpus}, decode {c.decode.replicas} x {c.decode.parallel.upper()}{c.decode.gpus} "
        f"(P:D = {c.prefill.replicas}:{c.decode.replicas}).\n"
    )
    return head + yaml.safe_dump_all(docs, sort_keys=False, width=120)
