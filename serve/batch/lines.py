"""A batch's input file, checked line by line when the batch is created, and the shapes of
its output lines.

Every line must be a JSON object ``{custom_id, method: "POST", url, body}`` whose ``custom_id``
is unique in the file, whose ``url`` is the batch's endpoint, and whose ``body`` is a valid
non-streaming request for that route naming a model the gateway serves. A line that fails is
not run: it goes to the error file with the reason; the others run.
"""

from __future__ import annotations

import json
from collections.abc import Container

from pydantic import ValidationError

from serve.errors import invalid_request
from serve.protocol import ChatCompletionRequest, CompletionRequest
from traces.batch_store import new_id

ENDPOINTS = {"/v1/chat/completions": ("chat", ChatCompletionRequest), "/v1/completions": ("text_completion", CompletionRequest)}


def output_line(
    custom_id: str | None, status: int | None, body: dict | None, error: dict | None = None, request_id: str | None = None
) -> dict:
    """One line of an output or error file, as OpenAI writes it."""
    response = None if status is None else {"status_code": status, "request_id": request_id, "body": body}
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": error}


def _refused(n: int, custom_id: str | None, code: str, message: str) -> dict:
    return {
        "n": n,
        "ok": False,
        "line": output_line(custom_id, None, None, {"code": code, "message": f"line {n + 1}: {message}"}),
    }


def check_lines(data: bytes, endpoint: str, models: Container[str], max_lines: int) -> tuple[list[dict], list[dict]]:
    """(lines to run ``{n, custom_id, body}``, results for the lines refused). ``n`` counts
    from 0 over the file's non-empty lines."""
    _, model_cls = ENDPOINTS[endpoint]
    good, refused, seen = [], [], set()
    raw_lines = [raw for raw in data.split(b"\n") if raw.strip()]
    if len(raw_lines) > max_lines:
        raise ValueError(f"the file has {len(raw_lines)} lines; a batch takes at most {max_lines} (gateway.batch.max_lines)")
    for n, raw in enumerate(raw_lines):
        try:
            line = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            refused.append(_refused(n, None, "invalid_json", f"not valid JSON ({exc})"))
            continue
        if not isinstance(line, dict):
            refused.append(_refused(n, None, "invalid_request", "a line must be a JSON object"))
            continue
        cid = line.get("custom_id")
        why = _problem(line, cid, endpoint, models, seen, model_cls)
        if why:
            refused.append(_refused(n, cid if isinstance(cid, str) else None, *why))
            continue
        seen.add(cid)
        good.append({"n": n, "custom_id": cid, "body": line["body"]})
    return good, refused


def _problem(line: dict, cid, endpoint: str, models: Container[str], seen: set, model_cls) -> tuple[str, str] | None:
    if not isinstance(cid, str) or not cid:
        return "missing_custom_id", "custom_id must be a non-empty string"
    if cid in seen:
        return "duplicate_custom_id", f"custom_id {cid!r} is used by an earlier line"
    if line.get("method", "POST") != "POST":
        return "invalid_method", f"method must be POST, not {line.get('method')!r}"
    if line.get("url") != endpoint:
        return "mismatched_url", f"url {line.get('url')!r} is not the batch's endpoint {endpoint!r}"
    body = line.get("body")
    if not isinstance(body, dict):
        return "invalid_body", "body must be a JSON object"
    try:
        model_cls.model_validate(body)
    except ValidationError as exc:
        return "invalid_body", invalid_request(exc.errors()).message
    if body.get("stream"):
        return "invalid_body", "stream is not supported in a batch"
    if body["model"] not in models:
        return "model_not_found", f"the model {body['model']!r} does not exist"
    return None
