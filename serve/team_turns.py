"""A team's heavy request work takes turns: reading a large body, checking a new tool list,
counting a long prompt or compiling a grammar runs in a thread, one at a time per team.

Threads share one GIL with the event loop. Five of one team's heavy requests at once would be
five threads the loop waits behind at every switch, and every other team's stream pays; in turn,
that team's own requests wait for each other instead."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Callable


class TeamTurns:
    def __init__(self, max_teams: int = 10_000):
        self.max_teams = max_teams
        self._locks: OrderedDict[str, asyncio.Lock] = OrderedDict()

    def _lock(self, team: str) -> asyncio.Lock:
        lock = self._locks.get(team)
        if lock is None:
            lock = self._locks[team] = asyncio.Lock()
            over = len(self._locks) - self.max_teams
            for old in [t for t, held in self._locks.items() if not held.locked()][: max(over, 0)]:
                del self._locks[old]  # the least recently used idle teams: the map stays bounded
        self._locks.move_to_end(team)
        return lock

    async def run(self, team: str | None, fn: Callable[..., Any], *args) -> Any:
        """``fn(*args)`` in a thread, once this team's earlier heavy work has finished."""
        async with self._lock(team or ""):
            return await asyncio.to_thread(fn, *args)
