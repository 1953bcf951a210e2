"""The alias table (which deployment and checkpoint each public model name serves), shared by
every gateway replica and kept across restarts.

Reads come from this replica's copy (no I/O on the request path). A change made through any
replica goes to Redis (a hash plus a version counter) and to a JSON file; every replica polls the
version every ``poll_s`` and reloads the hash when it moved, so a swap through one replica is
served by all within about that long. At start-up the table comes from Redis if it holds one,
else from the file (the last table any replica wrote), else from the configuration.
"""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from pathlib import Path

from serve.config import ModelRoute
from serve.shared_state import LOCAL, SharedState
from traces.files import write_atomic

log = logging.getLogger(__name__)
HASH, VERSION = "flywheel:routes", "flywheel:routes:version"


class RouteTable(MutableMapping):
    def __init__(self, initial: dict[str, ModelRoute], state: SharedState, path: str | Path | None):
        self.state, self.path = state, Path(path) if path else None
        self._routes: dict[str, ModelRoute] = dict(initial)
        self._version: str | None = None
        saved = self._read_file()
        if saved is not None:
            self._routes = saved
        if not self._pull():
            self._push()  # Redis holds no table yet (or lost it): ours becomes the shared one

    # -- the mapping (what the gateway reads and the admin routes change) ---------------------

    def __getitem__(self, alias: str) -> ModelRoute:
        return self._routes[alias]

    def __iter__(self):
        return iter(self._routes)

    def __len__(self) -> int:
        return len(self._routes)

    def __setitem__(self, alias: str, route: ModelRoute) -> None:
        self._routes[alias] = route
        self._changed()

    def __delitem__(self, alias: str) -> None:
        del self._routes[alias]
        self._changed()

    # -- sharing and persistence --------------------------------------------------------------

    def refresh(self) -> bool:
        """Take up a change another replica made; True if the table changed. Cheap when
        nothing did (one GET)."""
        version = self.state.call(lambda client: client.get(VERSION))
        if version is LOCAL:
            return False
        if version is None:  # Redis restarted empty: hand it our table
            self._push()
            return False
        return version != self._version and self._pull()

    def _changed(self) -> None:
        self._write_file()
        self._push()

    def _pull(self) -> bool:
        def read(client):
            with client.pipeline(transaction=True) as pipe:
                return pipe.get(VERSION).hgetall(HASH).execute()

        got = self.state.call(read)
        if got is LOCAL or got[0] is None:
            return False
        version, table = got
        self._routes = {a: ModelRoute.model_validate_json(r) for a, r in table.items()}
        self._version = version
        self._write_file()
        return True

    def _push(self) -> None:
        def write(client):
            with client.pipeline(transaction=True) as pipe:
                pipe.delete(HASH)
                if self._routes:
                    pipe.hset(HASH, mapping={a: r.model_dump_json() for a, r in self._routes.items()})
                pipe.incr(VERSION)
                return str(pipe.execute()[-1])

        version = self.state.call(write)
        if version is LOCAL:
            if self.state.redis_url:
                log.warning("alias change not shared (Redis unreachable); it is saved in %s", self.path)
            return
        self._version = version

    def _read_file(self) -> dict[str, ModelRoute] | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            return {a: ModelRoute.model_validate(r) for a, r in json.loads(self.path.read_text()).items()}
        except ValueError as exc:
            log.error("ignoring unreadable alias table %s: %s", self.path, exc)
            return None

    def _write_file(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps({a: r.model_dump() for a, r in self._routes.items()}, indent=2).encode())
