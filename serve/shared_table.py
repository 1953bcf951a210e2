"""A table of typed records shared by every gateway replica and kept across restarts (the alias
table, the dedicated deployments' desired state).

Reads come from this replica's copy (no I/O on the request path). A change made through any
replica goes to Redis (a hash plus a version counter) and to a JSON file; every replica polls the
version every few tenths of a second and reloads the hash when it moved, so a change through one
replica is seen by all within about that long. At start-up the table comes from Redis if it holds
one, else from the file (the last table any replica wrote), else from ``initial``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel

from serve.shared_state import LOCAL, SharedState
from traces.files import write_atomic

log = logging.getLogger(__name__)
Record = TypeVar("Record", bound=BaseModel)


class SharedTable(MutableMapping, Generic[Record]):
    """``key -> record`` (a pydantic model), under the Redis keys ``<prefix>`` and ``<prefix>:version``."""

    def __init__(
        self, record: type[Record], prefix: str, initial: dict[str, Record], state: SharedState, path: str | Path | None
    ):
        self.record, self.hash, self.version_key = record, prefix, f"{prefix}:version"
        self.state, self.path = state, Path(path) if path else None
        self._rows: dict[str, Record] = dict(initial)
        self._version: str | None = None
        saved = self._read_file()
        if saved is not None:
            self._rows = saved
        if not self._pull():
            self._push()  # Redis holds no table yet (or lost it): ours becomes the shared one

    # -- the mapping ----------------------------------------------------------------------------

    def __getitem__(self, key: str) -> Record:
        return self._rows[key]

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __setitem__(self, key: str, row: Record) -> None:
        self._rows[key] = row
        self._changed(key)

    def __delitem__(self, key: str) -> None:
        del self._rows[key]
        self._changed(key)

    # -- sharing and persistence ----------------------------------------------------------------

    def refresh(self) -> bool:
        """Take up a change another replica made; True if the table changed. Cheap when
        nothing did (one GET)."""
        version = self.state.call(lambda client: client.get(self.version_key))
        if version is LOCAL:
            return False
        if version is None:  # Redis restarted empty: hand it our table
            self._push()
            return False
        return version != self._version and self._pull()

    def _changed(self, key: str) -> None:
        """Write the one row that changed (a replica that has not yet taken up another's change
        must not write it away), then count a new version."""
        self._write_file()

        def write(client):
            with client.pipeline(transaction=True) as pipe:
                if key in self._rows:
                    pipe.hset(self.hash, key, self._rows[key].model_dump_json())
                else:
                    pipe.hdel(self.hash, key)
                pipe.incr(self.version_key)
                return str(pipe.execute()[-1])

        self._shared(self.state.call(write))

    def _pull(self) -> bool:
        def read(client):
            with client.pipeline(transaction=True) as pipe:
                return pipe.get(self.version_key).hgetall(self.hash).execute()

        got = self.state.call(read)
        if got is LOCAL or got[0] is None:
            return False
        version, table = got
        self._rows = {k: self.record.model_validate_json(r) for k, r in table.items()}
        self._version = version
        self._write_file()
        return True

    def _push(self) -> None:
        def write(client):
            with client.pipeline(transaction=True) as pipe:
                pipe.delete(self.hash)
                if self._rows:
                    pipe.hset(self.hash, mapping={k: r.model_dump_json() for k, r in self._rows.items()})
                pipe.incr(self.version_key)
                return str(pipe.execute()[-1])

        self._shared(self.state.call(write))

    def _shared(self, version) -> None:
        if version is LOCAL:
            if self.state.redis_url:
                log.warning("change to %s not shared (Redis unreachable); it is saved in %s", self.hash, self.path)
            return
        # a version one past ours: only our change came in between; else take up the others'
        if self._version is not None and version != str(int(self._version) + 1):
            self._pull()
        else:
            self._version = version

    def _read_file(self) -> dict[str, Record] | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            return {k: self.record.model_validate(r) for k, r in json.loads(self.path.read_text()).items()}
        except ValueError as exc:
            log.error("ignoring unreadable table %s: %s", self.path, exc)
            return None

    def _write_file(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps({k: r.model_dump() for k, r in self._rows.items()}, indent=2).encode())
