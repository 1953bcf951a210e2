"""A circuit breaker per deployment, shared by every gateway replica through Redis.

Closed: requests flow; outcomes (success, or connect error / 5xx / timeout) are kept for a
window, and when at least ``min_requests`` of them show an error rate of ``error_rate`` or more
the breaker opens. Open: the deployment gets no traffic for ``open_s``; then one request is let
through as a probe (half-open): success closes the breaker, failure opens it again. The state
lives in Redis so all replicas react to the same evidence; without Redis each replica keeps its
own breaker and behaves the same way on what it sees.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from serve.config import BreakerConfig
from serve.shared_state import LOCAL, SharedState

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}

_RECORD = """
local now = redis.call('TIME'); now = tonumber(now[1]) + tonumber(now[2]) / 1e6
local window, min_n, rate = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'half_open' then
  if ARGV[1] == '1' then
    redis.call('HSET', KEYS[1], 'state', 'closed'); redis.call('DEL', KEYS[2], KEYS[3])
  else
    redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now)
  end
  return redis.call('HGET', KEYS[1], 'state')
end
-- every outcome in KEYS[2], the errors also in KEYS[3]: counting is two ZCARDs, not a scan
-- of the window (thousands of members at a few hundred requests a second)
for i = 2, (ARGV[1] == '1') and 2 or 3 do
  redis.call('ZADD', KEYS[i], now, ARGV[5])
end
for i = 2, 3 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - window)
  redis.call('EXPIRE', KEYS[i], math.ceil(window) + 1)
end
if state == 'closed' then
  local n, errors = redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3])
  if n >= min_n and errors / n >= rate then
    redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now)
    return 'open'
  end
end
return state
"""
_ALLOW = """
local now = redis.call('TIME'); now = tonumber(now[1]) + tonumber(now[2]) / 1e6
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'closed' then return 2 end
local open_s, probe_s = tonumber(ARGV[1]), tonumber(ARGV[2])
if state == 'open' then
  if now >= tonumber(redis.call('HGET', KEYS[1], 'opened_at')) + open_s then
    redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe_at', now)
    return 1
  end
  return 0
end
if now >= tonumber(redis.call('HGET', KEYS[1], 'probe_at') or '0') + probe_s then
  redis.call('HSET', KEYS[1], 'probe_at', now)
  return 1
end
return 0
"""


class Breakers:
    def __init__(self, state: SharedState, cfg: BreakerConfig):
        self.state, self.cfg = state, cfg
        self._local: dict[str, dict] = {}
        self._closed_at: dict[str, float] = {}  # dep -> when Redis last said closed
        self._lock = threading.Lock()

    def _keys(self, dep: str) -> list[str]:
        return [f"fw:breaker:{dep}", f"fw:breaker:{dep}:events", f"fw:breaker:{dep}:errors"]

    def _local_breaker(self, dep: str) -> dict:
        return self._local.setdefault(dep, {"state": CLOSED, "events": deque(), "errors": 0})

    def _heard(self, dep: str, closed: bool) -> None:
        if closed:
            self._closed_at[dep] = time.monotonic()
        else:
            self._closed_at.pop(dep, None)

    def allow(self, dep: str) -> bool:
        if self.state.shared and time.monotonic() - self._closed_at.get(dep, -1e9) < self.cfg.closed_view_s:
            return True
        shared = self.state.run("allow", _ALLOW, self._keys(dep), [self.cfg.open_s, self.cfg.probe_timeout_s])
        if shared is not LOCAL:
            self._heard(dep, shared == 2)  # 2: closed; 1: a probe let through
            return bool(shared)
        with self._lock:
            b = self._local_breaker(dep)
            now = time.monotonic()
            if b["state"] == CLOSED:
                return True
            if b["state"] == OPEN:
                if now >= b["opened_at"] + self.cfg.open_s:
                    b.update(state=HALF_OPEN, probe_at=now)
                    return True
                return False
            if now >= b.get("probe_at", 0) + self.cfg.probe_timeout_s:
                b["probe_at"] = now
                return True
            return False

    def record(self, dep: str, ok: bool) -> str:
        """Count one outcome; returns the breaker state after it."""
        shared = self.state.run(
            "record",
            _RECORD,
            self._keys(dep),
            ["1" if ok else "0", self.cfg.window_s, self.cfg.min_requests, self.cfg.error_rate, os.urandom(6).hex()],
        )
        if shared is not LOCAL:
            self._heard(dep, shared == CLOSED)
            return shared
        with self._lock:
            b = self._local_breaker(dep)
            now = time.monotonic()
            if b["state"] == HALF_OPEN:
                b.update(state=CLOSED, events=deque(), errors=0) if ok else b.update(state=OPEN, opened_at=now)
                return b["state"]
            events = b["events"]  # (time, ok), oldest first: the window is trimmed from the left
            events.append((now, ok))
            b["errors"] += not ok
            while events[0][0] <= now - self.cfg.window_s:
                b["errors"] -= not events.popleft()[1]
            if b["state"] == CLOSED and len(events) >= self.cfg.min_requests and b["errors"] / len(events) >= self.cfg.error_rate:
                b.update(state=OPEN, opened_at=now)
            return b["state"]

    def state_of(self, dep: str) -> str:
        client = self.state.client()
        if client is not None:
            try:
                return client.hget(f"fw:breaker:{dep}", "state") or CLOSED
            except Exception as exc:  # noqa: BLE001 - any Redis failure means "use local"
                self.state.failed(exc)
        return self._local.get(dep, {}).get("state", CLOSED)
