"""Each way an attempt at a deployment can end is one typed outcome, and the circuit breaker,
`/metrics` and the trace row all say the same one. A real HTTP upstream plays each fault; the
gateway is a real uvicorn server, so a client leaving mid-stream is a real disconnect."""

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from serve.app import create_app
from serve.config import BreakerConfig, Deployment, GatewayConfig, ModelRoute
from serve.outcome import Outcome
from tests.conftest import free_port
from traces.store import TraceStore

CHUNK = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "model": "tiny",
    "choices": [{"index": 0, "delta": {"content": "hel"}, "finish_reason": None}],
}
LAST = {
    **CHUNK,
    "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}
BURST = [{**CHUNK, "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]} for i in range(20)]
UNARY = {
    "id": "c1",
    "object": "chat.completion",
    "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def sse(*events) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


class Upstream(BaseHTTPRequestHandler):
    """What the deployment does is the server's ``mode``."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        mode = self.server.mode
        if mode == "slow_headers":
            time.sleep(1.5)
        if mode in ("http_500", "http_400"):
            status = int(mode[5:])
            body = json.dumps({"error": {"message": "nope", "type": "x", "param": None, "code": None}}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if mode in ("unary", "not_json", "not_utf8"):
            body = {"unary": json.dumps(UNARY).encode(), "not_json": b"<html>oops", "not_utf8": b'{"a": "\xff"}'}[mode]
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        script = {
            "stream": [sse(CHUNK, LAST, "[DONE]")],
            "slow_headers": [sse(CHUNK, LAST, "[DONE]")],
            "no_call": [sse(CHUNK, LAST, "[DONE]")],
            "cut": [sse(CHUNK)],
            "error_event": [sse(CHUNK, {"error": {"message": "engine died"}})],
            "malformed": [sse(CHUNK), b'data: {"choices": [tru\n\n'],
            "dawdle": [sse(CHUNK)] + [b": keep-alive\n\n"] * 40 + [sse(LAST, "[DONE]")],
            # a deployment ahead of its client: many events in one write
            "burst": [sse(*BURST, LAST, "[DONE]")],
            "burst_malformed": [sse(*BURST[:2]) + b'data: {"choices": [tru\n\n' + sse(LAST, "[DONE]")],
        }[mode]
        for part in script:
            try:
                self.wfile.write(part)
                self.wfile.flush()
            except OSError:  # the gateway hung up (its client left)
                return
            if mode == "dawdle":
                time.sleep(0.1)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


class Gateway:
    def __init__(self, cfg: GatewayConfig):
        self.app = create_app(cfg)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=cfg.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{cfg.port}"

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def outcome_counts(url: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name == "flywheel_outcomes_total" and s.value:
                out[(s.labels["deployment"], s.labels["outcome"])] = s.value
    return out


def breaker_state(url: str) -> str:
    return httpx.get(f"{url}/health").json()["breakers"]["d"]


# mode -> (request extras, the outcome, the breaker after it: one failure in one opens it)
CASES = {
    "stream": ({"stream": True}, Outcome.OK, "closed"),
    "unary": ({}, Outcome.OK, "closed"),
    "dawdle": ({"stream": True}, Outcome.CLIENT_GONE, "closed"),  # the client leaves after the first chunk
    "no_call": ({"stream": True, "tools": TOOLS, "tool_choice": "required"}, Outcome.INVALID_TOOL_CALL, "closed"),
    "http_400": ({"stream": True}, Outcome.REFUSED, "closed"),
    "unreachable": ({"stream": True}, Outcome.UNREACHABLE, "open"),
    "slow_headers": ({"stream": True}, Outcome.TIMEOUT, "open"),
    "http_500": ({"stream": True}, Outcome.UPSTREAM_ERROR, "open"),
    "cut": ({"stream": True}, Outcome.UPSTREAM_ERROR, "open"),
    "error_event": ({"stream": True}, Outcome.UPSTREAM_ERROR, "open"),
    "malformed": ({"stream": True}, Outcome.MALFORMED, "open"),
    "not_json": ({}, Outcome.MALFORMED, "open"),
    "not_utf8": ({}, Outcome.MALFORMED, "open"),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_breaker_metrics_and_trace_agree_on_how_it_ended(mode, upstream, tmp_path):
    extras, expected, breaker = CASES[mode]
    upstream.mode = mode
    url = f"http://127.0.0.1:{free_port() if mode == 'unreachable' else upstream.server_address[1]}"
    cfg = GatewayConfig(
        port=free_port(),
        deployments=[Deployment(name="d", url=url)],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        breaker=BreakerConfig(min_requests=1, error_rate=0.5, open_s=60),
        first_token_timeout_s=0.5,
        traces_dir=str(tmp_path / "traces"),
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extras}
    with Gateway(cfg) as gw:
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            if mode == "dawdle":
                with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    next(r.iter_lines())  # the first event, then hang up
                deadline = time.monotonic() + 20
                while not outcome_counts(gw.url) and time.monotonic() < deadline:
                    time.sleep(0.05)
            else:
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code in (200, 400, 502, 503), r.text
        counts = outcome_counts(gw.url)
        state = breaker_state(gw.url)
        gw.app.state.parts.writer.flush()
    assert counts == {("d", expected.value): 1}
    assert state == breaker
    rows = TraceStore(tmp_path / "traces").sql("SELECT outcome, error FROM traces").to_pylist()
    assert [r["outcome"] for r in rows] == [expected.value]
    assert (rows[0]["error"] is None) == (expected is Outcome.OK)


def test_a_request_refused_before_any_deployment_is_rejected(upstream, tmp_path):
    upstream.mode = "stream"
    cfg = GatewayConfig(
        port=free_port(),
        deployments=[Deployment(name="d", url="http://127.0.0.1:9")],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        budgets={"default": {"tokens": 1}},
        traces_dir=str(tmp_path / "traces"),
    )
    with Gateway(cfg) as gw:
        r = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50},
        )
        assert r.status_code == 429, r.text
        counts, state = outcome_counts(gw.url), breaker_state(gw.url)
        gw.app.state.parts.writer.flush()
    assert counts == {("", "rejected"): 1} and state == "closed"
    assert TraceStore(tmp_path / "traces").sql("SELECT outcome FROM traces").to_pylist() == [{"outcome": "rejected"}]


def test_a_response_whose_trace_cannot_be_stored_is_not_durable(upstream, tmp_path):
    """The deployment answered, so its breaker counts a success; the client gets a 503 and the
    trace has no row: nothing that could not be stored is claimed (the spool on a full disk)."""
    upstream.mode = "unary"
    spool = tmp_path / "traces" / "_spool"
    spool.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(spool)], check=True)
    try:
        cfg = GatewayConfig(
            port=free_port(),
            models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
            deployments=[Deployment(name="d", url=f"http://127.0.0.1:{upstream.server_address[1]}")],
            breaker=BreakerConfig(min_requests=1, error_rate=0.5, open_s=60),
            traces_dir=str(tmp_path / "traces"),
        )
        with Gateway(cfg) as gw:
            with open(spool / "filler", "wb") as filler:  # fill the disk
                try:
                    while True:
                        filler.write(b"\0" * 65536)
                        filler.flush()
                except OSError:
                    pass
            statuses = []
            while 503 not in statuses and len(statuses) < 20:
                statuses.append(
                    httpx.post(
                        f"{gw.url}/v1/chat/completions",
                        timeout=30,
                        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                    ).status_code
                )
            counts, state = outcome_counts(gw.url), breaker_state(gw.url)
            (spool / "filler").unlink()
            gw.app.state.parts.writer.flush()
    finally:
        subprocess.run(["umount", "-l", str(spool)], check=False)
    assert statuses[-1] == 503 and set(statuses[:-1]) <= {200}
    assert counts == {("d", "not_durable"): 1, **({("d", "ok"): len(statuses) - 1} if len(statuses) > 1 else {})}
    assert state == "closed"
    rows = TraceStore(tmp_path / "traces").sql("SELECT outcome FROM traces").to_pylist()
    assert [r["outcome"] for r in rows] == ["ok"] * (len(statuses) - 1)


@pytest.mark.parametrize("mode", ["burst", "burst_malformed"])
def test_events_that_arrive_together_reach_the_client_whole_and_in_order(mode, upstream, tmp_path):
    """The gateway answers what one read brought in one write: every event still reaches the
    client, in order; one that breaks stops the stream after the events before it, with an
    error event and no [DONE]."""
    upstream.mode = mode
    cfg = GatewayConfig(
        port=free_port(),
        deployments=[Deployment(name="d", url=f"http://127.0.0.1:{upstream.server_address[1]}")],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(tmp_path / "traces"),
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with Gateway(cfg) as gw:
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        gw.app.state.parts.writer.flush()
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    texts = [c["choices"][0]["delta"]["content"] for c in chunks if "choices" in c]
    row = TraceStore(tmp_path / "traces").sql("SELECT outcome, response_content FROM traces").to_pylist()[0]
    if mode == "burst":
        assert texts == [f"t{i} " for i in range(20)] + ["lo"] and events[-1] == "[DONE]"
        assert row == {"outcome": "ok", "response_content": "".join(texts)}
    else:
        assert texts == ["t0 ", "t1 "] and "[DONE]" not in events
        assert "malformed stream event" in chunks[-1]["error"]["message"]
        assert row["outcome"] == Outcome.MALFORMED.value
