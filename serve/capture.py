"""Builds one trajectory record from a request and the engine's response as it passes through.

The gateway asks Dynamo for engine-exact data (``nvext.extra_fields``: ``completion_token_ids``
per chunk, ``engine_data`` with the prompt token ids the engine used on the final chunk,
``worker_id``) and for per-token logprobs; this module reads those fields out of unary
responses and stream chunks alike, so both paths produce identical records.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from serve.config import ModelRoute
from serve.json_codec import text
from traces.schema import TraceRecord
from serve.outcome import Outcome


API_OF_OPERATION = {"chat": "chat", "text_completion": "completions", "generate": "generate"}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _ms(a: datetime | None, b: datetime | None) -> float | None:
    return (b - a).total_seconds() * 1000 if a and b else None


@dataclass
class RequestContext:
    """Who asked, for which trajectory: filled from the request before it is forwarded."""

    trace_id: str
    operation: str  # "chat" | "text_completion"
    body: dict[str, Any]  # the client's request as received
    alias: str
    upstream_model: str
    checkpoint_version: str
    deployment: str
    team: str = "default"
    api_key_id: str | None = None
    admin: bool = False  # the admin key: may see which worker served it (nvext)
    session_id: str | None = None
    parent_trace_id: str | None = None
    env_id: str | None = None
    example_id: str | None = None
    rollout_id: str | None = None
    batch_id: str | None = None  # a Batch API line: its batch and custom_id
    custom_id: str | None = None
    # the prompt (messages, or a completion's prompt) as the client wrote it, when the hot path
    # kept it: passed upstream and stored as these bytes, never written out again
    prompt_json: bytes | None = field(default=None, repr=False)
    # a request a dedicated deployment spilled to serverless: the serverless model, whose
    # per-token price it is charged (None: the alias's)
    priced_as: str | None = None
    arm: str | None = None  # the arm of a split alias it took (serve/split.py)
    shadow_route: ModelRoute | None = None  # a shadow arm's copy: the route it goes to, answered to no one
    # a request translated from another API (serve/api/responses.py, messages.py): its name and
    # the client's own request as JSON text; the body above is the chat request it became
    api: str | None = None
    api_request: str | None = field(default=None, repr=False)
    received: datetime = field(default_factory=_now)
    received_mono: float = field(default_factory=time.monotonic)  # the same moment, for durations

    @property
    def scoped_session(self) -> str | None:
        """The session as deployments see it: within its team, so no team can pin, move or
        share another team's session by using the same id."""
        return f"{self.team}/{self.session_id}" if self.session_id else None

    @property
    def price_model(self) -> str:
        return self.priced_as or self.alias

    def take(self, route: ModelRoute) -> None:
        """Record ``route`` as the one this request goes by (a split's arm, or the serverless
        route it spilled to) in place of its alias's; the deployment is set per attempt."""
        self.upstream_model, self.checkpoint_version = route.upstream_model, route.checkpoint_version

    @classmethod
    def for_route(cls, route: ModelRoute | None, trace_id: str, operation: str, body: dict, **who: str | None) -> RequestContext:
        """A context for ``body``, with what its model's route says (``route`` is the routing
        table's entry, or None for an unknown model: forwarding then answers 404)."""
        return cls(
            trace_id=trace_id,
            operation=operation,
            body=body,
            alias=body["model"],
            upstream_model=route.upstream_model if route else None,
            checkpoint_version=route.checkpoint_version if route else None,
            deployment=route.deployment if route else None,
            **who,
        )


class Capture:
    def __init__(self, ctx: RequestContext):
        self.ctx = ctx
        self.admitted: datetime | None = None
        self.sent_mono: float | None = None  # when the request went to the deployment that answered
        self.first_token: datetime | None = None
        self._first_token_mono: float | None = None
        self._last_token_mono: float | None = None
        self.response_id: str | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.engine_data: dict = {}
        self.worker_id: str | None = None
        self.usage: dict = {}

    def mark_admitted(self) -> None:
        self.admitted = _now()

    def first_token_times(self) -> tuple[float, float] | None:
        """(time to first token, of it the gateway's part before sending) in seconds; None
        before a first token."""
        if self._first_token_mono is None or self.sent_mono is None:
            return None
        return self._first_token_mono - self.ctx.received_mono, self.sent_mono - self.ctx.received_mono

    # -- reading the engine's output ----------------------------------------------------------

    def on_chunk(self, chunk: dict) -> None:
        """One streamed chunk (chat.completion.chunk or text_completion)."""
        self._read(chunk, delta=True)

    def on_response(self, body: dict) -> None:
        """A whole unary response."""
        self._read(body, delta=False)

    def set_output(self, content: str | None, tool_calls: list[dict]) -> None:
        """Replace the raw text with what the gateway parsed out of it (content, tool calls)."""
        self.content = [content] if content else []
        self.tool_calls = dict(enumerate(tool_calls))

    def _read(self, obj: dict, delta: bool) -> None:
        self.response_id = self.response_id or obj.get("id")
        if obj.get("usage"):
            self.usage = obj["usage"]
        nvext = obj.get("nvext") or {}
        ids = nvext.get("completion_token_ids") or []
        got_tokens = bool(ids)
        self.completion_ids.extend(int(i) for i in ids)
        if nvext.get("engine_data"):
            self.engine_data = nvext["engine_data"]
        worker = nvext.get("worker_id") or {}
        if worker.get("decode_worker_id") is not None:
            self.worker_id = str(worker["decode_worker_id"])
        for choice in obj.get("choices") or []:
            part = choice.get("delta" if delta else "message") or {}
            text = part.get("content") if part else choice.get("text")
            if text:
                self.content.append(text)
                got_tokens = True
            if part.get("reasoning_content"):
                self.reasoning.append(part["reasoning_content"])
                got_tokens = True
            for tc in part.get("tool_calls") or []:
                self._merge_tool_call(tc)
            self._read_logprobs(choice.get("logprobs"))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if got_tokens:
            mono = time.monotonic()
            if self.first_token is None:
                self.first_token, self._first_token_mono = _now(), mono
            self._last_token_mono = mono

    def _merge_tool_call(self, tc: dict) -> None:
        slot = self.tool_calls.setdefault(
            tc.get("index", len(self.tool_calls)), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        slot["id"] = tc.get("id") or slot["id"]
        fn = tc.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        args = fn.get("arguments")
        slot["function"]["arguments"] += args if isinstance(args, str) else json.dumps(args) if args else ""

    def _read_logprobs(self, lp: dict | None) -> None:
        if not lp:
            return
        if lp.get("content") is not None:  # chat shape
            self.logprobs.extend(float(e["logprob"]) for e in lp["content"])
        elif lp.get("token_logprobs") is not None:  # legacy completions shape
            self.logprobs.extend(float(x) for x in lp["token_logprobs"] if x is not None)

    # -- the record ---------------------------------------------------------------------------

    def record(self, http_status: int, error: str | None = None, outcome: Outcome | None = None) -> dict:
        """The trace, built as a :class:`TraceRecord` (a misspelt field fails here) and handed
        to the writer as its fields."""
        c, done = self.ctx, _now()
        body = c.body
        completion_ids = self.completion_ids or self.engine_data.get("completion_token_ids") or []
        n_out = len(completion_ids)
        itl = None
        if n_out > 1 and self._first_token_mono is not None and self._last_token_mono is not None:
            itl = (self._last_token_mono - self._first_token_mono) * 1000 / (n_out - 1)
        usage = self.usage or {}
        prompt = body.get("messages") if c.operation == "chat" else body.get("prompt")
        return TraceRecord(
            trace_id=c.trace_id,
            gen_ai_conversation_id=c.session_id,
            parent_trace_id=c.parent_trace_id,
            team=c.team,
            api_key_id=c.api_key_id,
            gen_ai_operation_name=c.operation,
            api=c.api or API_OF_OPERATION.get(c.operation, c.operation),
            api_request=c.api_request,
            gen_ai_request_model=c.alias,
            gen_ai_response_model=c.upstream_model,
            checkpoint_version=c.checkpoint_version,
            arm=c.arm,
            deployment=c.deployment,
            worker_id=self.worker_id,
            gen_ai_response_id=self.response_id,
            stream=bool(body.get("stream")),
            gen_ai_input_messages=c.prompt_json.decode() if c.prompt_json is not None else text(prompt),
            gen_ai_tool_definitions=text(body["tools"]) if body.get("tools") else None,
            tool_choice=text(body["tool_choice"]) if body.get("tool_choice") else None,
            sampling_params=text(_sampling(body)),
            response_content="".join(self.content) if self.content else None,
            response_reasoning="".join(self.reasoning) if self.reasoning else None,
            response_tool_calls=text([self.tool_calls[i] for i in sorted(self.tool_calls)]) if self.tool_calls else None,
            finish_reason=self.finish_reason,
            prompt_token_ids=self.engine_data.get("prompt_token_ids"),
            completion_token_ids=completion_ids,
            completion_logprobs=self.logprobs or self.engine_data.get("completion_logprobs"),
            time_received=c.received,
            time_admitted=self.admitted,
            time_first_token=self.first_token,
            time_done=done,
            queue_wait_ms=_ms(c.received, self.admitted),
            ttft_ms=_ms(c.received, self.first_token),
            mean_itl_ms=itl,
            gen_ai_usage_input_tokens=usage.get("prompt_tokens"),
            gen_ai_usage_output_tokens=usage.get("completion_tokens"),
            gen_ai_usage_cache_read_input_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            http_status=http_status,
            error=error,
            outcome=outcome.value if outcome is not None else None,
            env_id=c.env_id,
            example_id=c.example_id,
            rollout_id=c.rollout_id,
            batch_id=c.batch_id,
            custom_id=c.custom_id,
        ).as_dict()


_SAMPLING_KEYS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "logprobs",
    "top_logprobs",
    "parallel_tool_calls",
    "response_format",
)


def _sampling(body: dict) -> dict:
    return {k: body[k] for k in _SAMPLING_KEYS if body.get(k) is not None}
