"""Where gateway replicas keep shared state: a real Redis, with a local fallback.

Every shared structure (leases, budgets, breakers, session affinity) goes through
:class:`SharedState`. While Redis answers, all replicas see one state; when it does not, each
replica carries on with its own in-process state (so the gateway keeps serving), retries Redis
every few seconds, and goes back to the shared state when it is reachable again. A single
replica needs no Redis at all (``redis_url = None``).
"""

from __future__ import annotations

import logging
import time
import uuid

log = logging.getLogger(__name__)


class SharedState:
    def __init__(
        self,
        redis_url: str | None,
        retry_s: float = 2.0,
        timeout_s: float = 0.25,
        replica: str | None = None,
        replica_ttl_s: float = 10.0,
        alone_after_s: float = 3.0,
    ):
        """``alone_after_s``: how long after it lost Redis this replica waits before it spends a
        guarded ledger (budgets) on its own: see :meth:`alone_in`."""
        self.redis_url, self.retry_s = redis_url, retry_s
        self.replica, self.replica_ttl_s = replica or uuid.uuid4().hex, replica_ttl_s
        self.alone_after_s = alone_after_s
        self.replicas_seen = 1  # live replicas at the last beat: a ledger's share in an outage
        self._redis = None
        self._down_until = 0.0
        self._cut_off_at: float | None = None  # the first failure since Redis last answered (monotonic)
        if redis_url:
            import redis

            self._redis = redis.Redis.from_url(
                redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
            )
        self._scripts: dict[str, object] = {}

    @property
    def shared(self) -> bool:
        return self._redis is not None and time.monotonic() >= self._down_until

    def client(self):
        """The Redis client, or None while it is unreachable (or not configured)."""
        return self._redis if self.shared else None

    def failed(self, exc: Exception) -> None:
        """Note that Redis failed; use local state until the retry time."""
        if time.monotonic() >= self._down_until:
            log.warning("shared state unreachable (%s); using local state for %.0f s", exc, self.retry_s)
        self._down_until = time.monotonic() + self.retry_s
        if self._cut_off_at is None:
            self._cut_off_at = time.monotonic()

    def alone_in(self) -> float:
        """Seconds until this replica, cut off from Redis, may spend its share of a guarded ledger
        on its own (0: now). A timeout on a busy host cuts one replica off while the others still
        spend through Redis: spending its share then would take it twice. Waiting past the retry
        (``retry_s``) tries Redis again first, so a moment's timeout never spends alone; only an
        outage that lasts does (the others are then cut off too, each on its own share)."""
        if self._cut_off_at is None:
            return 0.0
        return max(0.0, self._cut_off_at + self.alone_after_s - time.monotonic())

    def beat(self) -> None:
        """Say this replica is alive and count the live ones (call every few seconds)."""
        count = self.run("beat", _BEAT, [REPLICAS], [self.replica_ttl_s, self.replica])
        if count is not LOCAL:
            self.replicas_seen = int(count)

    def script(self, name: str, source: str):
        """A registered Lua script (atomic on the Redis side)."""
        if name not in self._scripts:
            self._scripts[name] = self._redis.register_script(source)
        return self._scripts[name]

    def run(self, name: str, source: str, keys: list[str], args: list):
        """Run a Lua script (atomic in Redis). Returns :data:`LOCAL` when there is no shared state
        right now (not configured, known down, or failing now): the caller uses its local state."""
        return self.call(lambda _: self.script(name, source)(keys=keys, args=args))

    def call(self, fn):
        """``fn(client)`` against Redis; :data:`LOCAL` when there is no shared state right now
        (not configured, known down, or failing now), as for :meth:`run`."""
        client = self.client()
        if client is None:
            return LOCAL
        import redis

        try:
            answer = fn(client)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.failed(exc)
            return LOCAL
        self._cut_off_at = None
        return answer


REPLICAS = "flywheel:replicas"  # sorted set: replica -> expiry (Redis's clock)
_BEAT = """
local now = redis.call('TIME'); now = tonumber(now[1]) + tonumber(now[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""
LOCAL = object()  # what SharedState.run answers when the caller must fall back to local state
