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

A ``guarded`` ledger (budgets: money) is spent alone only once the outage has lasted
(``SharedState.alone_in``): one replica's timeout on a busy host, while the others still spend
through Redis, would otherwise spend its share on top of theirs. It is never spent alone by a
replica that has not seen it in Redis: it could not know what was left (``CutOff``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from serve.shared_state import LOCAL, SharedState
from traces.files import write_atomic

# live(key, now): lapsed reservations dropped, the live ones summed (n, a, b); Redis's clock.
_LIVE = """
local function live(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local n, a, b = 0, 0, 0
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local x, y = string.match(m, ':([%d%.]+):([%d%.]+)$')
    n = n + 1; a = a + tonumber(x); b = b + tonumber(y)
  end
  return n, a, b
end
local now = redis.call('TIME'); now = tonumber(now[1]) + tonumber(now[2]) / 1e6
"""
# Several ledgers at once, all or none: KEYS are (reservations, spent) per ledger, ARGV seven
# per ledger (ttl, member, a, b, limits n a b). Returns the 1-based index of the first ledger
# that refuses (0: all reserved), then per ledger its live count and spent + reserved a and b,
# this reservation included when it was made.
_RESERVE = (
    _LIVE
    + """
local seen, refused, adds = {}, 0, {}
for i = 1, #KEYS / 2 do
  local o = 7 * (i - 1)
  local n, a, b = live(KEYS[2 * i - 1], now)
  local sa = tonumber(redis.call('HGET', KEYS[2 * i], 'a') or '0') + a
  local sb = tonumber(redis.call('HGET', KEYS[2 * i], 'b') or '0') + b
  local ua, ub = sa + tonumber(ARGV[o + 3]), sb + tonumber(ARGV[o + 4])
  local lim_n, lim_a, lim_b = tonumber(ARGV[o + 5]), tonumber(ARGV[o + 6]), tonumber(ARGV[o + 7])
  if refused == 0 and ((lim_n >= 0 and n + 1 > lim_n) or (lim_a >= 0 and ua > lim_a) or (lim_b >= 0 and ub > lim_b)) then
    refused = i
  end
  seen[i] = {n, sa, sb, ua, ub}
  adds[i] = {KEYS[2 * i - 1], now + tonumber(ARGV[o + 1]), ARGV[o + 2]}
end
local out = {refused}
for i, s in ipairs(seen) do
  if refused == 0 then
    redis.call('ZADD', adds[i][1], adds[i][2], adds[i][3])
    s = {s[1] + 1, s[4], s[5]}
  end
  table.insert(out, s[1]); table.insert(out, string.format('%d', s[2])); table.insert(out, string.format('%d', s[3]))
end
return out
"""
)
_RENEW = """
local now = redis.call('TIME'); now = tonumber(now[1]) + tonumber(now[2]) / 1e6
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[2])
"""
# Several ledgers at once: KEYS (reservations, spent) and ARGV (member, spent a, spent b) per ledger.
_SETTLE = """
for i = 1, #KEYS / 2 do
  local o = 3 * (i - 1)
  redis.call('ZREM', KEYS[2 * i - 1], ARGV[o + 1])
  if ARGV[o + 2] ~= '0' then redis.call('HINCRBYFLOAT', KEYS[2 * i], 'a', ARGV[o + 2]) end
  if ARGV[o + 3] ~= '0' then redis.call('HINCRBYFLOAT', KEYS[2 * i], 'b', ARGV[o + 3]) end
end
return 1
"""
_TOTALS = (
    _LIVE
    + """
local n, a, b = live(KEYS[1], now)
return {n, tostring(a), tostring(b), redis.call('HGET', KEYS[2], 'a') or '0', redis.call('HGET', KEYS[2], 'b') or '0'}
"""
)


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


class CutOff(Exception):
    """A guarded ledger cannot be spent now: this replica lost Redis and may spend it alone in
    ``wait_s``, or never (``wait_s`` None: it never saw the ledger in Redis)."""

    def __init__(self, wait_s: float | None):
        super().__init__("shared state unreachable: " + ("cannot check" if wait_s is None else f"alone in {wait_s:.1f} s"))
        self.wait_s = wait_s


class Ledger:
    """Named ledgers (one per deployment, or per team) with limits ``(n, a, b)``; -1 = none.
    ``guarded``: spent alone only once an outage has lasted (see the module's docstring)."""

    def __init__(self, state: SharedState, prefix: str, ttl_s: float, persist: str | Path | None = None, guarded: bool = False):
        self.state, self.prefix, self.ttl_s, self.guarded = state, prefix, ttl_s, guarded
        self._local: dict[str, dict[str, tuple[float, float, float]]] = {}  # name -> id -> (exp, a, b)
        self._local_spent: dict[str, list[float]] = {}
        self._seen: dict[str, tuple[float, float, float]] = {}  # name -> Redis's (n, a, b) last seen
        self._unsynced: dict[str, list[int]] = {}  # spent while Redis was down
        self._lock = threading.Lock()
        # only a replica without Redis keeps its own books; with Redis, Redis (with AOF) does
        self.persist = Path(persist) if persist and not state.redis_url else None
        if self.persist and self.persist.exists():
            self._local_spent = {k: list(v) for k, v in json.loads(self.persist.read_text()).items()}

    def _keys(self, name: str) -> list[str]:
        return [f"{self.prefix}:{name}:res", f"{self.prefix}:{name}:spent"]

    def reserve(self, name: str, rid: str, a: int, b: int, limits: tuple[float, float, float]) -> Reservation | None:
        """Reserve whole amounts (tokens, micro-dollars rounded up by the caller)."""
        got = reserve_together([Want(self, name, rid, a, b, limits)])
        return None if isinstance(got, int) else got[0]

    def _reserve_local(self, want: Want) -> Reservation | None:
        name, limits = want.name, want.limits
        if self.state.redis_url:
            if self.guarded:
                wait = self.state.alone_in() if name in self._seen else None
                if wait is None or wait > 0:
                    raise CutOff(wait)
            limits = self._share(name, limits)
        with self._lock:
            live = self._purge(name)
            spent = self._local_spent.setdefault(name, [0.0, 0.0])
            n, ra, rb = len(live), sum(v[1] for v in live.values()), sum(v[2] for v in live.values())
            lim_n, lim_a, lim_b = limits
            if (
                (lim_n >= 0 and n + 1 > lim_n)
                or (lim_a >= 0 and spent[0] + ra + want.a > lim_a)
                or (lim_b >= 0 and spent[1] + rb + want.b > lim_b)
            ):
                return None
            live[want.rid] = (time.monotonic() + self.ttl_s, want.a, want.b)
            return Reservation(name, want.rid, want.a, want.b, shared=False)

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
        settle_together([(self, res, spent_a, spent_b)])

    def _settle_local(self, res: Reservation, spent_a: int, spent_b: int) -> None:
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
        if self.state.run("settle", _SETTLE, self._keys(name), ["", int(owed[0]), int(owed[1])]) is LOCAL:
            return
        with self._lock:
            self._unsynced.pop(name, None)
            self._local_spent.pop(name, None)  # Redis holds it now; the next outage starts afresh

    def _save(self) -> None:
        write_atomic(self.persist, json.dumps(self._local_spent).encode())  # a charge survives a crash

    def totals(self, name: str) -> Totals:
        self._sync(name)
        shared = self.state.run("totals", _TOTALS, self._keys(name), [])
        if shared is not LOCAL:
            n, ra, rb, sa, sb = shared
            return Totals(int(n), float(ra), float(rb), float(sa), float(sb))
        with self._lock:
            live = self._purge(name)
            spent = self._local_spent.get(name, [0.0, 0.0])
            return Totals(len(live), sum(v[1] for v in live.values()), sum(v[2] for v in live.values()), spent[0], spent[1])

    def _purge(self, name: str) -> dict:
        now = time.monotonic()
        live = self._local.setdefault(name, {})
        for rid in [r for r, v in live.items() if v[0] <= now]:
            del live[rid]
        return live


@dataclass
class Want:
    """A reservation to make: ``a`` and ``b`` whole amounts (tokens, micro-dollars rounded up by
    the caller) in ``ledger``'s ``name``, within ``limits``."""

    ledger: Ledger
    name: str
    rid: str
    a: int
    b: int
    limits: tuple[float, float, float]


def reserve_together(wants: list[Want]) -> list[Reservation] | int:
    """Reserve in several ledgers (of one shared state) all or none: the reservations, or the
    index of the first want that does not fit. With Redis it is one atomic script, one round
    trip for a request's lease and budget together; a redis-py call costs ~70 us of the event
    loop's CPU here, whatever it does."""
    if not wants:
        return []
    for w in wants:
        w.a, w.b = int(w.a), int(w.b)
        w.ledger._sync(w.name)
    keys, args = [], []
    for w in wants:
        keys += w.ledger._keys(w.name)
        args += [w.ledger.ttl_s, f"{w.rid}:{w.a:d}:{w.b:d}", w.a, w.b, *w.limits]
    got = wants[0].ledger.state.run("reserve", _RESERVE, keys, args)
    if got is not LOCAL:
        for i, w in enumerate(wants):
            w.ledger._seen[w.name] = tuple(int(x) for x in got[1 + 3 * i : 4 + 3 * i])
        if got[0]:
            return int(got[0]) - 1
        return [Reservation(w.name, w.rid, w.a, w.b, shared=True) for w in wants]
    made: list[Reservation] = []
    try:
        for i, w in enumerate(wants):
            res = w.ledger._reserve_local(w)
            if res is None:
                break
            made.append(res)
        else:
            return made
    finally:  # refused, or cut off: none of them held
        if len(made) < len(wants):
            for ledger, earlier in zip((x.ledger for x in wants), made):
                ledger._settle_local(earlier, 0, 0)
    return i


def settle_together(settles: list[tuple[Ledger, Reservation, int, int]]) -> None:
    """Drop reservations and record what was actually spent: ``(ledger, reservation, spent a,
    spent b)`` each; the shared ones in one round trip."""
    shared, keys, args = [], [], []
    for ledger, res, spent_a, spent_b in settles:
        if res.shared:
            shared.append((ledger, res, int(spent_a), int(spent_b)))
            keys += ledger._keys(res.ledger)
            args += [res.member, int(spent_a), int(spent_b)]
    if shared and shared[0][0].state.run("settle", _SETTLE, keys, args) is not LOCAL:
        settles = [s for s in settles if not s[1].shared]
    for ledger, res, spent_a, spent_b in settles:
        ledger._settle_local(res, int(spent_a), int(spent_b))
