"""Prometheus metrics for one gateway replica (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("flywheel_requests", "requests answered", ["model", "team", "status"], registry=r)
        self.trace_store_errors = Counter("flywheel_trace_store_errors",
                                          "responses failed because their trace could not be stored",
                                          registry=r)
        self.outcomes = Counter("flywheel_outcomes", "how attempts at a deployment ended (serve/outcome.py); "
                                "deployment is empty for requests refused before any", ["deployment", "outcome"],
                                registry=r)
        self.stream_errors = Counter("flywheel_stream_errors", "streams ended by an error event", ["model"], registry=r)
        self.tokens = Counter("flywheel_tokens", "tokens served", ["team", "kind"], registry=r)
        self.admission_wait = Histogram("flywheel_admission_wait_seconds", "time waiting for a lease",
                                        buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10), registry=r)
        self.upstream_latency = Histogram("flywheel_upstream_first_byte_seconds",
                                          "time to the deployment's response headers", ["deployment"],
                                          buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30), registry=r)
        first = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.ttft = Histogram("flywheel_ttft_seconds", "time to first token as the gateway relays it, "
                              "from the request having been read and checked (a unary response: its "
                              "whole body)",
                              ["deployment"], buckets=first, registry=r)
        self.added = Histogram("flywheel_added_latency_seconds", "of the time to first token, what the "
                               "gateway spent before the request went upstream (admission and its "
                               "queue, context checks, grammar)", ["deployment"], buckets=first, registry=r)
        self.leases = Gauge("flywheel_leases_held", "leases held on a deployment (all replicas)",
                            ["deployment"], registry=r)
        self.breaker = Gauge("flywheel_breaker_state", "0 closed, 1 half-open, 2 open", ["deployment"], registry=r)

    def served(self, model: str, team: str, usage: dict | None) -> None:
        self.requests.labels(model, team, "200").inc()
        if usage:
            self.tokens.labels(team, "input").inc(usage.get("prompt_tokens") or 0)
            self.tokens.labels(team, "output").inc(usage.get("completion_tokens") or 0)

    def first_token(self, deployment: str, ttft_s: float, added_s: float) -> None:
        self.ttft.labels(deployment).observe(ttft_s)
        self.added.labels(deployment).observe(added_s)

    def rejected(self, model: str, team: str, status: int) -> None:
        self.requests.labels(model, team, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
