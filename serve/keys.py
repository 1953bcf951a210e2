"""API keys: stored hashed, each mapped to a team; managed with `flywheel keys`.

The key file is JSON written atomically; gateways re-read it when it changes, so a key created
or revoked on the command line takes effect without a restart. Only a SHA-256 of each key is
kept: a leaked file does not leak keys.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from serve.secret_files import write_private


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class KeyRecord:
    id: str
    team: str
    hash: str
    name: str = ""
    created: str = ""
    revoked: bool = False
    scopes: list[str] = field(default_factory=lambda: ["inference"])


# "admin" is what the admin key's feedback and queries are recorded as, "default" the anonymous
# caller's team: a team of either name would read or poison the other's data
RESERVED_TEAMS = frozenset({"admin", "default"})
# what a key may do: call models (inference), create, scale and delete its team's deployments
SCOPES = ("inference", "deployments")


class KeyStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._by_hash: dict[str, KeyRecord] = {}

    def _load(self) -> list[KeyRecord]:
        if not self.path.exists():
            return []
        return [KeyRecord(**k) for k in json.loads(self.path.read_text()).get("keys", [])]

    def _save(self, keys: list[KeyRecord]) -> None:
        write_private(self.path, json.dumps({"keys": [asdict(k) for k in keys]}, indent=2))

    def create(self, team: str, name: str = "", scopes: list[str] | None = None) -> tuple[KeyRecord, str]:
        """A new key for ``team``; the plaintext is returned once and never stored."""
        scopes = list(dict.fromkeys(scopes or ["inference"]))
        unknown = [s for s in scopes if s not in SCOPES]
        if unknown:
            raise ValueError(f"unknown scope {unknown[0]!r} (scopes: {', '.join(SCOPES)})")
        if not team or not team.replace("-", "").replace("_", "").isalnum():
            raise ValueError("team names use letters, digits, '-' and '_'")
        if team.lower() in RESERVED_TEAMS:
            raise ValueError(
                f"{team!r} is reserved ({', '.join(sorted(RESERVED_TEAMS))} name the admin "
                "and anonymous callers); choose another team name"
            )
        key = "fw-" + secrets.token_urlsafe(32)
        rec = KeyRecord(
            id="key-" + secrets.token_hex(6),
            team=team,
            hash=hash_key(key),
            name=name,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            scopes=scopes,
        )
        with self._lock:
            self._save(self._load() + [rec])
        return rec, key

    def list(self) -> list[KeyRecord]:
        return self._load()

    def revoke(self, key_id: str) -> KeyRecord:
        with self._lock:
            keys = self._load()
            for k in keys:
                if k.id == key_id:
                    k.revoked = True
                    self._save(keys)
                    return k
        raise KeyError(f"no key with id {key_id!r}")

    def lookup(self, key: str) -> KeyRecord | None:
        """The key's record (revoked ones included), re-reading the file if it changed."""
        return self._current().get(hash_key(key))

    def by_id(self, key_id: str) -> KeyRecord | None:
        """The record of a key id (a browser session holds the id, never the key)."""
        return next((k for k in self._current().values() if k.id == key_id), None)

    def _current(self) -> dict[str, KeyRecord]:
        try:  # the file is replaced on every change: a new inode even within one mtime tick
            st = self.path.stat()
            mtime = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            mtime = None
        if mtime != self._mtime:
            self._by_hash = {k.hash: k for k in self._load()}
            self._mtime = mtime
        return self._by_hash
