"""Trace rows -> Hugging Face datasets (SFT, RL, preference), each with a manifest.

The SQL picks the trajectories (it must return whole ``traces`` rows; a ``reward`` column in the
result overrides the stored one). Rows are ordered by trace id and hashed, so the same query
over the same traces gives the same content hash: a checkpoint names its data by that hash.
Every export keeps the engine-exact token ids; prompts stored as prefix references are rebuilt.

- ``sft``: ``messages`` (system/user/assistant/tool, with ``tool_calls`` and
  ``reasoning_content``), ``tools`` (JSON text), plus token ids;
- ``rl``: token-level rows as verifiers / prime-rl consume them: ``prompt_ids``,
  ``prompt_mask``, ``completion_ids``, ``completion_mask``, ``completion_logprobs``,
  ``reward`` (and ``advantage``: reward minus the mean reward of its prompt's group);
- ``preference``: for each prompt with differently rewarded completions, the best as
  ``chosen`` and the worst as ``rejected``.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from traces.schema import SCHEMA_VERSION
from traces.store import TraceStore

Kind = Literal["sft", "rl", "preference"]
EXPORT_FORMAT_VERSION = 1
DEFAULT_SQL = "SELECT * FROM traces WHERE http_status = 200 AND error IS NULL"


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.get("text", "") for p in content)


def _tool_calls(raw) -> list[dict]:
    calls = json.loads(raw) if isinstance(raw, str) else (raw or [])
    return [
        {
            "id": c.get("id") or "",
            "type": "function",
            "function": {
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"]
                if isinstance(c["function"]["arguments"], str)
                else json.dumps(c["function"]["arguments"]),
            },
        }
        for c in calls
    ]


def _message(role: str, content, tool_calls=None, reasoning=None, tool_call_id=None) -> dict:
    # One struct type for every message, so Arrow can store the list.
    return {
        "role": role,
        "content": _text(content),
        "reasoning_content": reasoning,
        "tool_calls": _tool_calls(tool_calls),
        "tool_call_id": tool_call_id,
    }


def prompt_messages(row: dict) -> list[dict]:
    prompt = json.loads(row["gen_ai_input_messages"]) if row.get("gen_ai_input_messages") else None
    if row.get("gen_ai_operation_name") != "chat":
        return [_message("user", prompt if isinstance(prompt, str) else "")]
    return [
        _message(m["role"], m.get("content"), m.get("tool_calls"), m.get("reasoning_content"), m.get("tool_call_id"))
        for m in prompt or []
    ]


def completion_message(row: dict) -> dict:
    return _message("assistant", row.get("response_content"), row.get("response_tool_calls"), row.get("response_reasoning"))


def _sft(rows: list[dict]) -> list[dict]:
    return [
        {
            "trace_id": r["trace_id"],
            "messages": prompt_messages(r) + [completion_message(r)],
            "tools": r.get("gen_ai_tool_definitions"),
            "prompt_token_ids": r["prompt_token_ids"],
            "completion_token_ids": r["completion_token_ids"],
            "model": r["gen_ai_request_model"],
            "checkpoint_version": r["checkpoint_version"],
            "reward": r.get("reward"),
        }
        for r in rows
    ]


def _prompt_key(r: dict) -> str:
    return hashlib.sha256(json.dumps(r["prompt_token_ids"]).encode()).hexdigest()


def _rl(rows: list[dict]) -> list[dict]:
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("reward") is not None:
            groups[_prompt_key(r)].append(r["reward"])
    out = []
    for r in rows:
        prompt, completion = r["prompt_token_ids"] or [], r["completion_token_ids"] or []
        rewards = groups.get(_prompt_key(r), [])
        reward = r.get("reward")
        out.append(
            {
                "trace_id": r["trace_id"],
                "example_id": r.get("example_id"),
                "rollout_id": r.get("rollout_id"),
                "prompt_ids": prompt,
                "prompt_mask": [0] * len(prompt),
                "completion_ids": completion,
                "completion_mask": [1] * len(completion),
                "completion_logprobs": r["completion_logprobs"] or [],
                "reward": reward,
                "advantage": None if reward is None else reward - sum(rewards) / len(rewards),
                "checkpoint_version": r["checkpoint_version"],
            }
        )
    return out


def _preference(rows: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("reward") is not None:
            groups[_prompt_key(r)].append(r)
    out = []
    for key in sorted(groups):
        # ties go to the earliest trace id, so the pairs are reproducible
        best = min(groups[key], key=lambda r: (-r["reward"], r["trace_id"]))
        worst = min(groups[key], key=lambda r: (r["reward"], r["trace_id"]))
        if best["reward"] == worst["reward"]:
            continue
        out.append(
            {
                "prompt": prompt_messages(best),
                "chosen": [completion_message(best)],
                "rejected": [completion_message(worst)],
                "prompt_token_ids": best["prompt_token_ids"],
                "chosen_token_ids": best["completion_token_ids"],
                "rejected_token_ids": worst["completion_token_ids"],
                "chosen_reward": best["reward"],
                "rejected_reward": worst["reward"],
                "chosen_trace_id": best["trace_id"],
                "rejected_trace_id": worst["trace_id"],
            }
        )
    return out


BUILDERS = {"sft": _sft, "rl": _rl, "preference": _preference}


def content_hash(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def select_rows(store: TraceStore, sql: str, reward_name: str = "reward") -> list[dict]:
    """Trace rows from ``sql`` with full prompt ids and a ``reward`` (from the SQL, else the
    ``rewards`` view), ordered by trace id."""
    if not store.sandbox:  # a team's sandbox is a fresh snapshot already, and fixed
        store.refresh()
    table = store.sql(f"SELECT * FROM ({sql}) ORDER BY trace_id")
    missing = {"trace_id", "gen_ai_input_messages", "completion_token_ids"} - set(table.column_names)
    if missing:
        raise ValueError(f"the export query must return whole trace rows; missing {sorted(missing)}")
    rows = table.to_pylist()
    if "prompt_token_ids" not in table.column_names:  # rebuild prompts stored as references
        prompts = store.prompt_token_ids([r["trace_id"] for r in rows])
        for r in rows:
            r["prompt_token_ids"] = prompts.get(r["trace_id"])
    if "reward" not in table.column_names:
        rewards = dict(
            store.con.execute(
                "SELECT trace_id, reward FROM rewards WHERE name = ? AND reward IS NOT NULL", [reward_name]
            ).fetchall()
        )
        for r in rows:
            r["reward"] = rewards.get(r["trace_id"])
    return rows


def export(store: TraceStore, kind: Kind, out_dir: str | Path, sql: str = DEFAULT_SQL, reward_name: str = "reward") -> dict:
    """Write ``out_dir`` (``datasets.save_to_disk`` layout + ``data.parquet`` +
    ``manifest.json``); returns the manifest."""
    from datasets import Dataset

    if kind not in BUILDERS:
        raise ValueError(f"unknown export kind {kind!r}; choose one of {sorted(BUILDERS)}")
    rows = BUILDERS[kind](select_rows(store, sql, reward_name))
    if not rows:
        raise ValueError(f"the query gave no {kind} rows (for preference: no prompt has completions with different rewards)")
    out = Path(out_dir)
    ds = Dataset.from_list(rows)
    ds.save_to_disk(str(out))
    ds.to_parquet(str(out / "data.parquet"))
    manifest = {
        "kind": kind,
        "sql": sql,
        "reward_name": reward_name,
        "rows": len(rows),
        "content_hash": content_hash(rows),
        "trace_schema_version": SCHEMA_VERSION,
        "export_format_version": EXPORT_FORMAT_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
