"""A caller whose requests keep being refused has its refusals answered at a bounded pace.

Each 4xx costs the gateway's event loop the same as a good request's start (headers, key, body,
parse, the error's JSON), and a client in a tight loop of bad requests gets one back in under a
millisecond, so it can send hundreds a second: a team flooding 100 KB bodies nested 50,000 deep
took about two thirds of the loop (py-spy) and every other team's first tokens waited. Refusals
are answered at ``per_s`` a second per caller after a burst of ``burst``: past that, the answer
waits (at most ``max_wait_s``) before it goes out, so a client that waits for its answers slows to
that pace. Nothing is refused that would have been answered, and a caller whose requests are
good never waits. A caller is its credential (the key it presents), or its address without one;
the admin is not paced.
"""

from __future__ import annotations

import time
from collections import OrderedDict


class RefusalPace:
    def __init__(self, per_s: float, burst: int, max_wait_s: float = 5.0, max_callers: int = 10_000):
        self.per_s, self.burst, self.max_wait_s, self.max_callers = per_s, burst, max_wait_s, max_callers
        self._buckets: OrderedDict[int, tuple[float, float]] = OrderedDict()  # caller -> (tokens, at)

    def wait_s(self, caller: int) -> float:
        """Seconds the refusal to ``caller`` waits before it is answered (0: at once); takes its
        token (a caller past its burst owes the next ones: its later refusals wait longer)."""
        now = time.monotonic()
        tokens, at = self._buckets.pop(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_s) - 1
        self._buckets[caller] = (max(tokens, -self.per_s * self.max_wait_s), now)
        if len(self._buckets) > self.max_callers:
            self._buckets.popitem(last=False)  # the longest quiet: the map stays bounded
        return min(self.max_wait_s, -tokens / self.per_s) if tokens < 0 else 0.0


def credential_of(scope: dict) -> str | None:
    """The key the request presents (``Authorization: Bearer`` or ``x-api-key``), if any."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            return value.decode("latin-1").removeprefix("Bearer ").strip()
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
    return None


def caller_of(scope: dict, credential: str | None) -> int:
    """Who is asking, for pacing: the credential presented, else the client's address."""
    if credential is not None:
        return hash(credential)
    client = scope.get("client")
    return hash(client[0] if client else "")
