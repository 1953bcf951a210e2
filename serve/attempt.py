"""One try of a request at one deployment: the typed value every stage after admission reads
(send, relay, settle), and how a try that did not answer the client ended."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from serve.admission import Admission, Admitted
from serve.capture import Capture, RequestContext
from serve.config import Deployment
from serve.errors import APIError
from serve.outcome import Outcome
from serve.tools.definitions import ToolRequest
from serve.upstream import Rewrite

log = logging.getLogger(__name__)


class Renewals:
    """Keeps the leases and budget reservations of running attempts alive: every third of the
    lease TTL one timer renews all that are held (a unary answer can outlast the TTL, a stream
    much more). One timer for the replica rather than one per request: holding costs a dict
    entry, and a renewal that fails is logged without ending the others'."""

    def __init__(self, admission: Admission, interval_s: float):
        self._admission, self._interval = admission, interval_s
        self._held: dict[int, Admitted] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def hold(self, admitted: Admitted) -> None:
        if admitted.lease is None and admitted.budget is None and admitted.batch_lease is None:
            return  # nothing reserved (no capacity or budget configured): nothing to renew
        self._held[id(admitted)] = admitted
        loop = asyncio.get_running_loop()
        if self._timer is None or self._loop is not loop:  # (a test may serve from a new loop)
            self._loop, self._timer = loop, loop.call_later(self._interval, self._renew_all)

    def drop(self, admitted: Admitted) -> None:
        self._held.pop(id(admitted), None)

    def _renew_all(self) -> None:
        self._timer = None
        for admitted in list(self._held.values()):
            try:
                self._admission.renew(admitted)
            except Exception:  # noqa: BLE001 - one ledger's failure must not drop the others' leases
                log.exception("could not renew a lease")
        if self._held:
            self._timer = self._loop.call_later(self._interval, self._renew_all)


@dataclass
class Attempt:
    deployment: Deployment
    operation: str  # "chat" | "text_completion" | "generate"
    rewrite: Rewrite
    capture: Capture
    admitted: Admitted
    tools: ToolRequest | None

    @property
    def ctx(self) -> RequestContext:
        return self.capture.ctx

    @property
    def stream(self) -> bool:
        return bool(self.ctx.body.get("stream"))


class AttemptFailed(Exception):
    """An attempt ended before the client was answered. ``retryable``: the deployment failed (the
    next one may serve the request); otherwise the deployment refused the request itself."""

    def __init__(self, error: APIError, outcome: Outcome, retryable: bool = True):
        super().__init__(error.message)
        self.error, self.outcome, self.retryable = error, outcome, retryable
