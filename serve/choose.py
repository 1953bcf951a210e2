"""Choosing a deployment: the alias's deployments (primary, then fallbacks), the session's own
deployment first (affinity), those whose circuit breaker is open left out."""

from __future__ import annotations

from serve.affinity import Affinity
from serve.breaker import Breakers
from serve.config import ModelRoute


class Chooser:
    def __init__(self, breakers: Breakers, affinity: Affinity):
        self.breakers, self.affinity = breakers, affinity

    def order(self, route: ModelRoute, session: str | None) -> list[str]:
        """The deployments to try, in order."""
        deps = [route.deployment] + [d for d in route.fallbacks if d != route.deployment]
        if not session or len(deps) < 2:
            return deps  # nothing to order by: no breaker states to read (one Redis call each)
        healthy = {d for d in deps if self.breakers.state_of(d) != "open"}
        return self.affinity.order(session, deps, healthy)

    def allow(self, deployment: str) -> bool:
        """Whether to try it now (a half-open breaker lets one probe through at a time)."""
        return self.breakers.allow(deployment)
