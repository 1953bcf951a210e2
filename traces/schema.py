"""The trajectory record: one Arrow schema, shared by the writer, the store and the exporters.

Column names follow OpenTelemetry's ``gen_ai.*`` attributes where one exists, with dots turned
into underscores so they need no quoting in SQL (``gen_ai.request.model`` ->
``gen_ai_request_model``). Structured request/response parts (messages, tools, tool calls,
sampling params) are JSON text: DuckDB's JSON functions query them and no schema change is
needed when the OpenAI API grows a field. Token ids and logprobs are typed lists, exactly as the
engine returned them, so a trainer can use them without retokenizing.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

_ts = pa.timestamp("us", tz="UTC")

TRACE_SCHEMA = pa.schema([
    ("schema_version", pa.int16()),
    ("trace_id", pa.string()),
    ("gen_ai_conversation_id", pa.string()),        # session id (X-Session-ID)
    ("parent_trace_id", pa.string()),
    ("team", pa.string()),
    ("api_key_id", pa.string()),
    ("gen_ai_operation_name", pa.string()),         # "chat" | "text_completion"
    ("gen_ai_request_model", pa.string()),          # the alias the client asked for
    ("gen_ai_response_model", pa.string()),         # the engine-side model name that served it
    ("checkpoint_version", pa.string()),
    ("deployment", pa.string()),
    ("worker_id", pa.string()),
    ("gen_ai_response_id", pa.string()),
    ("stream", pa.bool_()),
    ("gen_ai_input_messages", pa.string()),         # JSON: messages, or the completion prompt
    ("gen_ai_tool_definitions", pa.string()),       # JSON: tools
    ("tool_choice", pa.string()),                   # JSON
    ("sampling_params", pa.string()),               # JSON: temperature, top_p, max_tokens, seed...
    ("response_content", pa.string()),
    ("response_reasoning", pa.string()),
    ("response_tool_calls", pa.string()),           # JSON: OpenAI tool_calls
    ("finish_reason", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int32())),
    ("completion_token_ids", pa.list_(pa.int32())),
    ("completion_logprobs", pa.list_(pa.float32())),
    ("time_received", _ts),
    ("time_admitted", _ts),
    ("time_first_token", _ts),
    ("time_done", _ts),
    ("queue_wait_ms", pa.float64()),
    ("ttft_ms", pa.float64()),
    ("mean_itl_ms", pa.float64()),
    ("gen_ai_usage_input_tokens", pa.int32()),
    ("gen_ai_usage_output_tokens", pa.int32()),
    ("gen_ai_usage_cache_read_input_tokens", pa.int32()),
    ("http_status", pa.int16()),
    ("error", pa.string()),
    ("env_id", pa.string()),
    ("example_id", pa.string()),
    ("rollout_id", pa.string()),
], metadata={"flywheel.schema_version": str(SCHEMA_VERSION)})

FIELDS = frozenset(TRACE_SCHEMA.names)


def check_record(record: dict) -> dict:
    """Refuse records with fields the schema does not know (a typo would silently drop data)."""
    unknown = set(record) - FIELDS
    if unknown:
        raise ValueError(f"unknown trace fields: {sorted(unknown)}")
    return record


def to_table(records: list[dict]) -> pa.Table:
    rows = [{**r, "schema_version": SCHEMA_VERSION} for r in records]
    return pa.Table.from_pylist(rows, schema=TRACE_SCHEMA)
