"""Trace rows as OpenTelemetry spans in Arize Phoenix (its own server process, started and
stopped here by PID): one span per request, with the GenAI attributes; with Phoenix stopped a
while, every request is still served, and its spans arrive once Phoenix is back, each once."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import sim_stack_on

pytestmark = pytest.mark.integration
PHOENIX_PYTHON = Path(sys.prefix) / "extras" / "phoenix" / "bin" / "python"  # scripts/bootstrap.sh makes it
PHOENIX_PORT = 19630


class Phoenix:
    def __init__(self, workdir: Path, port: int):
        self.workdir, self.port, self.proc = workdir, port, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> "Phoenix":
        assert PHOENIX_PYTHON.exists(), f"{PHOENIX_PYTHON} is missing: run scripts/bootstrap.sh"
        env = {
            **os.environ,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_WORKING_DIR": str(self.workdir),
        }
        log = open(self.workdir / "phoenix.log", "ab")
        script = Path(__file__).with_name("phoenix_server.py")
        self.proc = subprocess.Popen([str(PHOENIX_PYTHON), str(script)], env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, (self.workdir / "phoenix.log").read_text()[-2000:]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Phoenix did not start within 120 s"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its session: it and anything it started
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def spans(self) -> list[dict]:
        r = httpx.get(f"{self.url}/v1/projects/default/spans", params={"limit": 1000}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    p = Phoenix(tmp_path_factory.mktemp("phoenix"), PHOENIX_PORT).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def exporting_stack(tmp_path_factory, phoenix):
    """The sim profile with ``gateway.otlp`` pointing at Phoenix."""
    with sim_stack_on(
        tmp_path_factory.mktemp("flywheel-otlp"),
        "gateway.port=19620",
        "frontend.port=19600",
        "worker.system_port_base=19610",
        "worker.nixl_port_base=15900",
        "worker.count=1",
        "worker.speedup_ratio=20",
        f"gateway.otlp.endpoint={phoenix.url}",
    ) as cfg:
        yield cfg


def requests(url: str, n: int, tag: str) -> list[httpx.Response]:
    out = []
    for i in range(n):
        session = {"X-Session-ID": f"{tag}-{i % 3}"}
        if i % 4 == 3:
            body = {"model": "tiny", "max_tokens": 6, "messages": [{"role": "user", "content": f"{tag} {i}"}]}
            r = httpx.post(f"{url}/v1/messages", json=body, headers=session, timeout=60)
        elif i % 4 == 2:
            r = httpx.post(
                f"{url}/v1/responses",
                json={"model": "tiny", "max_output_tokens": 6, "input": f"{tag} {i}"},
                headers=session,
                timeout=60,
            )
        else:
            body = {
                "model": "tiny",
                "max_tokens": 6,
                "stream": i % 2 == 1,
                "messages": [{"role": "user", "content": f"{tag} {i}"}],
            }
            r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=session, timeout=60)
        r.read()
        out.append(r)
    return out


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return result


def by_trace(spans: list[dict]) -> dict[str, dict]:
    return {s["attributes"]["flywheel.trace_id"]: s for s in spans}


def test_one_span_per_request_and_none_lost_while_phoenix_is_away(exporting_stack, phoenix):
    url = exporting_stack.resolved_gateway().url
    first = requests(url, 12, "before")
    assert [r.status_code for r in first] == [200] * 12
    sent = {r.headers["x-trace-id"] for r in first}
    wait_for(lambda: sent <= set(by_trace(phoenix.spans())), 60, "the spans did not reach Phoenix within 60 s")

    spans = by_trace(phoenix.spans())
    unary_chat = first[0]
    span = spans[unary_chat.headers["x-trace-id"]]
    a, usage = span["attributes"], unary_chat.json()["usage"]
    assert span["name"] == "chat tiny" and span["status_code"] == "OK"
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"], a["flywheel.api"]) == ("chat", "tiny", "chat")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert a["gen_ai.response.finish_reasons"] == [unary_chat.json()["choices"][0]["finish_reason"]]
    assert a["gen_ai.conversation.id"] == "before-0" and a["flywheel.team"] == "default"
    assert "gen_ai.input.messages" not in a  # content is off unless gateway.otlp.content = true
    assert {spans[r.headers["x-trace-id"]]["attributes"]["flywheel.api"] for r in first} == {"chat", "messages", "responses"}

    phoenix.stop()
    outbox = exporting_stack.traces_path / "_otlp"
    away = requests(url, 10, "away")
    assert [r.status_code for r in away] == [200] * 10  # nothing on the request path waits on Phoenix
    wait_for(lambda: any(outbox.glob("*/*.json")), 30, "no rows wait in the outbox while Phoenix is away")
    phoenix.start()
    sent |= {r.headers["x-trace-id"] for r in away}
    wait_for(
        lambda: sent <= set(by_trace(phoenix.spans())), 90, "the spans of the rows written while Phoenix was away did not arrive"
    )
    stored = phoenix.spans()
    assert len(stored) == len({s["context"]["span_id"] for s in stored}) == len(sent)  # each once
