"""Two deployment slots, so a new checkpoint can start beside the one serving (blue-green).

Slot 0 is the profile's deployment `local` on the profile's ports. Slot 1 is `local-b`: the same
frontend and workers on those ports + ``PORT_STEP``, with its own discovery directory and process
names (`frontend-b`, `worker-0-b`). The gateway always knows both deployments; aliases say which
one serves. Which slot the stack runs, and on which checkpoint, is kept in
``<home>/run/deployment.json``, so `up`, `down` and the supervisor follow a switch-over.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

PORT_STEP = 50
STATE_FILE = "deployment.json"
SUFFIXES = ("", "-b")


@dataclass
class SlotState:
    slot: int = 0
    model_dir: str | None = None  # None: the profile's model
    version: str = "base"


def read_state(run_dir: Path) -> SlotState:
    try:
        return SlotState(**json.loads((run_dir / STATE_FILE).read_text()))
    except FileNotFoundError:
        return SlotState()


def write_state(run_dir: Path, state: SlotState) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(state)))
    os.replace(tmp, run_dir / STATE_FILE)


def for_slot(cfg, slot: int, model_dir: str | None = None):
    """``cfg`` moved to ``slot``: its frontend, event broker and workers on that slot's ports,
    serving ``model_dir`` (None: the profile's model)."""
    shift = (slot - cfg.slot) * PORT_STEP
    out = cfg.model_copy(deep=True, update={"slot": slot, "serving_model_dir": model_dir})
    out.frontend.port += shift
    if out.frontend.event_broker_port is not None:
        out.frontend.event_broker_port += shift
    out.worker.system_port_base += shift
    out.worker.nixl_port_base += shift
    return out


def worker_index(component: str) -> int:
    """``worker-3`` and ``worker-3-b`` are worker 3."""
    return int(component.split("-")[1])
