"""The local stack's configuration: a TOML profile, then ``FLYWHEEL_*`` variables, then flags.

Precedence is the usual one: ``deploy/stack/profiles/<name>.toml`` < environment
(``FLYWHEEL_GATEWAY__PORT=8001``, nested keys joined by ``__``) < ``--set gateway.port=8001``.
This is the only module that reads the environment for configuration; every process gets its
resolved part as JSON from the launcher.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, model_validator

from loop.config import LoopConfig
from serve.config import Deployment, GatewayConfig, ModelRoute, StrictModel
from serve.secret_files import write_private

PROFILES_DIR = Path(__file__).with_name("profiles")


class FrontendConfig(StrictModel):
    port: int = 8100
    event_broker_port: int | None = Field(
        None, description="the event-plane broker's XSUB port (XPUB is the next one); default port + 90"
    )
    router_mode: Literal["kv", "round-robin", "random"] = "kv"
    overlap_score_credit: float | None = Field(
        None,
        description="kv router: weight of cached prefix blocks against queued work (Dynamo's "
        "default 1.0); higher keeps sessions on their cache under load",
    )
    migration_limit: int = Field(
        3,
        ge=0,
        description="Dynamo request migration: a stream cut by a dying worker continues on another this many times (0 = off)",
    )
    session_affinity_ttl_s: int = Field(
        600,
        ge=0,
        le=31_536_000,
        description="keep a session (x-dynamo-session-id, which the gateway sets from X-Session-ID) on "
        "one worker while it is idle for less than this; 0 turns it off. Measured on agentic "
        "replays: 0.83-0.94 of the ideal prefix reuse without it, 0.998-0.999 with it",
    )


class SupervisorConfig(StrictModel):
    """The loop `flywheel up` leaves running: restarts crashed components and workers whose
    discovery registration lapsed (deploy/stack/supervisor.py)."""

    enabled: bool = True
    poll_s: float = Field(1.0, description="how often every component is looked at")
    backoff_initial_s: float = Field(1.0, description="wait before the second restart in a row; doubles")
    backoff_max_s: float = 30.0
    stable_s: float = Field(60.0, description="up this long: the next crash restarts without backoff")
    registration_grace_s: float = Field(
        3.0, description="a worker missing from the frontend's instances this long (after it was listed) is restarted"
    )


class WorkerConfig(StrictModel):
    engine: Literal["vllm", "mocker"] = Field(
        "vllm",
        description="vllm: real vLLM-CPU; mocker: Dynamo's GPU-free engine simulator "
        "(routing, load and fault tests where the model's output does not matter)",
    )
    count: int = 1
    disaggregated: bool = Field(
        False,
        description="the first `prefill_count` workers prefill, the rest "
        "decode; KV moves over NIXL (vLLM's NixlConnector, UCX "
        "on loopback)",
    )
    prefill_count: int = Field(1, ge=1, description="prefill workers when disaggregated")
    max_num_batched_tokens: int | None = Field(None, description="prefill token budget per engine step")
    num_kv_blocks: int | None = Field(
        None, description="override the KV cache size in blocks (to study eviction with a small cache)"
    )
    served_model_name: str = "tiny"
    max_model_len: int = 2048
    kv_cache_gib: int = Field(1, description="VLLM_CPU_KVCACHE_SPACE (whole GiB only)")
    enforce_eager: bool = Field(False, description="skip torch.compile: ~20 s faster start, slower decode")
    system_port_base: int = Field(8200, description="worker i serves its admin API on base + i")
    nixl_port_base: int = 5600
    nixl_progress_delay_us: int = Field(
        100_000,
        ge=0,
        description="disaggregated: NIXL's UCX progress thread waits this long for an "
        "event before it looks again (NIXL's own 0 spins a core per worker)",
    )
    execute_model_timeout_s: int = Field(
        300,
        gt=0,
        description="vLLM: an engine step still running after this is taken for a hang, the engine "
        "exits and the supervisor restarts the worker (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, vLLM's 300 "
        "by default: a long prefill of a big model on CPU takes minutes)",
    )
    block_size: int = Field(32, description="KV block; vLLM-CPU attention needs a multiple of 32")
    speedup_ratio: float = Field(1.0, description="mocker only: simulated time runs this much faster")
    max_lora_rank: int = 16
    max_loras: int = 2


class HostTierConfig(StrictModel):
    """A second KV tier in host DRAM: vLLM's MooncakeStoreConnector over a Mooncake store on
    loopback (TCP). Blocks evicted from a worker's KV cache are loaded back instead of recomputed."""

    enabled: bool = False
    rpc_port: int = 50151
    metadata_port: int = 8180
    metrics_port: int = 9103
    segment_mb: int = Field(256, description="host memory each worker lends to the store")
    local_buffer_mb: int = 64


def mooncake_store_config(master: str, rpc_port: int, metadata_port: int, protocol: str, segment: str, local_buffer: str) -> dict:
    """The file vLLM's MooncakeStoreConnector reads (MOONCAKE_CONFIG_PATH), for the local tier and
    the cluster alike: the master and its HTTP metadata server, the transport, and the host memory
    each worker lends to the store (embedded mode)."""
    return {
        "metadata_server": f"http://{master}:{metadata_port}/metadata",
        "master_server_address": f"{master}:{rpc_port}",
        "protocol": protocol,
        "device_name": "",
        "mode": "embedded",
        "global_segment_size": segment,
        "local_buffer_size": local_buffer,
    }


class RedisConfig(StrictModel):
    enabled: bool = Field(False, description="start a redis-server for the gateway's shared state")
    port: int = 6390
    appendonly: bool = Field(
        True,
        description="keep spend and the alias table across a Redis restart "
        "(append-only file in the run dir, fsync'd every second)",
    )


# a host's network namespace and its veth are both named <bridge>-<host>: 15 bytes at most
BRIDGE_NAME, HOST_NAME = r"^[a-z][a-z0-9]{0,4}$", r"^[a-z][a-z0-9]{0,8}$"


class HostConfig(StrictModel):
    """One host of a multi-host profile: its name, its address on the hosts' subnet, and what runs
    there: ``control`` (etcd, Redis, the event broker, the router frontend), ``worker`` (Dynamo
    workers, spread over the worker hosts in turn), ``gateway`` (one gateway replica each)."""

    name: str = Field(pattern=HOST_NAME)
    address: str
    roles: list[Literal["control", "worker", "gateway"]] = Field(min_length=1)
    slots: int | None = Field(
        None,
        ge=0,
        description="a worker host's slots (the pool's unit): dedicated replicas go to the hosts with the most "
        "free (deploy/stack/placement.py); the pool's slots default to their sum. None: bounded by the pool only",
    )


class HostsConfig(StrictModel):
    """Several hosts, simulated on this machine as Linux network namespaces joined by one bridge
    (deploy/stack/netns.py; `flywheel up` as root creates them, `down` removes them). Empty: one
    host, everything on 127.0.0.1 with Dynamo's file discovery. With hosts, Dynamo discovers over
    etcd on the control host and every component binds its own host's address."""

    subnet: str = Field("10.89.0.0/24", description="the hosts' subnet; the bridge takes its first address")
    bridge: str = Field(
        "fwbr0", pattern=BRIDGE_NAME, description="the bridge joining the hosts (this machine only); names them too"
    )
    etcd_port: int = 2379
    hosts: list[HostConfig] = []

    @model_validator(mode="after")
    def _one_layout(self) -> "HostsConfig":
        if not self.hosts:
            return self
        net = ipaddress.ip_network(self.subnet)
        names, addresses = [h.name for h in self.hosts], [h.address for h in self.hosts]
        problems = []
        if len(set(names)) < len(names) or len(set(addresses)) < len(addresses):
            problems.append("each host needs a name and an address of its own")
        for h in self.hosts:
            ip = ipaddress.ip_address(h.address)
            if ip not in net or ip in (net.network_address, net.broadcast_address, self.bridge_address):
                problems.append(f"host {h.name}: {h.address} is not a host address of {self.subnet} besides the bridge's")
        for role, wanted in (("control", "exactly one"), ("worker", "at least one"), ("gateway", "at least one")):
            n = sum(role in h.roles for h in self.hosts)
            if n == 0 or (role == "control" and n > 1):
                problems.append(f"{wanted} host must have the role {role!r} ({n} have)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.hosts)

    @property
    def bridge_address(self) -> ipaddress.IPv4Address:
        return next(ipaddress.ip_network(self.subnet).hosts())

    def with_role(self, role: str) -> list[HostConfig]:
        return [h for h in self.hosts if role in h.roles]

    @property
    def control(self) -> HostConfig:
        return self.with_role("control")[0]

    def worker_host(self, i: int) -> HostConfig:
        """Worker ``i``'s host: the worker hosts in turn."""
        hosts = self.with_role("worker")
        return hosts[i % len(hosts)]

    @property
    def etcd_url(self) -> str:
        return f"http://{self.control.address}:{self.etcd_port}"


class PoolConfig(StrictModel):
    """One pool of GPU workers (all replicas alike)."""

    replicas: int = Field(ge=0)
    gpus: int = Field(ge=1, description="GPUs per worker (one engine)")
    parallel: Literal["dep", "tp"] = Field(
        description="dep: data-parallel attention + expert-parallel MoE, one engine rank per GPU; "
        "tp: tensor parallel across the worker's GPUs"
    )
    tokens_per_step_per_gpu: int | None = Field(
        None, description="prefill token budget per engine step and GPU (--max-num-batched-tokens)"
    )


class ClusterConfig(StrictModel):
    """A Dynamo graph for Kubernetes (the Dynamo operator's DynamoGraphDeployment), rendered by
    ``flywheel manifests``. Defaults: one GB200 NVL72 rack (72 GPUs, 4 per node)."""

    name: str = Field("flywheel", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str = "flywheel"
    image: str = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1"
    model: str = "deepseek-ai/DeepSeek-V3.2"
    gpus_per_node: int = 4
    domain_gpus: int = Field(72, description="GPUs in one NVLink domain (NVL72)")
    prefill: PoolConfig = PoolConfig(replicas=3, gpus=8, parallel="dep", tokens_per_step_per_gpu=4096)
    decode: PoolConfig = PoolConfig(replicas=12, gpus=4, parallel="tp")
    frontend_replicas: int = 2
    kv_cache_dtype: str = Field("nvfp4_ds_mla", description="NVFP4 latent + FP8 rope: 352-byte MLA rows")
    kv_layout: str = Field("BLHNC", description="VLLM_KV_CACHE_LAYOUT: block-major, few large NIXL transfers")
    block_size: int = 64
    host_tier_gb: int = Field(256, description="host DRAM each worker lends to the Mooncake store")
    mooncake_protocol: Literal["rdma", "tcp"] = "rdma"
    hf_token_secret: str | None = "hf-token-secret"


class DedicatedConfig(StrictModel):
    """Where dedicated deployments' Dynamo graphs listen (deploy/stack/graphs.py): graph k's
    frontend on ``port_base + k * port_step``, its event broker on the next two ports, its
    workers' admin servers after those."""

    port_base: int | None = Field(None, description="default: frontend.port + 2000")
    port_step: int = Field(20, ge=8, description="ports each graph may take (its replicas: this - 3)")
    poll_s: float = Field(1.0, gt=0, description="how often the supervisor reads the desired state and reports")
    drain_timeout_s: float = Field(
        300, gt=0, description="a replica scaled away stops at most this long after it left routing, finished or not"
    )


class StackConfig(StrictModel):
    profile: str = "local"
    home: str = Field(".flywheel", description="run dir, models and traces live under here")
    model_dir: str | None = Field(None, description="defaults to <home>/models/tiny")
    seed: int = 0
    frontend: FrontendConfig = FrontendConfig()
    worker: WorkerConfig = WorkerConfig()
    gateway: GatewayConfig = GatewayConfig()
    redis: RedisConfig = RedisConfig()
    host_tier: HostTierConfig = HostTierConfig()
    supervisor: SupervisorConfig = SupervisorConfig()
    cluster: ClusterConfig = ClusterConfig()
    hosts: HostsConfig = HostsConfig()
    loop: LoopConfig = LoopConfig()
    start_timeout_s: float = 300.0
    core_offset: int = Field(
        0, ge=0, description="set by the supervisor: the core a graph's first vLLM-CPU engine binds to (worker i: the next i)"
    )
    serving_model_dir: str | None = Field(None, description="the checkpoint a graph's workers start on; default model_dir")
    dedicated: DedicatedConfig = DedicatedConfig()
    graph: str | None = Field(
        None, description="set by the supervisor: this config is dedicated deployment <graph>'s (deploy/stack/graphs.py)"
    )
    placement: dict[int, str] = Field(
        {}, description="set by the supervisor: a dedicated graph's worker index -> its host (deploy/stack/placement.py)"
    )

    @property
    def home_path(self) -> Path:
        return Path(self.home).resolve()

    def anchored(self) -> "StackConfig":
        """The same configuration with absolute paths, for a process started in another directory
        (components run with the run dir as their working directory)."""
        return self.model_copy(
            update={"home": str(self.home_path), "model_dir": str(self.model_path) if self.model_dir else None}
        )

    @property
    def run_dir(self) -> Path:
        return self.home_path / "run"

    @property
    def model_path(self) -> Path:
        return Path(self.model_dir).resolve() if self.model_dir else self.home_path / "models" / "tiny"

    @property
    def serving_model_path(self) -> Path:
        return Path(self.serving_model_dir).resolve() if self.serving_model_dir else self.model_path

    @property
    def suffix(self) -> str:
        """Appended to the names of a dedicated graph's processes and files."""
        return f"-{self.graph}" if self.graph else ""

    @property
    def deployment_name(self) -> str:
        return self.graph or "local" + self.suffix

    @property
    def traces_path(self) -> Path:
        return self.home_path / "traces"

    @property
    def event_broker_ports(self) -> tuple[int, int]:
        xsub = self.frontend.event_broker_port or self.frontend.port + 90
        return xsub, xsub + 1

    @property
    def control_host(self) -> HostConfig | None:
        """The host of etcd, Redis, the event broker and the frontend (None: one host)."""
        return self.hosts.control if self.hosts.enabled else None

    def worker_host(self, i: int) -> HostConfig | None:
        """Worker ``i``'s host: where the supervisor placed it, or the worker hosts in turn."""
        if not self.hosts.enabled:
            return None
        if i in self.placement:
            return next(h for h in self.hosts.hosts if h.name == self.placement[i])
        return self.hosts.worker_host(i)

    @property
    def control_address(self) -> str:
        return self.control_host.address if self.control_host else "127.0.0.1"

    def worker_address(self, i: int) -> str:
        host = self.worker_host(i)
        return host.address if host else "127.0.0.1"

    @property
    def frontend_url(self) -> str:
        return f"http://{self.control_address}:{self.frontend.port}"

    def worker_admin_url(self, i: int) -> str:
        return f"http://{self.worker_address(i)}:{self.worker.system_port_base + i}"

    def resolved_gateway(self) -> GatewayConfig:
        """The gateway's config with the local deployment and default alias filled in."""
        gw = self.gateway.model_copy(deep=True)
        gw.traces_dir = str(self.traces_path)
        if self.hosts.enabled:  # the first gateway host's replica is the one commands talk to
            gw.host = self.hosts.with_role("gateway")[0].address
        if gw.admin_key is None:
            gw.admin_key = self.admin_key()
        if self.redis.enabled and gw.redis_url is None:
            password = self.redis_password() if self.hosts.enabled else None
            login = f":{password}@" if password else ""
            gw.redis_url = f"redis://{login}{self.control_address}:{self.redis.port}/0"
        if gw.keys_file is None:
            gw.keys_file = str(self.home_path / "keys.json")
        if gw.routes_file is None:
            gw.routes_file = str(self.home_path / "routes.json")
        if gw.spend_file is None:
            gw.spend_file = str(self.home_path / "spend.json")
        if gw.checkpoints_file is None:
            gw.checkpoints_file = str(self.home_path / "checkpoints.json")
        if gw.deployments_file is None:
            gw.deployments_file = str(self.home_path / "deployments.json")
        host_slots = [h.slots for h in self.hosts.with_role("worker")]
        if gw.pool.slots is None and host_slots and None not in host_slots:
            gw.pool.slots = sum(host_slots)
        if gw.pool.slots is None:  # the cores vLLM workers may have, or the mocker's virtual slots
            gw.pool.slots = 16 if self.worker.engine == "mocker" else os.cpu_count() or 1
        gw.pool.serverless_slots = self.worker.count * gw.pool.slots_per_replica
        gw.pool.max_replicas = min(gw.pool.max_replicas, self.dedicated.port_step - 3)
        if gw.ui.secret_file is None:  # replicas of one stack share logins
            gw.ui.secret_file = str(self.run_dir / "ui-secret")
        if not gw.deployments:  # the profile's own graph; dedicated ones are added at runtime
            gw.deployments = [
                Deployment(
                    name=self.deployment_name,
                    url=self.frontend_url,
                    max_model_len=self.worker.max_model_len,
                    model_path=str(self.serving_model_path),
                    admin_urls=[self.worker_admin_url(i) for i in range(self.worker.count)],
                )
            ]
        if not gw.models:
            name = self.worker.served_model_name
            gw.models = {name: ModelRoute(deployment=self.deployment_name, upstream_model=name)}
        return gw

    @property
    def admin_key_file(self) -> Path:
        return self.run_dir / "admin.key"

    def admin_key(self) -> str | None:
        """The gateway's admin key: from the profile, else the run dir's (None before the first
        `up` made one: reading the configuration writes nothing)."""
        if self.gateway.admin_key:
            return self.gateway.admin_key
        try:
            return self.admin_key_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def ensure_admin_key(self) -> str:
        """The admin key, generated for this run dir (mode 0600 from the first byte) if none."""
        key = self.admin_key()
        if key is None:
            key = _new_secret(self.admin_key_file)
        return key

    @property
    def redis_password_file(self) -> Path:
        """Only on several hosts: Redis then listens beyond loopback and wants a password."""
        return self.run_dir / "redis.password"

    def redis_password(self) -> str | None:
        try:
            return self.redis_password_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def ensure_redis_password(self) -> str:
        return self.redis_password() or _new_secret(self.redis_password_file)


def _new_secret(path: Path) -> str:
    import secrets

    secret = secrets.token_urlsafe(24)
    write_private(path, secret)
    return secret


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _nested(dotted: str, value) -> dict:
    out: dict = {}
    cur = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def load_config(profile: str = "local", overrides: list[str] | None = None, environ: dict[str, str] | None = None) -> StackConfig:
    """Resolve the stack config. ``overrides`` are ``dotted.key=value`` strings (value as JSON
    when it parses, else a string)."""
    path = Path(profile) if profile.endswith(".toml") else PROFILES_DIR / f"{profile}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.toml")))
        raise ValueError(f"unknown profile {profile!r} (known: {known})")
    data = tomllib.loads(path.read_text())
    env = os.environ if environ is None else environ
    for key, value in sorted(env.items()):
        if key.startswith("FLYWHEEL_") and key not in ("FLYWHEEL_PROFILE", "FLYWHEEL_VENV"):
            dotted = key.removeprefix("FLYWHEEL_").lower().replace("__", ".")
            data = _deep_merge(data, _nested(dotted, _parse_value(value)))
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key.path=value")
        dotted, value = item.split("=", 1)
        data = _deep_merge(data, _nested(dotted.strip(), _parse_value(value)))
    try:
        return StackConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_explain(exc)) from None


def config_keys(model: type[BaseModel] = None, prefix: str = "") -> list[str]:
    """Every dotted key the configuration knows (maps such as gateway.budgets are listed as one)."""
    model = model or StackConfig
    keys = []
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            keys += config_keys(sub, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _entry_keys(key: str) -> list[str]:
    """For a key inside a map of settings (``gateway.prices.tiny.output``), the keys that entry
    takes (``gateway.prices.tiny.output_per_mtok`` ...): config_keys lists such a map as one key."""
    parts, model = key.split("."), StackConfig
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return []
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            model = sub
            continue
        value = get_args(sub)[1] if get_origin(sub) is dict else None
        if isinstance(value, type) and issubclass(value, BaseModel) and i + 2 < len(parts):
            return config_keys(value, ".".join(parts[: i + 2]) + ".")
        return []
    return []


def _explain(exc: ValidationError) -> str:
    """Say what is wrong in configuration words: the dotted key, and for a typo the closest key."""
    import difflib

    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(key, config_keys() + _entry_keys(key), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r} (FLYWHEEL_{close[0].upper().replace('.', '__')})?" if close else ""
            lines.append(f"unknown config key {key!r} (from the profile, a FLYWHEEL_* variable or --set){hint}")
        else:
            lines.append(f"{key}: {err['msg']}")
    return "; ".join(lines)
