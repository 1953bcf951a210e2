"""Session affinity: the turns of a session (``X-Session-ID``, or a rollout's id) stay on one
deployment, across turns and across gateway replicas, while that deployment is healthy.

The first choice is a rendezvous hash of the session over the healthy candidates, so replicas
agree even without shared state; the choice is then pinned in Redis (first writer wins), so a
session does not move when another deployment comes back, only when its own becomes unhealthy.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from serve.shared_state import SharedState

LOCAL_SESSIONS = 100_000  # sessions this replica remembers without Redis (least recently used go)


def rendezvous(session: str, candidates: list[str]) -> str:
    return max(candidates, key=lambda d: hashlib.sha256(f"{session}|{d}".encode()).digest())


class Affinity:
    def __init__(self, state: SharedState, ttl_s: int = 3600):
        self.state, self.ttl_s = state, ttl_s
        self._local: OrderedDict[str, str] = OrderedDict()

    def order(self, session: str | None, candidates: list[str], healthy: set[str]) -> list[str]:
        """Candidates in the order to try them: the session's deployment first."""
        if not session or len(candidates) < 2:
            return candidates
        usable = [c for c in candidates if c in healthy] or candidates
        pinned = self._get(session)
        if pinned not in usable:
            pinned = self._set(session, rendezvous(session, usable), replace=pinned is not None)
        return [pinned] + [c for c in candidates if c != pinned]

    def _get(self, session: str) -> str | None:
        client = self.state.client()
        if client is not None:
            try:
                return client.get(f"fw:aff:{session}")
            except Exception as exc:  # noqa: BLE001
                self.state.failed(exc)
        dep = self._local.get(session)
        if dep is not None:
            self._local.move_to_end(session)
        return dep

    def _set(self, session: str, dep: str, replace: bool) -> str:
        self._local[session] = dep
        self._local.move_to_end(session)
        if len(self._local) > LOCAL_SESSIONS:
            self._local.popitem(last=False)
        client = self.state.client()
        if client is not None:
            try:
                key = f"fw:aff:{session}"
                if replace:
                    client.set(key, dep, ex=self.ttl_s)
                    return dep
                client.set(key, dep, ex=self.ttl_s, nx=True)
                return client.get(key) or dep  # another replica may have pinned it first
            except Exception as exc:  # noqa: BLE001
                self.state.failed(exc)
        return dep
