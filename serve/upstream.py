"""Talking to a deployment: what the gateway adds to a request, and takes back out of the reply.

The gateway always asks the engine for what a trajectory needs (token ids, logprobs, usage,
the serving worker) and then hides whatever the client did not ask for, so a client sees the
response it would have got from the deployment directly, under the model name it used.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from serve.errors import APIError
from serve.nvext import client_nvext, client_reply

# Dynamo's OpenAI extension: engine-exact ids and the serving worker (see DESIGN.md, traces).
CAPTURE_FIELDS = ("completion_token_ids", "engine_data", "worker_id")
PROMPT_KEYS = {"chat": "messages", "text_completion": "prompt"}  # where an operation's prompt is


class Rewrite:
    """The upstream body for one client request, and how to undo it on the way back."""

    def __init__(
        self,
        body: dict[str, Any],
        operation: str,
        upstream_model: str,
        grammar: str | None = None,
        prompt_json: bytes | None = None,
        team: str | None = None,
        admin: bool = False,
    ):
        self.client_body = body
        self.operation = operation
        # only top-level keys and nvext change: a shallow copy, never a copy of the messages (a
        # long agentic prompt would be copied once per request for nothing)
        up = dict(body)
        if prompt_json is not None:  # the prompt goes on as the client's bytes, not encoded again
            up[PROMPT_KEYS[operation]] = msgspec.Raw(prompt_json)
        up["model"] = upstream_model
        nvext, asked = client_nvext(body, admin)
        self.client_nvext_fields = asked
        nvext["extra_fields"] = asked + [f for f in CAPTURE_FIELDS if f not in asked]
        up["nvext"] = nvext
        if team is not None:  # no team's prompts share prefix-cache KV with another's
            up["cache_salt"] = f"{team}:{body['cache_salt']}" if body.get("cache_salt") else team
        if operation == "chat":
            self.client_logprobs = bool(body.get("logprobs"))
            up["logprobs"] = True
        else:
            self.client_logprobs = body.get("logprobs") is not None
            if body.get("logprobs") is None:
                up["logprobs"] = 1
        self.client_usage = not body.get("stream") or bool((body.get("stream_options") or {}).get("include_usage"))
        if body.get("stream"):
            up["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        if grammar is not None:
            # The gateway enforces tool_choice / parallel_tool_calls itself, with this grammar,
            # and parses the GLM markup; the engine just generates under the constraint.
            up.pop("tool_choice", None)
            up.pop("parallel_tool_calls", None)
            up["guided_grammar"] = grammar
        self.upstream_body = up

    def client_view(self, obj: dict, alias: str) -> dict | None:
        """The response object as the client should see it; None drops a stream chunk."""
        if "model" in obj:
            obj["model"] = alias
        if not self.client_usage and obj.get("usage") is not None:
            if not obj.get("choices"):
                return None  # the usage-only chunk the client did not ask for
            obj.pop("usage", None)
        if not self.client_logprobs:
            for choice in obj.get("choices") or []:
                choice.pop("logprobs", None)
        nvext = obj.get("nvext")
        if nvext is not None:
            shown = client_reply(nvext, self.client_nvext_fields) if isinstance(nvext, dict) else {}
            if shown:
                obj["nvext"] = shown
            else:
                obj.pop("nvext", None)
        return obj


def upstream_error(status: int, text: str) -> APIError:
    """Turn a deployment's error reply (Dynamo's flat shape or OpenAI's) into an APIError."""
    message, param = text.strip() or f"upstream returned HTTP {status}", None
    try:
        body = json.loads(text)
        err = body.get("error", body) if isinstance(body, dict) else {}
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            param = err.get("param")
        elif isinstance(err, str):
            message = err
    except (json.JSONDecodeError, AttributeError):
        pass
    if 400 <= status < 500:
        return APIError(status, message, param=param)
    return APIError(502 if status >= 500 else status, f"deployment error ({status}): {message}", type="server_error")
