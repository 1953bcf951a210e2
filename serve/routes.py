"""The alias table: which deployment and checkpoint each public model name serves, shared by
every gateway replica and kept across restarts (serve/shared_table.py)."""

from __future__ import annotations

from pathlib import Path

from serve.config import ModelRoute
from serve.shared_state import SharedState
from serve.shared_table import SharedTable

HASH = "flywheel:routes"


class RouteTable(SharedTable[ModelRoute]):
    def __init__(self, initial: dict[str, ModelRoute], state: SharedState, path: str | Path | None):
        super().__init__(ModelRoute, HASH, initial, state, path)
