"""Prometheus metrics for one gateway replica (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("flywheel_requests", "requests answered", ["model", "team", "status"], registry=r)
        self.trace_store_errors = Counter(
            "flywheel_trace_store_errors", "responses failed because their trace could not be stored", registry=r
        )
        self.outcomes = Counter(
            "flywheel_outcomes",
            "how attempts at a deployment ended (serve/outcome.py); deployment is empty for requests refused before any",
            ["deployment", "outcome"],
            registry=r,
        )
        self.stream_errors = Counter("flywheel_stream_errors", "streams ended by an error event", ["model"], registry=r)
        self.tokens = Counter("flywheel_tokens", "tokens served", ["team", "kind"], registry=r)
        self.admission_wait = Histogram(
            "flywheel_admission_wait_seconds",
            "time waiting for a lease",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.upstream_latency = Histogram(
            "flywheel_upstream_first_byte_seconds",
            "time to the deployment's response headers",
            ["deployment"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=r,
        )
        first = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.ttft = Histogram(
            "flywheel_ttft_seconds",
            "time to first token as the gateway relays it, "
            "from the request having been read and checked (a unary response: its "
            "whole body)",
            ["deployment"],
            buckets=first,
            registry=r,
        )
        self.added = Histogram(
            "flywheel_added_latency_seconds",
            "of the time to first token, what the "
            "gateway spent before the request went upstream (admission and its "
            "queue, context checks, grammar)",
            ["deployment"],
            buckets=first,
            registry=r,
        )
        self.leases = Gauge("flywheel_leases_held", "leases held on a deployment (all replicas)", ["deployment"], registry=r)
        self.overflow = Counter(
            "flywheel_overflow_requests",
            "requests a dedicated deployment spilled to the serverless deployment of its model",
            ["deployment"],
            registry=r,
        )
        self.shadow_skipped = Counter(
            "flywheel_shadow_skipped", "copies for a shadow arm not sent: too many already running", registry=r
        )
        self.breaker = Gauge("flywheel_breaker_state", "0 closed, 1 half-open, 2 open", ["deployment"], registry=r)
        self._children: dict[tuple, object] = {}

    def _child(self, metric, *labels: str):
        """``metric.labels(*labels)``, kept: prometheus_client checks and locks on every
        ``labels`` call, and a request makes several."""
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[(metric, labels)] = metric.labels(*labels)
        return child

    def outcome(self, deployment: str, outcome: str) -> None:
        self._child(self.outcomes, deployment, outcome).inc()

    def upstream_first_byte(self, deployment: str, seconds: float) -> None:
        self._child(self.upstream_latency, deployment).observe(seconds)

    def served(self, model: str, team: str, usage: dict | None) -> None:
        self._child(self.requests, model, team, "200").inc()
        if usage:
            self._child(self.tokens, team, "input").inc(usage.get("prompt_tokens") or 0)
            self._child(self.tokens, team, "output").inc(usage.get("completion_tokens") or 0)

    def first_token(self, deployment: str, ttft_s: float, added_s: float) -> None:
        self._child(self.ttft, deployment).observe(ttft_s)
        self._child(self.added, deployment).observe(added_s)

    def spilled(self, deployment: str) -> None:
        self._child(self.overflow, deployment).inc()

    def rejected(self, model: str, team: str, status: int) -> None:
        self._child(self.requests, model, team, str(status)).inc()

    def watch_deployments(self, deployments) -> None:
        """Dedicated deployments' replicas and autoscaled changes, read from their table at each
        scrape: the table is shared, so every gateway replica reports the same counts."""
        self.registry.register(_DeploymentCollector(deployments))

    def watch_spool(self, writer) -> None:
        """The trace spool's backlog (durable, not yet in Parquet), read at each scrape."""
        backlog = Gauge(
            "flywheel_trace_spool_backlog_bytes",
            "trace records durable in the spool, not yet converted to Parquet",
            registry=self.registry,
        )
        backlog.set_function(writer.backlog_bytes)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _DeploymentCollector:
    def __init__(self, deployments):
        self.deployments = deployments

    def collect(self):
        replicas = GaugeMetricFamily(
            "flywheel_deployment_replicas", "a dedicated deployment's replicas", labels=["deployment", "state"]
        )
        events = CounterMetricFamily(
            "flywheel_scale_events", "autoscaled replica changes", labels=["deployment", "direction", "reason"]
        )
        for d in self.deployments.table.values():
            for state, n in d.replicas.model_dump().items():
                if n is not None:
                    replicas.add_metric([d.id, state], n)
            for key, n in d.scale_events.items():
                direction, reason = key.split(":", 1)
                events.add_metric([d.id, direction, reason], n)
        yield replicas
        yield events
