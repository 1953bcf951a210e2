"""A batch's public object, its live counts, and its end: output and error files.

Also the recovery path of a crash: a line whose trace row is stored (the trace is durable
before a line's answer is) but whose result had not reached the results file is answered from
that row, so it is neither lost nor run a second time.
"""

from __future__ import annotations

import json
import time

from serve.batch.lines import output_line
from traces.batch_store import ACTIVE, BatchStore, FileStore
from traces.store import TraceStore


def counts(store: BatchStore, batch: dict) -> tuple[dict, dict]:
    """(request_counts, usage) from the results stored so far."""
    results = store.results(batch["id"]).values()
    ok = [r for r in results if r["ok"]]
    tin = sum((r.get("usage") or {}).get("prompt_tokens") or 0 for r in ok)
    tout = sum((r.get("usage") or {}).get("completion_tokens") or 0 for r in ok)
    return (
        {"total": batch["_total"], "completed": len(ok), "failed": len(results) - len(ok)},
        {"input_tokens": tin, "output_tokens": tout, "total_tokens": tin + tout},
    )


def public(store: BatchStore, batch: dict) -> dict:
    """The batch as OpenAI shows it (the team and the scheduler's fields stay inside)."""
    out = {k: v for k, v in batch.items() if not k.startswith("_") and k != "team"}
    if batch["status"] in ACTIVE:
        out["request_counts"], out["usage"] = counts(store, batch)
    return out


def finalize(store: BatchStore, files: FileStore, batch_id: str, stale_s: float) -> None:
    """Write the output and error files and end the batch: completed, cancelled or expired.
    Only once no replica holds a live lease on its lines; one replica at a time (another takes
    over a finalizer that has been silent for ``stale_s``)."""
    if store.live_leases(batch_id):
        return
    now = time.time()

    def take(b: dict) -> bool:
        if b["status"] not in ACTIVE or now - b.get("_finalizing", 0) < stale_s:
            return False
        b["_finalizing"] = now
        if b["status"] == "in_progress":
            b.update(status="finalizing", finalizing_at=int(now))
        return True

    batch = store.update(batch_id, take)
    if batch.get("_finalizing") != now:
        return
    results = store.results(batch_id)
    expired = bool(batch.get("_expired"))
    if expired:  # OpenAI's rule: lines an expired batch never ran are failed, with this code
        for line in store.lines(batch_id):
            if line["n"] not in results:
                results[line["n"]] = {
                    "n": line["n"],
                    "ok": False,
                    "line": output_line(
                        line["custom_id"],
                        None,
                        None,
                        {"code": "batch_expired", "message": "the batch expired before this line ran"},
                    ),
                }
    ordered = [results[n] for n in sorted(results)]
    file_ids = {}
    for key, ok in (("output_file_id", True), ("error_file_id", False)):
        part = [r["line"] for r in ordered if r["ok"] is ok]
        if part:
            data = b"".join(json.dumps(line).encode() + b"\n" for line in part)
            file_ids[key] = files.put(batch["team"], f"{batch_id}_{'output' if ok else 'error'}.jsonl", "batch_output", data)[
                "id"
            ]
    request_counts, usage = counts(store, batch)
    if expired:
        request_counts["failed"] = request_counts["total"] - request_counts["completed"]
    status = "expired" if expired else "cancelled" if batch["status"] == "cancelling" else "completed"

    def end(b: dict) -> bool:
        b.update(file_ids, status=status, request_counts=request_counts, usage=usage, _finalizing=0)
        b[f"{status}_at"] = int(time.time())
        return True

    store.update(batch_id, end)
    store.forget(batch_id)


def result_from_trace(row: dict, endpoint: str) -> dict:
    """A line's result rebuilt from its stored trace row."""
    n = int(row["trace_id"].rsplit("-", 1)[1])
    cid = row["custom_id"]
    if row["http_status"] != 200 or row["error"]:
        message = row["error"] or f"HTTP {row['http_status']}"
        body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
        return {
            "n": n,
            "ok": False,
            "line": output_line(
                cid, row["http_status"], body, {"code": "request_failed", "message": message}, request_id=row["trace_id"]
            ),
        }
    tin, tout = row["gen_ai_usage_input_tokens"] or 0, row["gen_ai_usage_output_tokens"] or 0
    usage = {"prompt_tokens": tin, "completion_tokens": tout, "total_tokens": tin + tout}
    if endpoint == "/v1/chat/completions":
        message = {"role": "assistant", "content": row["response_content"]}
        if row["response_tool_calls"]:
            message["tool_calls"] = json.loads(row["response_tool_calls"])
        choice = {"index": 0, "message": message, "finish_reason": row["finish_reason"]}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": row["response_content"] or "", "finish_reason": row["finish_reason"]}
        kind = "text_completion"
    body = {
        "id": row["gen_ai_response_id"],
        "object": kind,
        "created": int(row["time_received"].timestamp()),
        "model": row["gen_ai_request_model"],
        "choices": [choice],
        "usage": usage,
    }
    return {"n": n, "ok": True, "usage": usage, "line": output_line(cid, 200, body, request_id=row["trace_id"])}


def traced_lines(traces_dir: str, batch_id: str, endpoint: str, lines: list[int]) -> list[dict]:
    """Results for those of ``lines`` that already have a trace row."""
    wanted = {f"tr-{batch_id}-{n}" for n in lines}
    rows = TraceStore(traces_dir).sql("SELECT * FROM traces WHERE batch_id = $1", params=[batch_id]).to_pylist()
    return [result_from_trace(r, endpoint) for r in rows if r["trace_id"] in wanted]
