"""OTLP export (traces/otlp.py): every stored row reaches the collector as one span, with the
GenAI attributes, whether the collector was there at the time or came later, across a restart;
content only when asked for. The collector here is a real OTLP/HTTP endpoint decoding the
protobuf the exporter sends (opentelemetry-proto), counting what it accepted."""

import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from traces.compactor import compact_levels
from traces.housekeeping import data_files, partitions, visible_files
from traces.otlp import OtlpConfig, OtlpExporter, span_ids
from traces.store import TraceStore
from traces.writer import TraceWriter


class Collector:
    """An OTLP/HTTP trace endpoint on 127.0.0.1: answers ``status`` (200 accepts the spans)."""

    def __init__(self, port: int = 0):
        self.spans: list = []
        self.status = 200
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                if collector.status == 200:
                    req = ExportTraceServiceRequest.FromString(body)
                    collector.spans += [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
                self.send_response(collector.status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def record(i: int, **kw) -> dict:
    t0 = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc) + timedelta(seconds=i)
    return {
        "trace_id": f"tr-{i:032x}",
        "gen_ai_conversation_id": f"s{i % 2}",
        "team": "alpha",
        "gen_ai_operation_name": "chat",
        "api": "messages",
        "gen_ai_request_model": "tiny",
        "gen_ai_input_messages": '[{"role": "user", "content": "secret prompt"}]',
        "response_content": "secret answer",
        "sampling_params": '{"temperature": 0.5, "max_tokens": 8}',
        "finish_reason": "length",
        "time_received": t0,
        "time_done": t0 + timedelta(milliseconds=40),
        "gen_ai_usage_input_tokens": 12,
        "gen_ai_usage_output_tokens": 8,
        "http_status": 200,
        **kw,
    }


def until(condition, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.05)


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


def test_rows_written_while_the_collector_is_away_arrive_once_after_a_restart(tmp_path):
    free = Collector()
    port = free.port
    free.stop()  # the collector's address, with nothing there
    config = OtlpConfig(endpoint=f"http://127.0.0.1:{port}", timeout_s=1)
    exporter = OtlpExporter(tmp_path, "gw", config)
    writer = TraceWriter(tmp_path, "gw", max_age_s=0.05, on_converted=exporter.enqueue)
    for i in range(30):
        writer.write(record(i))  # acknowledged as before: nothing waits on the collector
    writer.close()
    assert TraceStore(tmp_path).count() == 30
    assert exporter.pending() >= 1 and exporter.sent == 0
    exporter.close()  # the gateway stops with the collector still away

    collector = Collector(port)
    again = OtlpExporter(tmp_path, "gw", config)  # the next start carries on from the outbox
    try:
        until(lambda: again.pending() == 0)
    finally:
        again.close()
        collector.stop()
    assert len(collector.spans) == 30 and again.sent == 30
    assert len({s.span_id for s in collector.spans}) == 30
    span = next(s for s in collector.spans if s.span_id == span_ids(f"tr-{7:032x}")[1].to_bytes(8, "big"))
    assert span.trace_id == (7).to_bytes(16, "big") and span.name == "chat tiny"
    assert span.end_time_unix_nano - span.start_time_unix_nano == 40_000_000
    a = attrs(span)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tiny"
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (12, 8)
    assert a["gen_ai.response.finish_reasons"] == ["length"] and a["gen_ai.request.temperature"] == 0.5
    assert (a["gen_ai.conversation.id"], a["flywheel.team"], a["flywheel.api"]) == ("s1", "alpha", "messages")
    assert not any("secret" in str(v) for v in a.values())  # content is off by default


def test_a_refusing_collector_is_retried_and_content_goes_only_when_asked(tmp_path):
    collector = Collector()
    collector.status = 503
    exporter = OtlpExporter(tmp_path, "gw", OtlpConfig(endpoint=f"http://127.0.0.1:{collector.port}", content=True, timeout_s=1))
    writer = TraceWriter(tmp_path, "gw", max_age_s=0.05, on_converted=exporter.enqueue)
    try:
        for i in range(5):
            writer.write(record(i, http_status=502, error="deployment failed", outcome="upstream_error"))
        writer.flush()
        until(lambda: exporter.pending() >= 1)
        assert collector.spans == []
        collector.status = 200
        until(lambda: exporter.pending() == 0, timeout_s=40)
    finally:
        writer.close()
        exporter.close()
        collector.stop()
    assert len(collector.spans) == 5
    a = attrs(collector.spans[0])
    assert "secret prompt" in a["gen_ai.input.messages"] and "secret answer" in a["gen_ai.output.messages"]
    assert a["error.type"] == "upstream_error" and collector.spans[0].status.code == 2  # ERROR


def test_rows_whose_files_were_merged_away_while_the_collector_was_away_arrive_once(tmp_path):
    """Their files merged in levels, the first merge's inputs gone, a later merge's kept beside
    its output: each row is read from the files a query would see, once."""
    free = Collector()
    port = free.port
    free.stop()
    config = OtlpConfig(endpoint=f"http://127.0.0.1:{port}", timeout_s=1)
    exporter = OtlpExporter(tmp_path, "gw", config)
    writer = TraceWriter(tmp_path, "gw", max_age_s=3600, on_converted=exporter.enqueue)

    def segments(ids):
        for i in ids:
            writer.write(record(i))
            writer.flush()
        return partitions(tmp_path)[0]

    part = segments(range(4))
    compact_levels(tmp_path, part, fanout=2)  # four files into one
    compact_levels(tmp_path, part, fanout=2, keep_inputs_s=0)  # the four are gone
    segments(range(4, 6))
    compact_levels(tmp_path, part, fanout=2)  # two into one, then the two merged ones into one: inputs kept
    writer.close()
    exporter.close()
    assert len(data_files(part)) == 5 and len(visible_files(part)) == 1

    collector = Collector(port)
    again = OtlpExporter(tmp_path, "gw", config)
    try:
        until(lambda: again.pending() == 0)
    finally:
        again.close()
        collector.stop()
    assert sorted(s.span_id for s in collector.spans) == sorted(span_ids(f"tr-{i:032x}")[1].to_bytes(8, "big") for i in range(6))


@pytest.mark.parametrize("trace_id", ["tr-" + "ab" * 16, "batch-line-7", "tr-zz"])
def test_span_ids_are_the_rows_own_and_never_zero(trace_id):
    assert span_ids(trace_id) == span_ids(trace_id) and all(span_ids(trace_id))
