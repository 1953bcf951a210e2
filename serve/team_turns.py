"""A team's heavy request work takes turns: reading a large body, checking a new tool list,
counting a long prompt or compiling a grammar runs in a thread, one at a time per team. Work that
ends in a refusal (a 4xx) is paid for in time: the team's heavy work of about the last second
(``recent``, decaying with a time constant of ``TAU_S``: a request's body was read by one job and
refused by a later one) is t seconds, so its next heavy job starts no sooner than
t x (1 / share - 1) later.

Threads share one GIL with the event loop. Five of one team's heavy requests at once would be
five threads the loop waits behind at every switch, and every other team's stream pays; in turn,
that team's own requests wait for each other instead. One at a time is not enough on its own: a
team sending 20 MB bodies back to back kept one thread busy, holding the GIL two thirds of the
time (py-spy), and every other team's first tokens waited behind it. Only refused work is
slowed: a body the gateway accepts is bounded by the model's context, but one it refuses is as
large as the body limit allows, as often as the team sends it. So the share bounds what one team's
refused requests take from everyone else, and costs a team that sends good requests nothing."""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from serve.errors import APIError

TAU_S = 1.0


@dataclass
class _Turn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_at: float = 0.0  # monotonic time the team's next heavy job may start
    recent: float = 0.0  # seconds of heavy work, decaying (TAU_S)
    last: float = 0.0  # when ``recent`` was last brought up to date


class TeamTurns:
    def __init__(self, max_teams: int = 10_000, share: float = 1.0):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share}")
        self.max_teams, self.share = max_teams, share
        self._turns: OrderedDict[str, _Turn] = OrderedDict()

    def _turn(self, team: str) -> _Turn:
        turn = self._turns.get(team)
        if turn is None:
            turn = self._turns[team] = _Turn()
            over = len(self._turns) - self.max_teams
            for old in [t for t, held in self._turns.items() if not held.lock.locked()][: max(over, 0)]:
                del self._turns[old]  # the least recently used idle teams: the map stays bounded
        self._turns.move_to_end(team)
        return turn

    async def run(self, team: str | None, fn: Callable[..., Any], *args) -> Any:
        """``fn(*args)`` in a thread, once this team's earlier heavy work has finished (and, if
        that was refused, once the team has waited for it)."""
        turn = self._turn(team or "")
        async with turn.lock:
            wait = turn.next_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            t0, refused = time.monotonic(), False
            try:
                return await asyncio.to_thread(fn, *args)
            except APIError as exc:
                refused = exc.status < 500
                raise
            finally:
                now = time.monotonic()
                turn.recent = turn.recent * math.exp(-(t0 - turn.last) / TAU_S) + (now - t0)
                turn.last = now
                if refused:
                    turn.next_at = now + turn.recent * (1 / self.share - 1)
                    turn.recent = 0.0
