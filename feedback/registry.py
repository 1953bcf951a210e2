"""The checkpoint registry: what was trained, from which data, and which alias serves what.

One JSON file (written atomically) holds every checkpoint with its lineage (base model, parent
checkpoint, the dataset manifest it was trained on) and, per alias, the history of versions
promoted to it, so a rollback knows where to go back to. ``base`` is the version of the base
model every alias starts from.
"""

from __future__ import annotations

import fcntl
import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from traces.files import write_atomic

BASE = "base"


@dataclass
class Checkpoint:
    version: str
    kind: Literal["lora", "full"]
    path: str
    base_model: str
    parent: str | None = None
    dataset: dict | None = None  # the export manifest (sql, rows, content hash)
    metrics: dict = field(default_factory=dict)
    created: str = ""
    env: str | None = None  # the environment whose rewards trained it
    turn: int | None = None  # the loop turn that made it
    team: str | None = None  # whose traces trained it: only that team sees how
    canary: dict | None = None  # its canary's decision and the figures behind it (feedback/canary.py)


class RegistryError(ValueError):
    pass


class CanaryRunning(RegistryError):
    """An alias has one canary at a time."""


class Registry:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @contextmanager
    def _edit(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            yield data
            write_atomic(self.path, json.dumps(data, indent=2).encode())

    def _read(self) -> dict:
        if not self.path.exists():
            return {"checkpoints": {}, "aliases": {}}
        return json.loads(self.path.read_text())

    def register(
        self,
        version: str,
        kind: str,
        path: str | Path,
        base_model: str,
        parent: str | None = None,
        dataset: dict | None = None,
        metrics: dict | None = None,
        env: str | None = None,
        turn: int | None = None,
        team: str | None = None,
    ) -> Checkpoint:
        if kind not in ("lora", "full"):
            raise RegistryError(f"kind must be 'lora' or 'full', not {kind!r}")
        if version == BASE:
            raise RegistryError(f"{BASE!r} is reserved for the base model")
        if not Path(path).is_dir():
            raise RegistryError(f"checkpoint path {path} is not a directory")
        ckpt = Checkpoint(
            version=version,
            kind=kind,
            path=str(Path(path).resolve()),
            base_model=str(base_model),
            parent=parent,
            dataset=dataset,
            metrics=metrics or {},
            env=env,
            turn=turn,
            team=team,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        with self._edit() as data:
            if version in data["checkpoints"]:
                raise RegistryError(f"checkpoint {version!r} is already registered")
            if parent and parent != BASE and parent not in data["checkpoints"]:
                raise RegistryError(f"parent {parent!r} is not registered")
            data["checkpoints"][version] = asdict(ckpt)
        return ckpt

    def get(self, version: str) -> Checkpoint:
        data = self._read()["checkpoints"]
        if version not in data:
            raise RegistryError(f"unknown checkpoint {version!r}")
        return Checkpoint(**data[version])

    def list(self) -> list[Checkpoint]:
        return [Checkpoint(**c) for c in self._read()["checkpoints"].values()]

    def current(self, alias: str) -> str:
        history = self._read()["aliases"].get(alias, [])
        return history[-1] if history else BASE

    def history(self, alias: str) -> list[str]:
        return [BASE] + [v for v in self._read()["aliases"].get(alias, []) if v != BASE]

    def promote(self, alias: str, version: str) -> None:
        """Record that ``alias`` now serves ``version`` (call after the swap succeeded)."""
        with self._edit() as data:
            if version != BASE and version not in data["checkpoints"]:
                raise RegistryError(f"unknown checkpoint {version!r}")
            data["aliases"].setdefault(alias, []).append(version)

    def previous(self, alias: str) -> str:
        """The version a rollback of ``alias`` goes back to."""
        history = self._read()["aliases"].get(alias, [])
        if not history:
            raise RegistryError(f"alias {alias!r} has never been moved; nothing to roll back")
        return history[-2] if len(history) > 1 else BASE

    def pop(self, alias: str) -> None:
        with self._edit() as data:
            if data["aliases"].get(alias):
                data["aliases"][alias].pop()

    def start_canary(self, alias: str, record: dict) -> None:
        """Record a canary running on ``alias`` (feedback/canary.py); refused while one is."""
        with self._edit() as data:
            running = data.setdefault("canaries", {}).get(alias)
            if running:
                raise CanaryRunning(
                    f"alias {alias!r} already has a canary running: {running['candidate']} since "
                    f"{running['started']}; wait for its decision, or stop it (flywheel checkpoint canary --stop)"
                )
            if record["candidate"] not in data["checkpoints"]:
                raise RegistryError(f"unknown checkpoint {record['candidate']!r}")
            data["canaries"][alias] = record

    def canaries(self) -> dict[str, dict]:
        """The canaries running now, by alias."""
        return self._read().get("canaries", {})

    def finish_canary(self, alias: str, started: str, decision: dict) -> bool:
        """Take the canary that started at ``started`` off ``alias`` and record its decision in the
        lineage (on the candidate, and in the list of decisions). False if it was no longer
        running: another controller decided first, and this one must not act."""
        with self._edit() as data:
            running = data.setdefault("canaries", {}).get(alias)
            if not running or running["started"] != started:
                return False
            del data["canaries"][alias]
            data.setdefault("decisions", []).append(decision)
            data["checkpoints"][running["candidate"]]["canary"] = decision
            return True

    def canary_moved(self, decision: dict, moved: str) -> None:
        """Add to a decision :meth:`finish_canary` recorded when the alias moved (``moved``): from
        then on only the decided version serves it; between ``decided`` and ``moved`` the split
        still stood."""
        with self._edit() as data:
            for found in data.get("decisions", []):
                if found == decision:
                    found["moved"] = moved
            checkpoint = data["checkpoints"][decision["candidate"]]
            if checkpoint.get("canary") == decision:
                checkpoint["canary"] = {**decision, "moved": moved}

    def restore_canary(self, alias: str, record: dict, decision: dict) -> None:
        """Undo :meth:`finish_canary` when acting on its decision failed: still running."""
        with self._edit() as data:
            data.setdefault("canaries", {})[alias] = record
            data["decisions"] = [d for d in data.get("decisions", []) if d != decision]
            data["checkpoints"][record["candidate"]]["canary"] = None

    def drop_canary(self, alias: str, started: str) -> None:
        """Take off a canary that never served (its split could not be set): no decision."""
        with self._edit() as data:
            if data.get("canaries", {}).get(alias, {}).get("started") == started:
                del data["canaries"][alias]

    def decisions(self) -> list[dict]:
        """Every canary decision, oldest first."""
        return self._read().get("decisions", [])
