"""Anthropic's Messages API as chat (serve/translate/messages.py): what a request becomes, what
is refused and named, and the answers back, unary and streamed, as Anthropic's own SDK reads them."""

import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message

from serve.api.completions import parsed
from serve.errors import APIError
from serve.errors import AnthropicError
from serve.translate.messages import MessagesRequest, chat_body
from serve.translate.messages_answer import MessagesStream, message

TOOL = {
    "name": "get_weather",
    "description": "weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def request(**fields) -> MessagesRequest:
    body = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parsed(MessagesRequest, json.dumps(body).encode())


def test_a_tool_round_trip_becomes_the_chat_conversation_it_is():
    req = request(
        system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and be quick"},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                ],
            },
        ],
        tools=[TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        temperature=0.5,
        top_k=5,
        metadata={"user_id": "u-1"},
    )
    body = chat_body(req)
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "checking",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},  # results first, as Anthropic orders them
        {"role": "user", "content": "and be quick"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": TOOL["input_schema"]}}
    ]
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)
    assert (body["stop"], body["temperature"], body["top_k"], body["max_tokens"]) == (["END"], 0.5, 5, 16)
    assert chat_body(request(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}))["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    assert chat_body(request(tool_choice={"type": "none"}))["tool_choice"] == "none"
    streamed = chat_body(request(stream=True))
    assert streamed["stream"] and streamed["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.type"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"temperature": 1.5}, "temperature"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_that_names_it(fields, param):
    body = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(APIError) as err:
        chat_body(parsed(MessagesRequest, json.dumps(body).encode()))
    assert err.value.status == 400 and err.value.param == param, (err.value.param, err.value.message)
    shaped = AnthropicError.of(err.value).body()
    assert shaped["type"] == "error" and shaped["error"]["type"] == "invalid_request_error" and shaped["error"]["message"]


def test_errors_take_anthropics_types_by_status():
    for status, kind in ((401, "authentication_error"), (404, "not_found_error"), (429, "rate_limit_error"), (502, "api_error")):
        assert AnthropicError.of(APIError(status, "x")).body() == {"type": "error", "error": {"type": kind, "message": "x"}}


CHAT_USAGE = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37, "prompt_tokens_details": {"cached_tokens": 16}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def test_a_unary_answer_is_a_message_with_its_stop_reason_and_cached_tokens():
    chat = {
        "choices": [
            {"message": {"role": "assistant", "content": "let me look", "tool_calls": [CALL]}, "finish_reason": "tool_calls"}
        ],
        "usage": CHAT_USAGE,
    }
    msg = Message.model_validate(message(chat, "tr-" + "ab" * 16, "tiny", request()))
    assert msg.id == "msg_" + "ab" * 16 and msg.model == "tiny" and msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    assert (msg.content[1].id, msg.content[1].name, msg.content[1].input) == ("call_1", "get_weather", {"city": "Oslo"})
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens, msg.usage.output_tokens) == (14, 16, 7)
    cut = {"choices": [{"message": {"content": "abc"}, "finish_reason": "length"}], "usage": CHAT_USAGE}
    assert message(cut, "tr-" + "00" * 16, "tiny", request())["stop_reason"] == "max_tokens"
    stopped = {"choices": [{"message": {"content": "abc"}, "finish_reason": "stop", "stop_reason": "END"}]}
    out = message(stopped, "tr-" + "00" * 16, "tiny", request(stop_sequences=["END"]))
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "END")


def sse(raw: list[bytes]) -> list[dict]:
    events = []
    for piece in raw:
        name, data = piece.decode().strip().split("\n")
        assert name.startswith("event: ")
        obj = json.loads(data[len("data: ") :])
        assert obj["type"] == name[len("event: ") :]
        events.append(obj)
    return events


def test_a_stream_is_the_events_anthropics_sdk_accumulates_into_the_same_message():
    s = MessagesStream("tr-" + "cd" * 16, "tiny", request())
    raw = s.chunk({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    raw += s.chunk({"choices": [{"delta": {"content": "let "}}]})
    raw += s.chunk({"choices": [{"delta": {"content": "me look"}}]})
    raw += s.chunk({"choices": [{"delta": {"tool_calls": [{**CALL, "index": 0}]}, "finish_reason": "tool_calls"}]})
    raw += s.chunk({"choices": [], "usage": CHAT_USAGE})
    raw += s.done()
    events = sse(raw)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    snapshot, bufs = None, {}
    for e in events:
        snapshot = accumulate_event(event=e, current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot.content[0].text == "let me look" and snapshot.content[1].input == {"city": "Oslo"}
    assert snapshot.stop_reason == "tool_use"
    assert (snapshot.usage.input_tokens, snapshot.usage.output_tokens, snapshot.usage.cache_read_input_tokens) == (14, 7, 16)


def test_a_failure_mid_stream_is_an_anthropic_error_event():
    s = MessagesStream("tr-" + "cd" * 16, "tiny", request())
    (raw,) = s.failed({"message": "deployment 'd' failed mid-stream", "type": "server_error"})
    assert raw.startswith(b"event: error\n")
    assert json.loads(raw.split(b"data: ")[1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "deployment 'd' failed mid-stream"},
    }
