"""One try of a request at one deployment: the typed value every stage after admission reads
(send, relay, settle), and how a try that did not answer the client ended."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from serve.admission import Admission, Admitted
from serve.capture import Capture, RequestContext
from serve.config import Deployment
from serve.errors import APIError
from serve.outcome import Outcome
from serve.tools.definitions import ToolRequest
from serve.upstream import Rewrite


class Renewal:
    """Keeps an admission's lease and budget reservation alive (every third of the lease TTL)
    until cancelled: a unary answer can take longer than the TTL, a stream much longer. A timer,
    not a task: it costs nothing per request until it fires."""

    def __init__(self, admission: Admission, admitted: Admitted, interval_s: float):
        self._admission, self._admitted, self._interval = admission, admitted, interval_s
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(interval_s, self._renew)

    def _renew(self) -> None:
        self._admission.renew(self._admitted)
        self._handle = self._loop.call_later(self._interval, self._renew)

    def cancel(self) -> None:
        self._handle.cancel()


@dataclass
class Attempt:
    deployment: Deployment
    operation: str                  # "chat" | "text_completion" | "generate"
    rewrite: Rewrite
    capture: Capture
    admitted: Admitted
    tools: ToolRequest | None
    renewal: Renewal | None = field(default=None, repr=False)

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
