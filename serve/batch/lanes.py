"""How many batch lines may run now: fewer while interactive requests are being served.

Batch lines and interactive requests share a deployment's engine (and, on a small host, its
CPU). Measured on the sim profile (5 interactive requests/s, two mocker workers): one batch
line in flight leaves interactive time to first token where it is without a batch (ratio
0.96-1.07); two raise it 15-22 %, four 70-110 %. So a replica runs ``batch.concurrency``
lines while no interactive request has been seen for a model within ``interactive_hold_s``,
and at most ``busy_concurrency`` of that model's lines otherwise. Lines already running
finish; only new starts wait.

A replica marks a model busy when it admits an interactive request for it (a store of one
float, nothing on the request path waits). The batch scheduler publishes that to the shared
state every pass (a Redis key with the hold as its TTL, so no clocks are compared) and reads
the other replicas' marks back, so one replica's interactive traffic slows every replica's
batch lines.
"""

from __future__ import annotations

import asyncio
import time

from serve.shared_state import LOCAL, SharedState

_KEY = "fw:interactive:"
_SYNC = """
for i, key in ipairs(KEYS) do
  if ARGV[i + 1] == '1' then redis.call('SET', key, '1', 'PX', ARGV[1]) end
end
local busy = {}
for i, key in ipairs(KEYS) do busy[i] = redis.call('EXISTS', key) end
return busy
"""


class InteractiveSignal:
    """Which models had an interactive request within the hold, here or on another replica."""

    def __init__(self, state: SharedState, hold_s: float):
        self.state, self.hold_s = state, hold_s
        self._local: dict[str, float] = {}  # model -> monotonic time its hold ends
        self._shared: set[str] = set()  # busy on some replica at the last sync

    def seen(self, model: str) -> None:
        self._local[model] = time.monotonic() + self.hold_s

    def busy(self, model: str) -> bool:
        return time.monotonic() < self._local.get(model, 0.0) or model in self._shared

    def sync(self, models: set[str]) -> None:
        """Publish this replica's marks and read every replica's (blocking: run it in a thread)."""
        now = time.monotonic()
        mine = {m for m, until in self._local.items() if until > now}
        names = sorted(models | mine)
        if not names:
            self._shared = set()
            return
        answer = self.state.run(
            "interactive_sync",
            _SYNC,
            [_KEY + m for m in names],
            [int(self.hold_s * 1000)] + ["1" if m in mine else "0" for m in names],
        )
        self._shared = set() if answer is LOCAL else {m for m, b in zip(names, answer) if int(b)}


class Lanes:
    """An admission gate for batch lines whose width follows :class:`InteractiveSignal`."""

    def __init__(self, signal: InteractiveSignal, concurrency: int, busy_concurrency: int, recheck_s: float = 0.05):
        self.signal, self.concurrency, self.busy_concurrency = signal, concurrency, busy_concurrency
        self.recheck_s = recheck_s  # a hold ends by time passing, with no release to wake on
        self.by_model: dict[str, int] = {}
        self.waiting: dict[str, int] = {}
        self._freed = asyncio.Event()

    def models(self) -> set[str]:
        """The models with batch lines running or waiting here: whose marks to read back."""
        return {m for m, n in self.by_model.items() if n} | {m for m, n in self.waiting.items() if n}

    def _fits(self, model: str) -> bool:
        if sum(self.by_model.values()) >= self.concurrency:
            return False
        return not self.signal.busy(model) or self.by_model.get(model, 0) < self.busy_concurrency

    async def acquire(self, model: str) -> None:
        self.waiting[model] = self.waiting.get(model, 0) + 1
        try:
            while not self._fits(model):
                self._freed.clear()
                try:
                    await asyncio.wait_for(self._freed.wait(), self.recheck_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.waiting[model] -= 1
        self.by_model[model] = self.by_model.get(model, 0) + 1

    def release(self, model: str) -> None:
        self.by_model[model] -= 1
        self._freed.set()
