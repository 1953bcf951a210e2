"""Responses API conversations: a ``previous_response_id`` turn read back from the trace store.

The store is the record: the earlier turn's trace row holds its chat messages, its output and
the client's own request, so a conversation survives a gateway restart and is the same through
every replica. A turn this replica has just answered is kept in memory too (the row reaches the
store's Parquet files a fraction of a second after its answer, ``trace_flush_age_s``); a turn found in
neither is looked for in the store until ``wait_s`` have passed, since another replica may have
answered it a moment ago.

Team-scoped like every read of the store: another team's response id is a 404, as is one sent
with ``store: false`` (its trace row stays the platform's record; its conversation is not kept)
and one deleted with ``DELETE /v1/responses/{id}`` (a marker file beside the traces, so every
replica sees it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from serve.auth import Caller
from serve.errors import APIError
from serve.query_pool import QueryPool
from serve.trace_query import QueryLimits, query_failure, scoped_query, scoped_store
from serve.translate.responses_answer import trace_id_of
from traces.store import SnapshotGone

DELETED_DIR = "_responses_deleted"
KEPT_IN_MEMORY = 4096
_COLUMNS = (
    "trace_id, team, gen_ai_conversation_id, gen_ai_request_model, api_request, gen_ai_input_messages, "
    "response_content, response_tool_calls, finish_reason, gen_ai_usage_input_tokens, gen_ai_usage_output_tokens, "
    "gen_ai_usage_cache_read_input_tokens, http_status, time_received"
)


@dataclass
class Turn:
    """One answered Responses request, as the next turn and ``GET /v1/responses/{id}`` need it."""

    trace_id: str
    team: str
    session: str | None
    alias: str
    request: dict  # the client's request
    messages: list[dict]  # the chat messages it was sent as (instructions first, when given)
    content: str | None
    tool_calls: list[dict]
    finish: str | None
    usage: dict  # chat's usage shape
    created_at: float

    def conversation(self) -> list[dict]:
        """The messages a next turn continues: this turn's, less its instructions, and its output."""
        earlier = self.messages[1:] if self.request.get("instructions") else list(self.messages)
        reply: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            reply["tool_calls"] = self.tool_calls
        return earlier + [reply]

    @classmethod
    def of_row(cls, row: dict) -> Turn:
        usage = {
            "prompt_tokens": row["gen_ai_usage_input_tokens"] or 0,
            "completion_tokens": row["gen_ai_usage_output_tokens"] or 0,
            "prompt_tokens_details": {"cached_tokens": row["gen_ai_usage_cache_read_input_tokens"] or 0},
        }
        received: datetime | None = row["time_received"]
        return cls(
            trace_id=row["trace_id"],
            team=row["team"],
            session=row["gen_ai_conversation_id"],
            alias=row["gen_ai_request_model"],
            request=json.loads(row["api_request"] or "{}"),
            messages=json.loads(row["gen_ai_input_messages"] or "[]"),
            content=row["response_content"],
            tool_calls=json.loads(row["response_tool_calls"] or "[]"),
            finish=row["finish_reason"],
            usage=usage,
            created_at=received.timestamp() if received else 0.0,
        )


def stored_turn(root: str, trace_id: str, limits: QueryLimits) -> dict | None:
    """The trace row of an answered Responses turn, whichever team's (run in a query worker)."""
    sql = f"SELECT {_COLUMNS} FROM traces WHERE trace_id = ? AND api = 'responses' AND http_status = 200"
    for _ in range(2):  # housekeeping may remove a file under a snapshot: one more on a new one
        try:
            rows = scoped_query(scoped_store(root, None, limits), sql, 1, limits.timeout_s, [trace_id]).to_pylist()
            return rows[0] if rows else None
        except SnapshotGone:
            continue
    return None


class Conversations:
    def __init__(self, traces_dir: str, queries: QueryPool, limits: QueryLimits, wait_s: float):
        self.traces_dir, self.queries, self.limits, self.wait_s = traces_dir, queries, limits, wait_s
        self.deleted_dir = Path(traces_dir, DELETED_DIR)
        self._recent: OrderedDict[str, Turn] = OrderedDict()

    def remember(self, turn: Turn) -> None:
        """A turn this replica answered (with ``store`` on), for a next turn that comes at once."""
        if turn.request.get("store") is False:
            return
        self._recent[turn.trace_id] = turn
        self._recent.move_to_end(turn.trace_id)
        while len(self._recent) > KEPT_IN_MEMORY:
            self._recent.popitem(last=False)

    async def get(self, caller: Caller, response_id: str, param: str | None = None) -> Turn:
        """The turn behind ``response_id`` as ``caller`` may see it, else a 404."""
        missing = APIError(404, f"No response found with id '{response_id}'.", param=param, code="response_not_found")
        trace_id = trace_id_of(response_id)
        if trace_id is None or (self.deleted_dir / trace_id).exists():
            raise missing
        turn = self._recent.get(trace_id) or await self._from_store(trace_id)
        if turn is None or not (caller.admin or turn.team == caller.team) or turn.request.get("store") is False:
            raise missing
        return turn

    async def delete(self, caller: Caller, response_id: str) -> None:
        turn = await self.get(caller, response_id)
        self.deleted_dir.mkdir(parents=True, exist_ok=True)
        (self.deleted_dir / turn.trace_id).touch()
        self._recent.pop(turn.trace_id, None)

    async def _from_store(self, trace_id: str) -> Turn | None:
        """Read across teams (the caller's team is checked after), so that another team's id is
        a 404 at once rather than after ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                row = await self.queries.run(stored_turn, self.traces_dir, trace_id, self.limits)
            except Exception as exc:
                failure = query_failure(exc, self.limits.timeout_s)
                if failure is None:
                    raise
                message = f"could not read the conversation from the trace store: {failure.message}"
                raise APIError(503, message, type="server_error") from None
            if row is not None:
                return Turn.of_row(row)
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.25)
