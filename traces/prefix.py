"""Prefix references: store an agent turn's prompt as "that earlier turn, plus these new tokens".

A typical agent turn re-sends the whole conversation (~140K tokens) to add a few thousand. The
encoder remembers the last turns it saw (prompt + completion token ids) and stores a new prompt
as the longest common prefix with its reference turn plus the remainder: always exact, because
the prefix length is measured, not assumed. A prompt that shares nothing is stored whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixEncoder:
    """Thread-safe; bounded by total cached tokens (least recently used turns go first)."""

    def __init__(self, max_tokens: int = 64_000_000, min_shared: int = 64):
        self.max_tokens, self.min_shared = max_tokens, min_shared
        # trace -> (team, partition, seq); a reference never crosses teams (it would let one team's
        # row point into another's and read its prefix length back)
        self._turns: OrderedDict[str, tuple[str | None, str, np.ndarray]] = OrderedDict()
        self._session_last: dict[tuple[str | None, str], str] = {}  # (team, session) -> last turn
        self._tokens = 0
        self._lock = threading.Lock()

    def encode(self, record: dict, partition: str) -> tuple[dict, Callable[[], None] | None]:
        """Replace ``prompt_token_ids`` with the prefix-reference columns (a new dict), and the
        call that makes this turn a reference for later ones (None: it cannot be one). Make it
        only once the row is durable: a later turn stored as a reference to a row that was
        never written could not be rebuilt."""
        out = dict(record)
        prompt = out.pop("prompt_token_ids", None)
        out.update(prompt_prefix_trace_id=None, prompt_prefix_len=None, prompt_new_token_ids=prompt)
        session = record.get("gen_ai_conversation_id")
        if not prompt or not (session or record.get("parent_trace_id")):
            return out, None  # a one-off request: nothing to share a prefix with
        arr = np.asarray(prompt, dtype=np.int32)
        with self._lock:
            ref = self._reference(record, session, partition)
            if ref is not None:
                shared = common_prefix_len(arr, self._turns[ref][2])
                if shared >= self.min_shared:
                    out.update(prompt_prefix_trace_id=ref, prompt_prefix_len=shared, prompt_new_token_ids=prompt[shared:])
        if not session or record.get("http_status", 200) != 200:
            return out, None
        seq = np.concatenate([arr, np.asarray(record.get("completion_token_ids") or [], dtype=np.int32)])

        def remember() -> None:
            with self._lock:
                self._remember(record["trace_id"], record.get("team"), session, partition, seq)

        return out, remember

    def _reference(self, record: dict, session: str | None, partition: str) -> str | None:
        # References stay inside one team and one date partition (so retention never orphans a turn).
        team = record.get("team")
        for ref in (record.get("parent_trace_id"), self._session_last.get((team, session or ""))):
            if ref and ref in self._turns and self._turns[ref][:2] == (team, partition):
                self._turns.move_to_end(ref)
                return ref
        return None

    def _remember(self, trace_id: str, team: str | None, session: str, partition: str, seq: np.ndarray) -> None:
        self._turns[trace_id] = (team, partition, seq)
        self._session_last[(team, session)] = trace_id
        self._tokens += len(seq)
        while self._tokens > self.max_tokens and len(self._turns) > 1:
            old, (_, _, old_seq) = self._turns.popitem(last=False)
            self._tokens -= len(old_seq)
        if len(self._session_last) > 4 * len(self._turns) + 1024:
            self._session_last = {s: t for s, t in self._session_last.items() if t in self._turns}


def reconstruct_prompts(rows: dict[str, dict]) -> dict[str, list[int]]:
    """Full prompt ids for every row whose reference chain is in ``rows``.

    ``rows`` maps trace id -> a dict with ``prompt_prefix_trace_id``, ``prompt_prefix_len``,
    ``prompt_new_token_ids`` and ``completion_token_ids``. Rows whose chain is incomplete are
    left out (never guessed)."""
    full: dict[str, list[int]] = {}

    def resolve(tid: str) -> list[int] | None:
        chain = []
        cur = tid
        while cur not in full:
            row = rows.get(cur)
            if row is None:
                return None
            chain.append(cur)
            ref = row.get("prompt_prefix_trace_id")
            if not ref:
                break
            if ref in chain:
                raise ValueError(f"prefix reference cycle at {ref}")
            cur = ref
        for t in reversed(chain):
            row = rows[t]
            ref = row.get("prompt_prefix_trace_id")
            new = list(row.get("prompt_new_token_ids") or [])
            if not ref:
                full[t] = new
            else:
                base = full[ref] + list(rows[ref].get("completion_token_ids") or [])
                full[t] = base[: row["prompt_prefix_len"]] + new
        return full[tid]

    for tid in rows:
        if tid not in full:
            resolve(tid)
    return full
