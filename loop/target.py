"""What a loop is handed: the gateway to reach and the key to reach it with, and where the
platform keeps what the loop reads by file (the trace store, the checkpoint registry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoopTarget:
    gateway_url: str
    key: str  # a live team key: rollouts run, and are billed and scoped, as this team
    team: str  # the key's team and id, which scope the loop's training rows
    key_id: str | None
    admin_key: str | None  # for the hot-swap through the gateway's admin API
    alias: str  # the model alias the loop rolls out on and releases to
    deployment: str  # the deployment whose workers load the checkpoints
    base_model: Path  # the served base checkpoint
    warm_base: Path  # the base after its warm-up (deploy/models/warm_model.py): what turns train from
    warm_version: str  # its version in the registry
    home: Path  # datasets, checkpoints, warmed models and loops/<run>/ go under here
    traces: Path
    registry: Path
