"""Which trace rows are the loop's own, as SQL over the store's ``traces t``."""

from __future__ import annotations

from traces.sql import sql_string as quote  # the export takes one SELECT: its values are quoted, not bound


def run_scope(team: str, key_id: str | None) -> str:
    """The loop's rows only: ``env_id`` is a client header anyone can send with a guessed run
    id, so what trains the checkpoint is also the team and the key that ran the loop (another
    team's traces and rewards once entered the demo's training data this way)."""
    key = f"t.api_key_id = {quote(key_id)}" if key_id else "t.api_key_id IS NULL"
    return f"t.team = {quote(team)} AND {key}"
