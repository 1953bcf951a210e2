"""What a loop run has done: its config and each completed phase's result in
``<home>/loops/<run>/state.json``, written atomically after every phase, which is what
``--resume`` reads."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from loop.config import LoopConfig


class LoopState:
    """The run's durable record: its config and each completed phase's result."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data

    @classmethod
    def open(cls, home: Path, run_id: str | None, lc: LoopConfig | None) -> "LoopState":
        root = home / "loops"
        if run_id is None:  # a new run
            run_id = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + f"-s{lc.seed}"
            state = cls(root / run_id / "state.json", {"run_id": run_id, "config": lc.model_dump(), "phases": {}})
            state.save()
            return state
        if run_id == "last":
            runs = sorted(root.glob("*/state.json"), key=lambda p: p.stat().st_mtime)
            if not runs:
                raise FileNotFoundError(f"no loop run under {root} to resume")
            run_id = runs[-1].parent.name
        path = root / run_id / "state.json"
        if not path.exists():
            raise FileNotFoundError(f"no loop run {run_id!r} under {root}")
        return cls(path, json.loads(path.read_text()))

    @property
    def run_id(self) -> str:
        return self.data["run_id"]

    @property
    def config(self) -> LoopConfig:
        return LoopConfig.model_validate(self.data["config"])

    def done(self, phase: str) -> dict | None:
        return self.data["phases"].get(phase)

    def record(self, phase: str, result: dict) -> None:
        self.data["phases"][phase] = result
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.path)
