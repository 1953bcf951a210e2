"""Settling: how an attempt ended, heard once by everything that keeps account of it: the
deployment's circuit breaker and ``/metrics`` (the same :class:`Outcome`), the admission
ledgers (lease released, budget settled at real usage) and the trace store (the record, durable
before a successful answer is delivered)."""

from __future__ import annotations

import logging

from serve.admission import Admission
from serve.attempt import Attempt, Renewals
from serve.breaker import Breakers
from serve.capture import Capture
from serve.errors import APIError
from serve.metrics import Metrics
from serve.outcome import Outcome
from traces.writer import TraceWriter

log = logging.getLogger(__name__)


def trace_store_unavailable(exc: BaseException) -> APIError:
    return APIError(
        503,
        f"the trace store could not make this response durable ({exc}); it was not "
        "delivered: retry once the gateway's trace disk is writable again",
        type="server_error",
        code="trace_store_unavailable",
    )


class Settler:
    def __init__(self, writer: TraceWriter, admission: Admission, breakers: Breakers, metrics: Metrics, renew_every_s: float):
        self.writer, self.admission, self.breakers, self.metrics = writer, admission, breakers, metrics
        self.renewals = Renewals(admission, renew_every_s)

    def keep_alive(self, attempt: Attempt) -> None:
        """Renew the attempt's lease and budget reservation until it is released (or
        :meth:`stop_renewing`)."""
        self.renewals.hold(attempt.admitted)

    def stop_renewing(self, attempt: Attempt) -> None:
        self.renewals.drop(attempt.admitted)

    def outcome(self, deployment: str, outcome: Outcome) -> None:
        """An attempt at ``deployment`` ended: its breaker and the metrics hear the same outcome."""
        self.breakers.record(deployment, outcome.deployment_ok)
        self.metrics.outcome(deployment, outcome.value)

    async def durable(self, record: dict) -> None:
        """Store the trace of a request that fails anyway: a failing disk is logged, and the
        client hears the request's own error."""
        try:
            await self.writer.write_async(record)
        except Exception:
            log.exception("trace %s could not be made durable", record.get("trace_id"))

    async def acknowledge(self, record: dict) -> None:
        """Wait until the trace of a successful response is fsync'd; a response is delivered
        only after its record is, so a trace that cannot be stored fails the request (503)."""
        try:
            await self.writer.write_async(record)
        except Exception as exc:
            log.error("trace %s could not be made durable: %s", record.get("trace_id"), exc)
            self.metrics.trace_store_errors.inc()
            raise trace_store_unavailable(exc) from None

    def release(self, attempt: Attempt, usage: dict | None, produced: int = 0) -> None:
        """The attempt holds nothing more: renewals stop, the lease is released, the budget
        settled (idempotent, as :meth:`Admission.release`)."""
        self.renewals.drop(attempt.admitted)
        self.admission.release(attempt.admitted, attempt.ctx.price_model, usage, produced=produced)

    def first_token(self, deployment: str, capture: Capture) -> None:
        if (times := capture.first_token_times()) is not None:
            self.metrics.first_token(deployment, *times)

    def stream_ended(self, attempt: Attempt, outcome: Outcome, error: str | None, recorded: bool) -> None:
        """A relayed stream is over, however it ended: everything settled at once, on the spot
        (a client that left cannot be waited for)."""
        dep, capture, ctx = attempt.deployment.name, attempt.capture, attempt.ctx
        self.outcome(dep, outcome)
        if not recorded:
            self.writer.submit(capture.record(200, error, outcome))
        self.release(attempt, capture.usage or None, produced=len(capture.completion_ids))
        self.first_token(dep, capture)
        if error is None:
            self.metrics.served(ctx.alias, ctx.team, capture.usage)
        else:
            self.metrics.stream_errors.labels(ctx.alias).inc()
