"""The trajectory record: one Arrow schema, shared by the writer, the store and the exporters.

Column names follow OpenTelemetry's ``gen_ai.*`` attributes where one exists, with dots turned
into underscores so they need no quoting in SQL (``gen_ai.request.model`` ->
``gen_ai_request_model``). Structured request/response parts (messages, tools, tool calls,
sampling params) are JSON text: DuckDB's JSON functions query them and no schema change is
needed when the OpenAI API grows a field. Token ids and logprobs are typed lists, exactly as the
engine returned them, so a trainer can use them without retokenizing.

Agent turns are mostly shared prefix, so a prompt is stored as a reference to an earlier turn
of the same session plus the tokens that are new: the full prompt is
``(ref.full_prompt + ref.completion)[:prompt_prefix_len] + prompt_new_token_ids``. A turn with
no reference (``prompt_prefix_trace_id`` null) stores its whole prompt in
``prompt_new_token_ids``. ``traces.store`` reconstructs full prompts on read.

Versions: 1 stored the whole prompt in ``prompt_token_ids``. 2 adds the prefix reference. 3 adds
``batch_id`` and ``custom_id`` (a line of the Batch API). 4 adds ``outcome`` (how the request
ended, ``serve/outcome.py``'s kinds: ok, client_gone, upstream_error, ...). 5 adds ``arm`` (the arm
of a split alias that served it, ``serve/split.py``). 6 adds ``api`` (which API the request came in
by: chat, completions, generate, responses, messages) and ``api_request`` (a translated API's
request as its client sent it; the engine's chat request stays in the columns above). The
store reads every version through one view (missing columns read as null), so old files stay
readable; bump ``SCHEMA_VERSION`` whenever a column is added, renamed or changes meaning.
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone

import msgspec
import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 6

_ts = pa.timestamp("us", tz="UTC")

TRACE_SCHEMA = pa.schema(
    [
        ("schema_version", pa.int16()),
        ("trace_id", pa.string()),
        ("gen_ai_conversation_id", pa.string()),  # session id (X-Session-ID)
        ("parent_trace_id", pa.string()),
        ("team", pa.string()),
        ("api_key_id", pa.string()),
        ("gen_ai_operation_name", pa.string()),  # "chat" | "text_completion"
        ("api", pa.string()),  # chat | completions | generate | responses | messages
        ("api_request", pa.string()),  # JSON: a Responses or Messages request as the client sent it
        ("gen_ai_request_model", pa.string()),  # the alias the client asked for
        ("gen_ai_response_model", pa.string()),  # the engine-side model name that served it
        ("checkpoint_version", pa.string()),
        ("arm", pa.string()),  # the arm of a split alias that served it (serve/split.py)
        ("deployment", pa.string()),
        ("worker_id", pa.string()),
        ("gen_ai_response_id", pa.string()),
        ("stream", pa.bool_()),
        ("gen_ai_input_messages", pa.string()),  # JSON: messages, or the completion prompt
        ("gen_ai_tool_definitions", pa.string()),  # JSON: tools
        ("tool_choice", pa.string()),  # JSON
        ("sampling_params", pa.string()),  # JSON: temperature, top_p, max_tokens, seed...
        ("response_content", pa.string()),
        ("response_reasoning", pa.string()),
        ("response_tool_calls", pa.string()),  # JSON: OpenAI tool_calls
        ("finish_reason", pa.string()),
        ("prompt_prefix_trace_id", pa.string()),  # earlier turn whose tokens this prompt extends
        ("prompt_prefix_len", pa.int32()),  # tokens taken from that turn's prompt+completion
        ("prompt_new_token_ids", pa.list_(pa.int32())),  # the rest of the prompt (all of it if no ref)
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
        ("outcome", pa.string()),  # ok | client_gone | upstream_error | timeout | ...
        ("env_id", pa.string()),
        ("example_id", pa.string()),
        ("rollout_id", pa.string()),
        ("batch_id", pa.string()),  # the Batch API batch this line belongs to
        ("custom_id", pa.string()),  # the line's own id in that batch
    ],
    metadata={"flywheel.schema_version": str(SCHEMA_VERSION)},
)

# What a producer (the gateway) hands over: the stored fields, except that it gives the whole
# prompt as `prompt_token_ids` and the writer turns it into a prefix reference.
INPUT_FIELDS = frozenset(TRACE_SCHEMA.names) - {"prompt_prefix_trace_id", "prompt_prefix_len", "prompt_new_token_ids"} | {
    "prompt_token_ids"
}


class TraceRecord(msgspec.Struct, kw_only=True):
    """One trace as a producer hands it over (:data:`INPUT_FIELDS`, less ``schema_version``,
    which the writer stamps): a field misspelt where a record is built fails there, not as a
    column that is silently empty. A unit test keeps it equal to :data:`TRACE_SCHEMA`."""

    trace_id: str
    gen_ai_conversation_id: str | None = None
    parent_trace_id: str | None = None
    team: str | None = None
    api_key_id: str | None = None
    gen_ai_operation_name: str | None = None
    api: str | None = None
    api_request: str | None = None
    gen_ai_request_model: str | None = None
    gen_ai_response_model: str | None = None
    checkpoint_version: str | None = None
    arm: str | None = None
    deployment: str | None = None
    worker_id: str | None = None
    gen_ai_response_id: str | None = None
    stream: bool = False
    gen_ai_input_messages: str | None = None
    gen_ai_tool_definitions: str | None = None
    tool_choice: str | None = None
    sampling_params: str | None = None
    response_content: str | None = None
    response_reasoning: str | None = None
    response_tool_calls: str | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    time_received: datetime | None = None
    time_admitted: datetime | None = None
    time_first_token: datetime | None = None
    time_done: datetime | None = None
    queue_wait_ms: float | None = None
    ttft_ms: float | None = None
    mean_itl_ms: float | None = None
    gen_ai_usage_input_tokens: int | None = None
    gen_ai_usage_output_tokens: int | None = None
    gen_ai_usage_cache_read_input_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None
    outcome: str | None = None
    env_id: str | None = None
    example_id: str | None = None
    rollout_id: str | None = None
    batch_id: str | None = None
    custom_id: str | None = None

    def as_dict(self) -> dict:
        return msgspec.structs.asdict(self)


PARTITION_KEYS = ("date", "model")
FEEDBACK_DIR = "_feedback"  # beside the trace partitions: feedback rows, partitioned by date

# Whose feedback counts for a trace: its own team's, or the admin's. One rule for the `rewards`
# view, the trace browser's reward filter (SQL) and its reward column (rows already read), and a
# feedback merge's checkpoint lookup (``traces.feedback_checkpoints``).
FEEDBACK_VISIBLE_SQL = "(f.team = t.team OR f.team = 'admin' OR (f.team IS NULL AND t.team IS NULL))"


def feedback_visible(feedback_team: str | None, trace_team: str | None) -> bool:
    """:data:`FEEDBACK_VISIBLE_SQL` for one feedback row and its trace's team."""
    return feedback_team == trace_team or feedback_team == "admin"


def check_record(record: dict) -> dict:
    """Refuse records with fields the schema does not know (a typo would silently drop data)."""
    unknown = set(record) - INPUT_FIELDS
    if unknown:
        raise ValueError(f"unknown trace fields: {sorted(unknown)}")
    if not record.get("trace_id"):
        raise ValueError("a trace record needs a trace_id")
    return record


# Numeric list columns travel through the spool as packed little-endian bytes: ~4x cheaper to
# decode than msgpack lists, and they become Arrow list columns without a per-element loop.
PACKED = {
    "prompt_new_token_ids": ("i", np.int32),
    "completion_token_ids": ("i", np.int32),
    "completion_logprobs": ("f", np.float32),
}


STORED_FIELDS = [f.name for f in TRACE_SCHEMA if f.name != "schema_version"]
SPOOL_HEADER = {"fields": STORED_FIELDS, "schema_version": SCHEMA_VERSION}


# Times travel as integer microseconds since the epoch (UTC): a datetime costs the mover ~1 us
# per row to decode and convert, an integer next to nothing. Segments written before hold
# datetimes; both convert to the same column.
TIMES = tuple(f.name for f in TRACE_SCHEMA if f.type == _ts)


def to_row(stored: dict) -> list:
    """A stored record as a positional row (``STORED_FIELDS`` order), numeric lists packed,
    times in microseconds. Positional rows decode ~2x faster than maps and transpose into
    columns in C; each spool segment starts with ``SPOOL_HEADER`` so a segment is read with the
    field order it was written with, even by a newer version of this code."""
    for name, (code, _) in PACKED.items():
        value = stored.get(name)
        if value is not None and not isinstance(value, bytes):
            stored[name] = struct.pack(f"<{len(value)}{code}", *value)
    for name in TIMES:
        if (value := stored.get(name)) is not None and isinstance(value, datetime):
            stored[name] = micros(value)
    return [stored.get(f) for f in STORED_FIELDS]


def micros(t: datetime) -> int:
    """Exact microseconds since the epoch of a datetime (a naive one is taken as UTC, as Arrow
    takes it): a float's 0.24 us resolution at today's dates rounds back to the exact value."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return round(t.timestamp() * 1e6)


def _packed_column(values: tuple, dtype, type_: pa.DataType) -> pa.Array:
    """A list column from packed bytes (None: a null list), by C loops over the values only."""
    mask = np.fromiter((v is None for v in values), bool, len(values)) if None in values else None
    packed = values if mask is None else tuple(b"" if v is None else v for v in values)
    if not all(map(bytes.__instancecheck__, packed)):  # a segment from before packing: lists
        return pa.array([np.frombuffer(v, dtype).tolist() if isinstance(v, bytes) else v for v in values], type_)
    offsets = np.zeros(len(packed) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, packed), np.int64, len(packed)) // np.dtype(dtype).itemsize, out=offsets[1:])
    flat = pa.array(np.frombuffer(b"".join(packed), dtype), type_.value_type)
    return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=None if mask is None else pa.array(mask))


def _time_column(values: tuple, type_: pa.DataType) -> pa.Array:
    try:  # integer microseconds, as to_row writes them
        return pa.array(values, pa.int64()).cast(type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a segment from before: datetimes
        return pa.array(values, type_)


def rows_to_table(fields: list[str], rows: list[list]) -> pa.Table:
    """Positional rows (in ``fields`` order) -> an Arrow table with the current schema."""
    by_name = dict(zip(fields, zip(*rows))) if rows else {}
    columns = []
    for f in TRACE_SCHEMA:
        values = by_name.get(f.name)
        if f.name == "schema_version":
            columns.append(pa.array(np.full(len(rows), SCHEMA_VERSION, np.int16)))
        elif values is None:
            columns.append(pa.nulls(len(rows), f.type))
        elif f.name in PACKED:
            columns.append(_packed_column(values, PACKED[f.name][1], f.type))
        elif f.type == _ts:
            columns.append(_time_column(values, f.type))
        else:
            columns.append(pa.array(values, f.type))
    return pa.Table.from_arrays(columns, schema=TRACE_SCHEMA)
