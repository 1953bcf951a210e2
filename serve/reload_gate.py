"""Requests held at the gateway while their deployment reloads its weights in place.

A reload (serve/weights.py) pauses the deployment's engines. A base-weight request that
arrives then waits inside the paused engine, but Dynamo's vLLM handler refuses an adapter's
request outright ("Cannot admit LoRA request ... while generation is paused", a 500): measured
in the loop on production traffic, one request of ~3,000 failed that way in an 80 ms reload. So
this gateway sends nothing to a deployment it is reloading until the reload has ended, nor to
one a client paused (``/pause``) until it resumes it. A request that had passed the gate just
before a hold began can still reach the paused engine and be refused unstarted (measured: 4 of
752 adapter requests across 18 reloads): it fails before its first token while the hold is
new, so the gateway sends it once more when the gate opens (serve/forward.py). Per gateway
replica: a reload or pause through another replica is not seen here.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager


class ReloadGate:
    """Per deployment, a count of holds (a reload's, a client's pause); its requests pass when
    there are none."""

    def __init__(self):
        self._open: dict[str, asyncio.Event] = {}
        self._holds: dict[str, int] = {}
        self._begun: dict[str, int] = {}  # holds begun so far: did one begin after a request passed?

    def _event(self, deployment: str) -> asyncio.Event:
        if deployment not in self._open:
            self._open[deployment] = asyncio.Event()
            self._open[deployment].set()
        return self._open[deployment]

    def hold(self, deployment: str) -> None:
        """Hold ``deployment``'s new requests until as many :meth:`release` calls."""
        self._holds[deployment] = self._holds.get(deployment, 0) + 1
        self._begun[deployment] = self._begun.get(deployment, 0) + 1
        self._event(deployment).clear()

    def begun(self, deployment: str) -> int:
        """How many holds of ``deployment`` have begun: a request that passed when it was ``n``
        and failed when it is more may have met the engine paused."""
        return self._begun.get(deployment, 0)

    def release(self, deployment: str) -> None:
        self._holds[deployment] = max(0, self._holds.get(deployment, 0) - 1)
        if not self._holds[deployment]:
            self._event(deployment).set()

    @asynccontextmanager
    async def closed(self, deployment: str):
        """Hold ``deployment``'s new requests while the block runs."""
        self.hold(deployment)
        try:
            yield
        finally:
            self.release(deployment)

    async def passage(self, deployment: str) -> None:
        """Return once ``deployment`` is not being reloaded (at once, nearly always)."""
        gate = self._open.get(deployment)
        if gate is not None and not gate.is_set():
            await gate.wait()
