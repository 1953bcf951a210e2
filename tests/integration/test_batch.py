"""The Batch API through the official `openai` SDK, on Dynamo's mocker: validation into the error
file, exact counts, one trace row per line, a cancel, another team, and kill -9 mid-batch."""

import io
import json
import os
import signal
import time

import pytest
from openai import NotFoundError, OpenAI

from deploy.stack.launcher import components
from deploy.stack.processes import ProcessManager
from serve.keys import KeyStore
from traces.store import TraceStore

pytestmark = pytest.mark.integration
FINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def sdk(sim_stack):
    gw = sim_stack.resolved_gateway()
    store = KeyStore(gw.keys_file)
    clients = {}
    for team in ("batchers", "others"):
        _, key = store.create(team)
        clients[team] = OpenAI(base_url=f"http://{gw.host}:{gw.port}/v1", api_key=key, max_retries=3)
    return clients


def _line(cid: str, max_tokens: int = 8, **extra) -> str:
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": f"say {cid}"}], "max_tokens": max_tokens},
            **extra,
        }
    )


def _submit(client: OpenAI, lines: list[str]):
    f = client.files.create(file=("lines.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    return client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "test"}
    )


def _wait(client: OpenAI, batch_id: str, until=lambda b: b.status in FINAL, timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            batch = client.batches.retrieve(batch_id)
            if until(batch):
                return batch
        except Exception:  # the gateway is restarting
            pass
        assert time.monotonic() < deadline, f"batch {batch_id} did not get there"
        time.sleep(0.2)


def _jsonl(client: OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def _trace_rows(cfg, batch_id: str, expected: set[str], timeout_s: float = 60) -> dict[str, int]:
    """Rows per custom_id of the batch, once every expected line's row reached Parquet (a loaded
    host converts later than the flush age): a line that never gets its row fails here."""
    store, deadline = TraceStore(cfg.traces_path), time.monotonic() + timeout_s
    while True:
        rows = store.sql(f"SELECT custom_id, count(*) AS n FROM traces WHERE batch_id = '{batch_id}' GROUP BY custom_id")
        counts = {r["custom_id"]: r["n"] for r in rows.to_pylist()}
        if expected <= counts.keys() or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)
        store.refresh()


def test_good_lines_are_answered_and_bad_ones_reported_with_exact_counts(sim_stack, sdk):
    client = sdk["batchers"]
    good = [_line(f"q{i}") for i in range(12)]
    bad = [
        "{not json",
        _line("q3"),  # a duplicate custom_id
        json.dumps(
            {"custom_id": "wrong-url", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny", "prompt": "x"}}
        ),
        json.dumps(
            {
                "custom_id": "no-model",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            }
        ),
        json.dumps(
            {
                "custom_id": "bad-body",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "tiny", "messages": "not a list"},
            }
        ),
    ]
    batch = _submit(client, good[:6] + bad + good[6:])
    assert batch.status == "in_progress" and batch.request_counts.total == 17
    batch = _wait(client, batch.id)
    assert batch.status == "completed" and batch.metadata == {"job": "test"}
    assert (batch.request_counts.completed, batch.request_counts.failed) == (12, 5)

    out = _jsonl(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"q{i}" for i in range(12))
    for o in out:
        assert o["response"]["status_code"] == 200 and o["error"] is None
        assert o["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
        assert o["response"]["body"]["model"] == "tiny"
    errors = {e["error"]["code"] for e in _jsonl(client, batch.error_file_id)}
    assert errors == {"invalid_json", "duplicate_custom_id", "mismatched_url", "model_not_found", "invalid_body"}
    assert batch.usage.output_tokens == sum(o["response"]["body"]["usage"]["completion_tokens"] for o in out)

    assert _trace_rows(sim_stack, batch.id, {f"q{i}" for i in range(12)}) == {f"q{i}": 1 for i in range(12)}
    assert batch.id in [b.id for b in client.batches.list()]


def test_another_team_sees_neither_the_files_nor_the_batches(sim_stack, sdk):
    owner, other = sdk["batchers"], sdk["others"]
    batch = _wait(owner, _submit(owner, [_line("mine")]).id)
    for call in (
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.files.retrieve(batch.input_file_id),
        lambda: other.files.content(batch.output_file_id),
        lambda: other.files.delete(batch.input_file_id),
    ):
        with pytest.raises(NotFoundError):
            call()
    assert batch.id not in [b.id for b in other.batches.list()]
    assert not {batch.input_file_id, batch.output_file_id} & {f.id for f in other.files.list()}
    with pytest.raises(NotFoundError):  # nor can it run a batch over another team's file
        other.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert owner.files.retrieve(batch.input_file_id).purpose == "batch"


def test_cancel_mid_batch_stops_new_lines_and_keeps_a_partial_output(sim_stack, sdk):
    client = sdk["batchers"]
    n = 1500
    batch = _submit(client, [_line(f"c{i}", max_tokens=64) for i in range(n)])
    _wait(client, batch.id, until=lambda b: b.request_counts.completed >= 50)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    batch = _wait(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at >= batch.cancelling_at
    done = batch.request_counts.completed
    assert 50 <= done < n, "the cancel came too late to show anything"
    out = _jsonl(client, batch.output_file_id)
    assert len(out) == done and all(o["response"]["status_code"] == 200 for o in out)
    answered = {o["custom_id"] for o in out}
    rows = _trace_rows(sim_stack, batch.id, answered)
    assert set(rows) == answered, "a line started after the cancel, or one was lost"
    time.sleep(1)
    assert _trace_rows(sim_stack, batch.id, answered) == rows and client.batches.retrieve(batch.id).status == "cancelled"


def test_kill_9_mid_batch_then_every_line_is_answered_exactly_once(sim_stack, sdk):
    client = sdk["batchers"]
    n = 1500
    batch = _submit(client, [_line(f"k{i}", max_tokens=32) for i in range(n)])
    _wait(client, batch.id, until=lambda b: b.request_counts.completed >= n // 4)
    pm = ProcessManager(sim_stack.run_dir)
    killed = pm.pid("gateway")
    os.kill(killed, signal.SIGKILL)
    gateway = next(c for c in components(sim_stack) if c.name == "gateway")
    deadline = time.monotonic() + 60  # the supervisor starts it again; it takes the batch over
    while pm.pid("gateway") in (None, killed) or not pm.check_ready(gateway):
        assert time.monotonic() < deadline, "the gateway did not come back"
        time.sleep(0.2)
    batch = _wait(client, batch.id)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (n, 0)
    out = _jsonl(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(n))
    lines = {f"k{i}" for i in range(n)}
    rows = _trace_rows(sim_stack, batch.id, lines)
    missing, doubled = sorted(lines - rows.keys()), sorted(k for k, count in rows.items() if count != 1)
    assert (missing, doubled, len(rows)) == ([], [], n), "lines without a row, lines with more than one"
