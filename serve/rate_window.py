"""A team's requests and tokens in the last minute (rpm, tpm), exact across gateway replicas.

Each admitted request is a member of a sorted set scored by when it leaves the window, and a
counter holds the tokens of the members still in it: a check drops the members that left (only
those are read) and compares the set's size and the counter with the limits, in one Lua script
(Redis's clock, so replicas agree). The ledger behind leases and budgets sums every live member
on each call, right for a few leases but 10 ms a request at 5,000 requests in a window; this is
O(log n) a request. Without Redis (or while it is down) a replica keeps its own window against
its share of the limits, as the ledger does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from serve.shared_state import LOCAL, SharedState

# KEYS: members, tokens; ARGV: window s, member id, tokens, limit n, limit tokens (-1: none).
# Returns {admitted (0/1), requests in the window, tokens in the window, seconds until the first leaves}.
_ADMIT = """
local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local left = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #left > 0 then
  local drop = 0
  for _, m in ipairs(left) do drop = drop + tonumber(string.match(m, ':(%d+)$')) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('DECRBY', KEYS[2], drop)
end
local n = redis.call('ZCARD', KEYS[1])
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
local window, tokens = tonumber(ARGV[1]), tonumber(ARGV[3])
local lim_n, lim_t = tonumber(ARGV[4]), tonumber(ARGV[5])
if (lim_n >= 0 and n + 1 > lim_n) or (lim_t >= 0 and used + tokens > lim_t) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local wait = 0
  if #first > 0 then wait = tonumber(first[2]) - now end
  return {0, n, used, tostring(wait)}
end
redis.call('ZADD', KEYS[1], now + window, ARGV[2] .. ':' .. ARGV[3])
redis.call('INCRBY', KEYS[2], tokens)
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000)); redis.call('PEXPIRE', KEYS[2], math.ceil(window * 1000))
return {1, n + 1, used + tokens, tostring(window)}
"""


@dataclass(frozen=True)
class WindowCheck:
    admitted: bool
    requests: int  # in the window, this one included when admitted
    tokens: int
    wait_s: float  # refused: until the first request in the window leaves it


class RateWindow:
    def __init__(self, state: SharedState, prefix: str = "fw:rate", window_s: float = 60.0):
        self.state, self.prefix, self.window_s = state, prefix, window_s
        self._local: dict[str, deque[tuple[float, int]]] = {}  # name -> (leaves at, tokens), oldest first
        self._local_tokens: dict[str, int] = {}
        self._lock = threading.Lock()
        self._n = 0

    def admit(self, name: str, tokens: int, max_requests: int | None, max_tokens: int | None) -> WindowCheck:
        lim_n = -1 if max_requests is None else max_requests
        lim_t = -1 if max_tokens is None else max_tokens
        self._n += 1
        member = f"{self.state.replica}-{self._n}"
        keys = [f"{self.prefix}:{name}:members", f"{self.prefix}:{name}:tokens"]
        got = self.state.run("rate_admit", _ADMIT, keys, [self.window_s, member, int(tokens), lim_n, lim_t])
        if got is not LOCAL:
            return WindowCheck(bool(int(got[0])), int(got[1]), int(got[2]), float(got[3]))
        share = max(1, self.state.replicas_seen) if self.state.redis_url else 1  # an outage: this replica's part
        return self._admit_local(
            name, int(tokens), lim_n if lim_n < 0 else lim_n // share, lim_t if lim_t < 0 else lim_t // share
        )

    def _admit_local(self, name: str, tokens: int, lim_n: int, lim_t: int) -> WindowCheck:
        now = time.monotonic()
        with self._lock:
            members = self._local.setdefault(name, deque())
            used = self._local_tokens.get(name, 0)
            while members and members[0][0] <= now:
                used -= members.popleft()[1]
            n = len(members)
            if (lim_n >= 0 and n + 1 > lim_n) or (lim_t >= 0 and used + tokens > lim_t):
                self._local_tokens[name] = used
                return WindowCheck(False, n, used, members[0][0] - now if members else 0.0)
            members.append((now + self.window_s, tokens))
            self._local_tokens[name] = used + tokens
            return WindowCheck(True, n + 1, used + tokens, self.window_s)
