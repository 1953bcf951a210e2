"""Trace rows -> a Hugging Face dataset on disk, with a manifest naming exactly what went in.

The SQL picks the trajectories; the export keeps the engine-exact token ids next to the chat
messages, so a trainer can use either. Rows are ordered by trace id and hashed, so the same
query over the same traces always gives the same content hash (a checkpoint can name its data).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

from traces.schema import SCHEMA_VERSION
from traces.store import TraceStore

DEFAULT_SFT_SQL = ("SELECT * FROM traces WHERE http_status = 200 AND error IS NULL "
                   "AND finish_reason IS NOT NULL")


def _sft_row(r: dict, prompt_ids: list[int]) -> dict:
    prompt = json.loads(r["gen_ai_input_messages"]) if r["gen_ai_input_messages"] else None
    if r["gen_ai_operation_name"] == "chat":
        messages = [{"role": m["role"], "content": _text(m.get("content"))} for m in prompt]
    else:
        messages = [{"role": "user", "content": prompt if isinstance(prompt, str) else ""}]
    messages.append({"role": "assistant", "content": r["response_content"] or ""})
    return {
        "trace_id": r["trace_id"], "messages": messages,
        "prompt_token_ids": prompt_ids, "completion_token_ids": r["completion_token_ids"],
        "model": r["gen_ai_request_model"], "checkpoint_version": r["checkpoint_version"],
    }


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.get("text", "") for p in content)


def content_hash(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def export_sft(store: TraceStore, out_dir: str | Path, sql: str = DEFAULT_SFT_SQL) -> dict:
    """Write ``out_dir`` (``datasets.save_to_disk`` layout + ``data.parquet`` +
    ``manifest.json``); returns the manifest."""
    from datasets import Dataset

    store.refresh()
    table = store.sql(f"SELECT * FROM ({sql}) ORDER BY trace_id")
    missing = {"trace_id", "gen_ai_input_messages", "response_content"} - set(table.column_names)
    if missing:
        raise ValueError(f"the export query must return whole trace rows; missing {sorted(missing)}")
    records = table.to_pylist()
    if "prompt_token_ids" in table.column_names:  # selected from traces_full
        prompts = {r["trace_id"]: r["prompt_token_ids"] for r in records}
    else:  # rebuild prompts stored as prefix references
        prompts = store.prompt_token_ids([r["trace_id"] for r in records])
    rows = [_sft_row(r, prompts.get(r["trace_id"])) for r in records]
    if not rows:
        raise ValueError("the export query matched no traces")
    out = Path(out_dir)
    ds = Dataset.from_list(rows)
    ds.save_to_disk(str(out))
    ds.to_parquet(str(out / "data.parquet"))
    manifest = {"kind": "sft", "sql": sql, "rows": len(rows), "content_hash": content_hash(rows),
                "trace_schema_version": SCHEMA_VERSION,
                "created_at": datetime.now(timezone.utc).isoformat()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
