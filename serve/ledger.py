"""Expiring reservations against a limit: the primitive behind leases and budgets.

A reservation is ``(id, a, b)`` held until it expires unless renewed: for leases ``a`` is one
request and ``b`` its tokens; for budgets ``a`` is tokens and ``b`` micro-dollars. Reserving
checks, atomically, that the live reservations plus what was already spent plus the new one stay
within the limits. In Redis this is one Lua script over a sorted set scored by expiry (Redis's
clock, so replicas agree); a replica that dies stops renewing and its reservations lapse within
the TTL. Without Redis the same logic runs in process.

During a Redis outage each replica admits on its own, so it must not admit against the whole
limit: it takes its share of what was left when it last saw Redis (limit minus spent and
reserved, divided by the replicas that were alive), so N replicas together stay within the
limit. What it spends meanwhile is added to Redis when Redis answers again. A single replica
with no Redis keeps its spend in a file (``persist``) so a restart does not forget it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from serve.shared_state import LOCAL, SharedState

# Shared prologue: Redis's clock, lapsed reservations dropped, live ones summed (n, a, b).
_LIVE = """
local now = redis.call('TIME'); now = tonumber(now[1]) + tonumber(now[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n, a, b = 0, 0, 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local x, y = string.match(m, ':([%d%.]+):([%d%.]+)$')
  n = n + 1; a = a + tonumber(x); b = b + tonumber(y)
end
"""
# Returns {admitted, then the live count, spent + reserved a and b, this reservation included}.
_RESERVE = _LIVE + """
local sa = tonumber(redis.call('HGET', KEYS[2], 'a') or '0')
local sb = tonumber(redis.call('HGET', KEYS[2], 'b') or '0')
local lim_n, lim_a, lim_b = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local ua, ub = sa + a + tonumber(ARGV[3]), sb + b + tonumber(ARGV[4])
if (lim_n >= 0 and n + 1 > lim_n) or (lim_a >= 0 and ua > lim_a) or (lim_b >= 0 and ub > lim_b) then
  return {0, n, string.format('%d', sa + a), string.format('%d', sb + b)}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
return {1, n + 1, string.format('%d', ua), string.format('%d', ub)}
"""
_RENEW = """
local now = redis.call('TIME'); now = tonumber(now[1]) + tonumber(now[2]) / 1e6
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[2])
"""
_SETTLE = """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] ~= '0' then redis.call('HINCRBYFLOAT', KEYS[2], 'a', ARGV[2]) end
if ARGV[3] ~= '0' then redis.call('HINCRBYFLOAT', KEYS[2], 'b', ARGV[3]) end
return 1
"""
_TOTALS = _LIVE + """
return {n, tostring(a), tostring(b), redis.call('HGET', KEYS[2], 'a') or '0', redis.call('HGET', KEYS[2], 'b') or '0'}
"""


@dataclass
class Reservation:
    ledger: str
    id: str
    a: int
    b: int
    shared: bool  # made in Redis (True) or in this process (False)

    @property
    def member(self) -> str:
        # whole numbers, written out: the Lua side parses digits ('1e+06' would not parse)
        return f"{self.id}:{self.a:d}:{self.b:d}"


@dataclass
class Totals:
    live: int
    reserved_a: float
    reserved_b: float
    spent_a: float
    spent_b: float


class Ledger:
    """Named ledgers (one per deployment, or per team) with limits ``(n, a, b)``; -1 = none."""

    def __init__(self, state: SharedState, prefix: str, ttl_s: float, persist: str | Path | None = None):
        self.state, self.prefix, self.ttl_s = state, prefix, ttl_s
        self._local: dict[str, dict[str, tuple[float, float, float]]] = {}  # name -> id -> (exp, a, b)
        self._local_spent: dict[str, list[float]] = {}
        self._seen: dict[str, tuple[float, float, float]] = {}   # name -> Redis's (n, a, b) last seen
        self._unsynced: dict[str, list[int]] = {}                 # spent while Redis was down
        self._lock = threading.Lock()
        # only a replica without Redis keeps its own books; with Redis, Redis (with AOF) does
        self.persist = Path(persist) if persist and not state.redis_url else None
        if self.persist and self.persist.exists():
            self._local_spent = {k: list(v) for k, v in json.loads(self.persist.read_text()).items()}

    def _keys(self, name: str) -> list[str]:
        return [f"{self.prefix}:{name}:res", f"{self.prefix}:{name}:spent"]

    def reserve(self, name: str, rid: str, a: int, b: int, limits: tuple[float, float, float]) -> Reservation | None:
        """Reserve whole amounts (tokens, micro-dollars rounded up by the caller)."""
        a, b = int(a), int(b)
        res = Reservation(name, rid, a, b, shared=False)
        self._sync(name)
        got = self.state.run("reserve", _RESERVE, self._keys(name), [self.ttl_s, res.member, a, b, *limits])
        if got is not LOCAL:
            ok, n, seen_a, seen_b = got
            self._seen[name] = (int(n), int(seen_a), int(seen_b))
            res.shared = True
            return res if ok else None
        if self.state.redis_url:
            limits = self._share(name, limits)
        with self._lock:
            live = self._purge(name)
            spent = self._local_spent.setdefault(name, [0.0, 0.0])
            n, ra, rb = len(live), sum(v[1] for v in live.values()), sum(v[2] for v in live.values())
            lim_n, lim_a, lim_b = limits
            if (lim_n >= 0 and n + 1 > lim_n) or (lim_a >= 0 and spent[0] + ra + a > lim_a) \
                    or (lim_b >= 0 and spent[1] + rb + b > lim_b):
                return None
            live[rid] = (time.monotonic() + self.ttl_s, a, b)
            return res

    def renew(self, res: Reservation) -> None:
        if res.shared:
            # if Redis is down the reservation may lapse there; local admission carries on
            self.state.run("renew", _RENEW, self._keys(res.ledger), [self.ttl_s, res.member])
            return
        with self._lock:
            live = self._local.get(res.ledger, {})
            if res.id in live:
                live[res.id] = (time.monotonic() + self.ttl_s, res.a, res.b)

    def settle(self, res: Reservation, spent_a: int = 0, spent_b: int = 0) -> None:
        """Drop the reservation and record what was actually spent (whole amounts)."""
        spent_a, spent_b = int(spent_a), int(spent_b)
        if res.shared and self.state.run("settle", _SETTLE, self._keys(res.ledger),
                                         [res.member, spent_a, spent_b]) is not LOCAL:
            return
        # local, or Redis is down: a shared reservation lapses by TTL; the spend is counted here
        # so this replica still honours it
        with self._lock:
            self._local.get(res.ledger, {}).pop(res.id, None)
            spent = self._local_spent.setdefault(res.ledger, [0.0, 0.0])
            spent[0] += spent_a
            spent[1] += spent_b
            if self.state.redis_url:
                owed = self._unsynced.setdefault(res.ledger, [0, 0])
                owed[0] += spent_a
                owed[1] += spent_b
            elif self.persist:
                self._save()

    def look(self) -> None:
        """Take a fresh sight of every ledger this replica uses (call every few seconds), so the
        share it takes in an outage is of what was left moments before, not at its last request."""
        for name in list(self._seen):
            t = self.totals(name)
            if self.state.shared:
                self._seen[name] = (t.live, t.spent_a + t.reserved_a, t.spent_b + t.reserved_b)

    def _share(self, name: str, limits: tuple[float, float, float]) -> tuple[float, ...]:
        """This replica's part of what was left of ``limits`` when Redis was last seen."""
        seen = self._seen.get(name, (0, 0, 0))
        replicas = max(1, self.state.replicas_seen)
        return tuple(lim if lim < 0 else max(0.0, lim - used) / replicas for lim, used in zip(limits, seen))

    def _sync(self, name: str) -> None:
        """Add what this replica spent during an outage to Redis, once Redis answers."""
        owed = self._unsynced.get(name)
        if not owed or not any(owed):
            return
        if self.state.run("settle", _SETTLE, self._keys(name), ["", owed[0], owed[1]]) is LOCAL:
            return
        with self._lock:
            self._unsynced.pop(name, None)
            self._local_spent.pop(name, None)  # Redis holds it now; the next outage starts afresh

    def _save(self) -> None:
        tmp = self.persist.with_name(f".{self.persist.name}.tmp")
        tmp.write_text(json.dumps(self._local_spent))
        os.replace(tmp, self.persist)

    def totals(self, name: str) -> Totals:
        self._sync(name)
        shared = self.state.run("totals", _TOTALS, self._keys(name), [])
        if shared is not LOCAL:
            n, ra, rb, sa, sb = shared
            return Totals(int(n), float(ra), float(rb), float(sa), float(sb))
        with self._lock:
            live = self._purge(name)
            spent = self._local_spent.get(name, [0.0, 0.0])
            return Totals(len(live), sum(v[1] for v in live.values()), sum(v[2] for v in live.values()),
                          spent[0], spent[1])

    def _purge(self, name: str) -> dict:
        now = time.monotonic()
        live = self._local.setdefault(name, {})
        for rid in [r for r, v in live.items() if v[0] <= now]:
            del live[rid]
        return live
