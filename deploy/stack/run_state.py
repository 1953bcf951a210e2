"""The run dir's shared facts: the lock `flywheel up` and the supervisor serialise on, and the
state the supervisor records for `flywheel status`. Its own module so that the launcher and the
supervisor each depend on it instead of on each other."""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path

STATE_FILE = "supervisor.json"
LOCK_FILE = "stack.lock"


@contextmanager
def stack_lock(run_dir: Path, blocking: bool = True):
    """Held by `up` while it starts components and by the supervisor while it restarts one.
    Yields False (and holds nothing) when ``blocking`` is off and someone else holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def state_file(host: str | None = None) -> str:
    """Each supervisor's own record (on several hosts, one per host's agent)."""
    return f"supervisor-{host}.json" if host else STATE_FILE


def save_state(run_dir: Path, state: dict, host: str | None = None) -> None:
    """Replace what a supervisor recorded per component (a reader never sees half a file)."""
    tmp = run_dir / f".{state_file(host)}.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, run_dir / state_file(host))


def state_files(run_dir: Path) -> list[Path]:
    """Every supervisor's record in the run dir."""
    return sorted(run_dir.glob("supervisor*.json"))


def load_state(run_dir: Path) -> dict:
    """What the supervisors recorded per component (restarts, last exit reason, last restart)."""
    out = {}
    for path in state_files(run_dir):
        try:
            out |= json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            continue
    return out
