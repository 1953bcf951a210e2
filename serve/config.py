"""The gateway process's configuration (one typed model; the launcher fills it from a profile)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from traces.otlp import OtlpConfig


class StrictModel(BaseModel):
    """Configuration (and admin request bodies): an unknown key is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class Deployment(StrictModel):
    """A Dynamo graph that serves models behind one OpenAI-compatible frontend."""

    name: str
    url: str = Field(description="base URL of the deployment's frontend, e.g. http://127.0.0.1:8100")
    admin_urls: list[str] = Field(default_factory=list, description="workers' engine admin servers (LoRA load, weights)")
    max_model_len: int | None = Field(
        None, ge=1, description="the engines' context length: longer requests are refused with a 400 up front"
    )
    model_path: str | None = Field(
        None, description="the checkpoint the workers start on (an in-place reload is checked against it and rolled back to it)"
    )


class ModelRoute(StrictModel):
    """What a public model name (an alias) maps to right now."""

    deployment: str
    fallbacks: list[str] = Field(
        default_factory=list, description="deployments serving the same model, tried in order on failure"
    )
    upstream_model: str = Field(description="model name the deployment serves (base or LoRA)")
    checkpoint_version: str = "base"
    lora_path: str | None = Field(
        None, description="the adapter's directory when upstream_model is a LoRA, so a restarted worker can load it again"
    )
    weight_dir: str | None = Field(
        None,
        description="the full weights reloaded in place into the "
        "deployment, under the adapter for a LoRA "
        "(None: the ones it started on)",
    )
    created: int = Field(
        default_factory=lambda: int(time.time()), description="when the alias last changed what it serves (unix seconds)"
    )
    teams: list[str] | None = Field(
        None, description="the teams that may see and call this alias (a team's own fine-tuned checkpoint); None: every team"
    )

    split: list[Arm] | None = Field(
        None,
        description="a traffic split (serve/split.py): weighted arms, one taken per session (or request); "
        "the fields above are the first arm's",
    )

    def serves(self, team: str, admin: bool = False) -> bool:
        """Whether ``team`` may see and call this alias."""
        return admin or self.teams is None or team in self.teams


class Arm(StrictModel):
    """One arm of an alias's traffic split."""

    route: ModelRoute = Field(description="the route this arm takes, as PUT /admin/models/<alias> takes one")
    weight: float = Field(
        gt=0, le=1, description="its share of sessions (and of requests without one); a shadow's: of requests copied to it"
    )
    name: str = Field(min_length=1, max_length=64, description="recorded in each trace's arm column")
    shadow: bool = Field(False, description="gets a copy of its share of requests: answers traced, never returned")


ModelRoute.model_rebuild()


class ToolsConfig(StrictModel):
    """How tool calls are constrained (see serve/tools/)."""

    layout: Literal["glm47", "glm45"] = Field("glm47", description="GLM tool-call layout the model writes")
    max_string_length: int = Field(4096, description="bound for string arguments the schema leaves unbounded")
    max_array_items: int = Field(256, description="bound for arrays the schema leaves unbounded")
    max_tools: int = Field(128, ge=1, description="tools in one request (OpenAI's limit)")
    max_tools_bytes: int = Field(
        512 << 10, ge=1024, description="the JSON of one request's tools: each new schema costs ~4 ms to check (~6 s per MB)"
    )
    max_schema_depth: int = Field(32, ge=4, description="nesting of the tools' JSON")


class Capacity(StrictModel):
    max_requests: int = Field(64, description="requests in flight on the deployment")
    max_tokens: int = Field(2_000_000, description="worst-case tokens (prompt + max_tokens) in flight")


class AdmissionConfig(StrictModel):
    lease_ttl_s: float = Field(10.0, description="a dead replica's leases lapse after this")
    queue_limit: int = Field(256, description="requests waiting for capacity per deployment and replica")
    max_queue_wait_s: float = Field(5.0, description="then 429 with Retry-After")
    budget_alone_after_s: float = Field(
        3.0,
        gt=0,
        description="with Redis: a replica that lost it spends its share of a team's budget on its own only after this "
        "long (its budget requests wait meanwhile); longer than the 2 s retry, so a timeout on a busy host is tried "
        "again first (the other replicas may still be spending that budget through Redis)",
    )


class BreakerConfig(StrictModel):
    window_s: float = 10.0
    min_requests: int = 5
    error_rate: float = 0.5
    open_s: float = Field(5.0, description="how long an open breaker keeps traffic away")
    probe_timeout_s: float = 30.0
    # With Redis, "closed" as this replica last heard it (from an allow, or the state every
    # outcome it records returns) is trusted this long, so a healthy deployment's requests make
    # no Redis call to be let through; open and half-open are always asked.
    closed_view_s: float = Field(0.25, ge=0)


class Budget(StrictModel):
    tokens: int | None = None
    usd: float | None = None
    period: Literal["day", "month", "total"] = Field(
        "total", description="the spend a limit counts: today's, this month's (UTC) or all of it"
    )

    def ledger(self, team: str, now: float | None = None) -> str:
        """The spend ledger this budget counts now: one per UTC day or month, or one in all."""
        if self.period == "total":
            return team
        day = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
        return f"{team}@{day:%Y-%m-%d}" if self.period == "day" else f"{team}@{day:%Y-%m}"


class TeamLimits(StrictModel):
    """A team's serverless rate limits, as OpenAI's: requests and tokens per minute (a request's
    tokens counted as its prompt plus ``max_tokens`` when it is admitted) and requests at once."""

    rpm: int | None = Field(None, ge=0, description="requests per minute (a sliding 60 s window)")
    tpm: int | None = Field(None, ge=0, description="tokens per minute: prompt + max_tokens, at admission")
    max_concurrent: int | None = Field(None, ge=0, description="requests in flight at once")


class Price(StrictModel):
    """USD per 1M tokens, as `/v1/models` shows it and `/v1/usage` charges it."""

    input_per_mtok: float = Field(0.0, ge=0)
    output_per_mtok: float = Field(0.0, ge=0)
    cached_input_per_mtok: float | None = Field(
        None, ge=0, description="prompt tokens served from the prefix cache; None: the input price"
    )

    batch_discount: float = Field(
        0.0, ge=0, le=1, description="fraction taken off what batch lines cost (0.5: half price), in budgets and /v1/usage"
    )

    replica_hour_usd: float = Field(
        0.0, ge=0, description="a dedicated deployment of this model: USD per replica-hour, idle time included"
    )

    @property
    def cached(self) -> float:
        return self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok


class CapacityPool(StrictModel):
    """The accelerator slots deployments are made of (`local`: the cores vLLM workers may have;
    `sim`: virtual slots). Every deployment, the serverless one included, holds
    ``replicas x slots_per_replica``; a create or scale that does not fit is refused."""

    slots: int | None = Field(None, ge=0, description="slots in all; default: the cores (vLLM) or 16 (mocker)")
    slots_per_replica: int = Field(1, ge=1, description="what one replica of a dedicated deployment holds")
    serverless_slots: int = Field(0, ge=0, description="what the profile's serverless deployment holds (its workers)")
    max_replicas: int = Field(16, ge=1, description="replicas of one dedicated deployment")


class BatchConfig(StrictModel):
    """The Batch API (serve/batch/): limits on an input file, and how lines are scheduled."""

    max_lines: int = Field(50_000, ge=1, description="lines in one batch input file")
    max_file_bytes: int = Field(32 << 20, ge=1, description="size of one uploaded file (also bounded by gateway.max_body_bytes)")
    max_team_bytes: int = Field(
        1 << 30, ge=1, description="a team's uploaded files together: the disk the trace spool needs is not one team's to fill"
    )
    file_ttl_s: float = Field(30 * 86400, gt=0, description="files (uploads, outputs) are deleted this long after they were made")
    concurrency: int = Field(
        4,
        ge=1,
        description="batch lines in flight on this replica while no interactive "
        "request is being served (on the sim profile 4 already matches the direct path's "
        "best throughput)",
    )
    busy_concurrency: int = Field(
        1,
        ge=1,
        description="a model's batch lines in flight on this replica while "
        "interactive requests for it are being served (serve/batch/lanes.py)",
    )
    interactive_hold_s: float = Field(
        2.0,
        gt=0,
        description="a model counts as serving interactive traffic "
        "this long after any replica admitted an interactive request for it",
    )
    share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="of a deployment's capacity.max_requests, the most "
        "batch lines may hold; they never queue for a slot an interactive request waits for",
    )
    chunk_lines: int = Field(64, ge=1, description="lines a replica leases at once")
    lease_ttl_s: float = Field(30.0, gt=0, description="a dead replica's leased lines are taken over after this")
    poll_s: float = Field(0.2, gt=0, description="how often the scheduler looks for work and cancels")
    retry_s: float = Field(0.25, gt=0, description="wait before a line that found no free capacity tries again")


class UIConfig(StrictModel):
    """The trace browser at /ui (serve/ui/)."""

    enabled: bool = True
    session_ttl_s: float = Field(8 * 3600, gt=0, description="a login lasts this long")
    secret_file: str | None = Field(
        None,
        description="signs session cookies (made on first use, mode "
        "0600); replicas sharing it share logins. None: a new secret per "
        "process, so a restart logs everyone out",
    )
    page_size: int = Field(50, ge=1, le=1000, description="traces per page")
    sql_max_rows: int = Field(1000, ge=1, description="rows the SQL console shows (downloads: 1M)")


class QueryConfig(StrictModel):
    """SQL over the trace store (`/v1/traces/query` and the trace browser), run in worker
    processes so that no query can take the gateway's memory or event loop (serve/query_pool.py)."""

    workers: int = Field(2, ge=1, description="queries run at once on this replica; more wait, within their deadline")
    memory_mb: int = Field(
        2048,
        ge=768,
        description="a worker's data segment (RLIMIT_DATA): a query "
        "that needs more is refused with 413, and the gateway is untouched",
    )
    max_result_bytes: int = Field(
        64 << 20,
        ge=1 << 16,
        description="a query's answer (JSON, a page, a download): a longer result is cut and says truncated, or is a 413",
    )
    spill_dir: str | None = Field(
        None,
        description="where DuckDB spills what does not fit its memory; "
        "None: the system's temporary directory, never the trace spool's disk",
    )
    max_spill_mb: int = Field(1024, ge=0, description="the most a query may spill (0: never spill)")
    grace_s: float = Field(2.0, gt=0, description="past the deadline, a worker that has not answered is killed after this")
    niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="the workers' CPU priority below the gateway's (nice): "
        "on a busy host, analytics waits for serving, not serving for analytics",
    )


class GatewayConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = 8000
    keep_alive_s: int = Field(
        75,
        ge=1,
        description="how long an idle client connection is kept open; above the clients' own idle expiry (httpx and "
        "the openai SDK: 5 s) so a client never reuses a connection the gateway is closing (deploy/bench/keepalive.py)",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="names a browser may reach the gateway by, besides loopback and host (a proxy's name; serve/cross_site.py)",
    )
    deployments: list[Deployment] = Field(default_factory=list)
    models: dict[str, ModelRoute] = Field(
        default_factory=dict,
        description="alias -> route (the start value; once an alias moves, routes_file and Redis hold the table)",
    )
    routes_file: str | None = Field(None, description="where the alias table is kept across restarts")
    routes_poll_s: float = Field(0.2, description="with Redis: how often a replica looks for alias changes made through another")
    traces_dir: str = "traces"
    instance: str | None = Field(
        None, description="this replica's name; names its trace spool (must be stable across restarts); default gateway-<port>"
    )
    keys_file: str | None = Field(None, description="hashed API keys (flywheel keys ...)")
    require_api_key: bool = Field(False, description="refuse calls without a valid team key")
    query_timeout_s: float = Field(30.0, gt=0, description="a SQL query's deadline, from its arrival to its whole answer")
    query: QueryConfig = QueryConfig()
    admin_key: str | None = Field(None, description="bearer key for /admin routes; None disables them")
    upstream_timeout_s: float = 600.0
    max_body_bytes: int = Field(
        32 << 20, description="larger request bodies get 413 before they are read (a 140K-token agentic prompt is ~1 MB of JSON)"
    )
    refused_work_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="a team's heavy work (a large body, a new tool list, a long prompt) that ends in a 4xx makes its "
        "next heavy work wait 1/share - 1 times as long as the refused work took (serve/team_turns.py)",
    )
    refusals_per_s: float = Field(
        50.0,
        ge=0,
        description="a caller's 4xx answers beyond refusal_burst go out at most this many a second, the rest held "
        "back (at most 5 s): a client looping on bad requests cannot take the event loop (serve/refusal_pace.py); "
        "0: no pacing",
    )
    refusal_burst: int = Field(200, ge=1, description="4xx answers a caller gets at once before refusals_per_s applies")
    tools: ToolsConfig = ToolsConfig()
    redis_url: str | None = Field(None, description="shared state for several replicas; None = one replica")
    capacity: dict[str, Capacity] = Field(default_factory=dict, description="deployment -> capacity")
    admission: AdmissionConfig = AdmissionConfig()
    breaker: BreakerConfig = BreakerConfig()
    budgets: dict[str, Budget] = Field(default_factory=dict, description="team -> spend limit")
    limits: dict[str, TeamLimits] = Field(
        default_factory=dict, description="team -> serverless rate limits (rpm, tpm, max_concurrent)"
    )
    spend_file: str | None = Field(None, description="without Redis: where this replica keeps each team's spend across restarts")
    pool: CapacityPool = CapacityPool()
    deployments_file: str | None = Field(
        None, description="where the dedicated deployments' desired state is kept across restarts (with Redis: shared)"
    )
    prices: dict[str, Price] = Field(default_factory=dict, description="model alias -> price per 1M tokens")
    batch: BatchConfig = BatchConfig()
    ui: UIConfig = UIConfig()
    checkpoints_file: str | None = Field(
        None, description="the checkpoint registry the trace browser shows lineage from (flywheel checkpoint ...)"
    )
    first_token_timeout_s: float = Field(60.0, description="no first byte by then: try the next deployment")
    pause_wait_s: float = Field(
        120.0,
        gt=0,
        description="a pause (a weight reload's, or /pause keep) waits at most this long for adapter requests in "
        "flight to end, holding new ones: Dynamo cannot freeze them (serve/weights.py); then 503, nothing changed",
    )
    trace_flush_batch: int = 10_000
    trace_flush_age_s: float = Field(
        0.1,
        gt=0,
        description="a spool segment is converted to Parquet once this old: a row is queryable about this long "
        "after its answer (p99 under 1 s at 1,000 req/s on sim; 0.25 was not after an up); shorter makes more "
        "files, which trace_compact_fanout merges",
    )
    trace_mover: Literal["process", "thread"] = Field(
        "process", description="convert the spool to Parquet in a child process (off the request core) or a thread"
    )
    trace_compact_fanout: int | None = Field(
        8,
        ge=2,
        description="merge a partition's files as they are written, each level's this many into one of the next, "
        "in the mover's process (traces/compactor.py), yielding to the conversion at idle priority. null (--set ...=null): only "
        "`flywheel traces compact` merges them (a query then opens every file the flush age made)",
    )
    trace_spool_limit_mb: int = Field(
        2048, ge=1, description="spool not yet in Parquet past this: new requests get 503 trace_store_behind"
    )
    otlp: OtlpConfig = OtlpConfig()

    @property
    def instance_name(self) -> str:
        return self.instance or f"gateway-{self.port}"

    @property
    def url(self) -> str:
        """Where clients reach this gateway (an IPv6 address in brackets)."""
        return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"

    def deployment(self, name: str) -> Deployment:
        for d in self.deployments:
            if d.name == name:
                return d
        raise KeyError(name)
