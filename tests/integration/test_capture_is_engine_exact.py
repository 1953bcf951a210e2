"""Every turn through the gateway becomes a trace row holding exactly what the engine used and
produced: prompt token ids, completion token ids, per-token logprobs."""

import time

import pytest
from transformers import AutoTokenizer

from traces.store import TraceStore

pytestmark = pytest.mark.integration

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Sum 12 and 30, then say hello 3 times."},
]
ENGINE_FIELDS = {"nvext": {"extra_fields": ["completion_token_ids"]}}


def trace_row(stack, trace_id: str, timeout_s: float = 10.0) -> dict:
    store = TraceStore(stack.traces_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        store.refresh()
        rows = store.sql(f"SELECT * FROM traces_full WHERE trace_id = '{trace_id}'").to_pylist()
        if rows:
            return rows[0]
        time.sleep(0.2)
    raise AssertionError(f"trace {trace_id} not stored within {timeout_s} s")


def expected_prompt_ids(stack, messages) -> list[int]:
    tok = AutoTokenizer.from_pretrained(stack.model_path)
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_unary_chat_trace_equals_engine_output(stack, openai_client):
    raw = openai_client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        extra_body=ENGINE_FIELDS,
        extra_headers={"X-Session-ID": "sess-unary"},
    )
    resp = raw.parse().model_dump()
    engine_ids = resp["nvext"]["completion_token_ids"]
    content = resp["choices"][0]["logprobs"]["content"]
    assert [e["token_id"] for e in content] == engine_ids and len(engine_ids) == 12

    row = trace_row(stack, raw.headers["x-trace-id"])
    assert row["completion_token_ids"] == engine_ids
    assert row["completion_logprobs"] == pytest.approx([e["logprob"] for e in content], abs=1e-6)
    assert row["prompt_token_ids"] == expected_prompt_ids(stack, MESSAGES)
    assert row["response_content"] == resp["choices"][0]["message"]["content"]
    assert row["gen_ai_conversation_id"] == "sess-unary" and row["stream"] is False
    assert row["gen_ai_usage_output_tokens"] == 12 and row["finish_reason"] == "length"
    assert row["worker_id"] and row["ttft_ms"] > 0 and row["time_done"] >= row["time_received"]


def test_streamed_chat_trace_equals_engine_output(stack, openai_client):
    raw = openai_client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=12,
        temperature=1.0,
        seed=7,
        logprobs=True,
        stream=True,
        extra_body=ENGINE_FIELDS,
    )
    ids, logprobs, text, usage_seen = [], [], [], False
    for chunk in raw.parse():
        d = chunk.model_dump()
        usage_seen |= d.get("usage") is not None
        ids += (d.get("nvext") or {}).get("completion_token_ids") or []
        for ch in d["choices"]:
            text.append(ch["delta"].get("content") or "")
            logprobs += [e["logprob"] for e in (ch.get("logprobs") or {}).get("content") or []]
    assert not usage_seen, "usage chunk sent although the client did not ask for it"
    row = trace_row(stack, raw.headers["x-trace-id"])
    assert row["stream"] is True and row["error"] is None
    assert row["completion_token_ids"] == ids and len(ids) == 12
    assert row["completion_logprobs"] == pytest.approx(logprobs, abs=1e-6)
    assert row["response_content"] == "".join(text)
    assert row["prompt_token_ids"] == expected_prompt_ids(stack, MESSAGES)
    assert row["gen_ai_usage_output_tokens"] == 12  # the gateway asked for usage anyway


@pytest.mark.parametrize("stream", [False, True])
def test_completions_trace_equals_engine_output(stack, openai_client, stream):
    tok = AutoTokenizer.from_pretrained(stack.model_path)
    prompt = "def fibonacci(n):\n    return 1234"
    raw = openai_client.completions.with_raw_response.create(
        model="tiny",
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        logprobs=1,
        stream=stream,
        stream_options={"include_usage": True} if stream else None,
        extra_body=ENGINE_FIELDS,
    )
    parsed = raw.parse()
    chunks = [c.model_dump() for c in parsed] if stream else [parsed.model_dump()]
    ids = [i for c in chunks for i in (c.get("nvext") or {}).get("completion_token_ids") or []]
    lps = [x for c in chunks for ch in c["choices"] for x in (ch.get("logprobs") or {}).get("token_logprobs") or []]
    assert any(c.get("usage") for c in chunks)
    row = trace_row(stack, raw.headers["x-trace-id"])
    assert row["completion_token_ids"] == ids and len(ids) == 8
    assert row["completion_logprobs"] == pytest.approx(lps, abs=1e-6)
    assert row["prompt_token_ids"] == tok.encode(prompt)
    assert row["gen_ai_operation_name"] == "text_completion"
