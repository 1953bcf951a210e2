"""OpenTelemetry export: one span per trace row, sent over OTLP/HTTP after the mover stores it.

Off the request path by construction: the mover (``traces/writer.py``), having written a spool
segment's Parquet files and before it drops the segment, leaves an outbox marker naming the
file and its trace ids (fsync'd; a crash before the marker replays the segment, which writes it
again). A thread sends each marker's rows and removes the marker only once the collector has
said yes, backing off (0.5 s doubling to 30 s) while it says no or is not there. So a slow or
dead collector costs no request anything and loses no row: the rows wait in the store, their
markers in ``_otlp/<writer instance>/``, and go out when it is back, after a restart too.

Each span's ids come from its trace row's id (the trace id's 128 bits, the span id a hash of
it), so a row sent again (the process died between the collector's yes and the marker's
removal) is the same span, which a collector that keys spans by id (Phoenix does) stores once.

Attributes follow the OpenTelemetry GenAI conventions (``gen_ai.operation.name``,
``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``gen_ai.response.finish_reasons``,
``gen_ai.conversation.id``...), with ``flywheel.*`` for what they have no name for (team, api,
checkpoint, deployment) and OpenInference's span kind, so Phoenix shows them as LLM calls.
Message content goes out only with ``content = true``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from traces.files import write_atomic
from traces.housekeeping import visible_files

log = logging.getLogger(__name__)
OUTBOX_DIR = "_otlp"
BATCH = 256  # spans per OTLP request
_COLUMNS = [
    "trace_id",
    "gen_ai_conversation_id",
    "team",
    "gen_ai_operation_name",
    "api",
    "gen_ai_request_model",
    "gen_ai_response_model",
    "gen_ai_response_id",
    "checkpoint_version",
    "arm",
    "deployment",
    "sampling_params",
    "finish_reason",
    "time_received",
    "time_done",
    "ttft_ms",
    "gen_ai_usage_input_tokens",
    "gen_ai_usage_output_tokens",
    "gen_ai_usage_cache_read_input_tokens",
    "http_status",
    "error",
    "outcome",
]
_CONTENT = ["gen_ai_input_messages", "response_content", "response_tool_calls"]


class OtlpConfig(BaseModel):
    """``gateway.otlp``: where trace rows go as spans (off unless ``endpoint`` is set)."""

    endpoint: str | None = Field(None, description="OTLP/HTTP base URL (e.g. http://127.0.0.1:6006); /v1/traces is added")
    headers: dict[str, str] = Field(default_factory=dict, description="sent with every export (e.g. an API key)")
    content: bool = Field(False, description="also send the messages and the answer (gen_ai.input/output.messages)")
    service_name: str = "flywheel-gateway"
    timeout_s: float = Field(10.0, gt=0)


def span_ids(trace_id: str) -> tuple[int, int]:
    """(OTLP trace id, span id) for a trace row: the same every time it is sent."""
    digest = hashlib.sha256(trace_id.encode()).digest()
    hex_part = trace_id.removeprefix("tr-")
    try:
        otel_trace = int(hex_part, 16) if len(hex_part) == 32 else int.from_bytes(digest[:16], "big")
    except ValueError:
        otel_trace = int.from_bytes(digest[:16], "big")
    return otel_trace or 1, int.from_bytes(digest[16:24], "big") or 1


def attributes(row: dict, content: bool) -> dict:
    """A trace row's span attributes (None values left out, as OTLP has no null)."""
    sampling = json.loads(row.get("sampling_params") or "{}")
    attrs = {
        "gen_ai.operation.name": row["gen_ai_operation_name"],
        "gen_ai.provider.name": "flywheel",
        "gen_ai.request.model": row["gen_ai_request_model"],
        "gen_ai.response.model": row["gen_ai_response_model"],
        "gen_ai.response.id": row["gen_ai_response_id"],
        "gen_ai.response.finish_reasons": [row["finish_reason"]] if row["finish_reason"] else None,
        "gen_ai.request.temperature": sampling.get("temperature"),
        "gen_ai.request.top_p": sampling.get("top_p"),
        "gen_ai.request.max_tokens": sampling.get("max_tokens") or sampling.get("max_completion_tokens"),
        "gen_ai.request.seed": sampling.get("seed"),
        "gen_ai.usage.input_tokens": row["gen_ai_usage_input_tokens"],
        "gen_ai.usage.output_tokens": row["gen_ai_usage_output_tokens"],
        "gen_ai.usage.cache_read.input_tokens": row["gen_ai_usage_cache_read_input_tokens"],
        "gen_ai.conversation.id": row["gen_ai_conversation_id"],
        "session.id": row["gen_ai_conversation_id"],  # OpenInference's name: Phoenix groups sessions by it
        "openinference.span.kind": "LLM",
        "http.response.status_code": row["http_status"],
        "error.type": row["outcome"] if row["error"] else None,
        "flywheel.trace_id": row["trace_id"],
        "flywheel.team": row["team"],
        "flywheel.api": row["api"],
        "flywheel.checkpoint_version": row["checkpoint_version"],
        "flywheel.arm": row["arm"],
        "flywheel.deployment": row["deployment"],
        "flywheel.ttft_ms": row["ttft_ms"],
    }
    if content:
        attrs["gen_ai.input.messages"] = row.get("gen_ai_input_messages")
        output = {"role": "assistant", "content": row.get("response_content")}
        if row.get("response_tool_calls"):
            output["tool_calls"] = json.loads(row["response_tool_calls"])
        attrs["gen_ai.output.messages"] = json.dumps([output])
    return {k: v for k, v in attrs.items() if v is not None}


def _ns(ts) -> int | None:
    return int(ts.timestamp() * 1e9) if ts is not None else None


class OtlpExporter:
    """The outbox and the thread that empties it (one per trace writer instance)."""

    def __init__(self, root: str | Path, instance: str, config: OtlpConfig):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource

        self.root, self.config = Path(root), config
        self.outbox = self.root / OUTBOX_DIR / instance
        self.outbox.mkdir(parents=True, exist_ok=True, mode=0o700)
        url = config.endpoint.rstrip("/")
        self.exporter = OTLPSpanExporter(
            endpoint=url if url.endswith("/v1/traces") else url + "/v1/traces", headers=config.headers, timeout=config.timeout_s
        )
        self.resource = Resource({"service.name": config.service_name})
        self.sent = 0  # spans the collector accepted since start
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    # -- the mover's side ---------------------------------------------------------------------

    def enqueue(self, partition: Path, file_name: str, trace_ids: list[str]) -> None:
        """A converted file's rows are due for export (called by the mover before it drops the
        segment; durable when it returns)."""
        marker = {"partition": str(partition.relative_to(self.root)), "file": file_name, "trace_ids": trace_ids}
        name = f"{time.time_ns():020d}-{file_name}-{hashlib.sha1(marker['partition'].encode()).hexdigest()[:8]}.json"
        write_atomic(self.outbox / name, json.dumps(marker).encode())
        self._wake.set()

    def pending(self) -> int:
        return sum(1 for _ in self.outbox.glob("*.json"))

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.config.timeout_s + 5)
        self.exporter.shutdown()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                done = self._send_all()
            except Exception:  # a bug here must not end exporting: say it, back off, go on
                log.exception("OTLP export failed")
                done = False
            failures = 0 if done else failures + 1
            self._wake.wait(min(30.0, 0.5 * 2**failures) if failures else 1.0)
            self._wake.clear()

    def _send_all(self) -> bool:
        """Send every marker's rows, oldest first; False at the first one the collector refused."""
        for marker in sorted(self.outbox.glob("*.json")):
            if self._stop.is_set():
                return True
            spec = json.loads(marker.read_text())
            spans = [self._span(row) for row in self._rows(spec)]
            for start in range(0, len(spans), BATCH):
                if self.exporter.export(spans[start : start + BATCH]).name != "SUCCESS":
                    log.warning(
                        "OTLP collector at %s refused or is not there; %d files wait", self.config.endpoint, self.pending()
                    )
                    return False
            self.sent += len(spans)
            marker.unlink()
        return True

    def _rows(self, spec: dict) -> list[dict]:
        """The marker's rows: from its file, or, if compaction has merged that file away, from
        whichever of its partition's files holds them now."""
        part = self.root / spec["partition"]
        wanted = set(spec["trace_ids"])
        columns = _COLUMNS + (_CONTENT if self.config.content else [])
        first = part / spec["file"]
        # a merge's inputs stay a while beside its output (traces/compactor.py): the visible files
        # hold each row once
        files = [first] if first.exists() else visible_files(part)
        rows = {}
        for f in files:
            try:
                table = pq.read_table(f, columns=columns)
            except FileNotFoundError:
                continue
            rows.update((r["trace_id"], r) for r in table.to_pylist() if r["trace_id"] in wanted)
        return list(rows.values())

    def _span(self, row: dict):
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        otel_trace, span_id = span_ids(row["trace_id"])
        status = Status(StatusCode.OK) if row["http_status"] == 200 else Status(StatusCode.ERROR, row["error"] or "")
        return ReadableSpan(
            name=f"{row['gen_ai_operation_name']} {row['gen_ai_request_model']}",
            context=SpanContext(otel_trace, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)),
            resource=self.resource,
            attributes=attributes(row, self.config.content),
            kind=SpanKind.CLIENT,
            status=status,
            start_time=_ns(row["time_received"]),
            end_time=_ns(row["time_done"]) or _ns(row["time_received"]),
        )
