"""How one attempt at a deployment ended: one typed value that the circuit breaker, the
metrics and the trace all read, so they cannot disagree (and nothing is decided by matching
the text of an error message)."""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    OK = "ok"
    CLIENT_GONE = "client_gone"  # the client left first; the deployment was answering
    INVALID_TOOL_CALL = "invalid_tool_call"  # the model's call broke its schema; the engine is fine
    REFUSED = "refused"  # the deployment answered 4xx: the request's fault
    NOT_DURABLE = "not_durable"  # served, but its trace could not be stored: withheld
    REJECTED = "rejected"  # the gateway said no before any deployment (budget, capacity)
    UNREACHABLE = "unreachable"  # no connection, or it dropped before the response began
    TIMEOUT = "timeout"  # no first token (or next byte) in time
    UPSTREAM_ERROR = "upstream_error"  # a 5xx, an error event, a stream cut or ended without [DONE]
    MALFORMED = "malformed"  # a response or stream event that is not what the API says

    @property
    def deployment_ok(self) -> bool:
        """Whether this counts for the deployment's circuit breaker as a success."""
        return self in _DEPLOYMENT_OK


_DEPLOYMENT_OK = frozenset(
    {Outcome.OK, Outcome.CLIENT_GONE, Outcome.INVALID_TOOL_CALL, Outcome.REFUSED, Outcome.NOT_DURABLE, Outcome.REJECTED}
)
