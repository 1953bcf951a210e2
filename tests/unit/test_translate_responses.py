"""OpenAI's Responses API as chat (serve/translate/responses.py): what a request becomes, what is
refused and named, the answers back as the openai SDK parses them, unary and streamed, and a
conversation continued from a stored turn (serve/conversations.py)."""

import json
from datetime import datetime, timezone

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from serve.api.completions import parsed
from serve.conversations import Turn
from serve.errors import APIError
from serve.translate.responses import ResponsesRequest, chat_body
from serve.translate.responses_answer import ResponsesStream, conversation_items, response, response_id, trace_id_of

TOOL = {"type": "function", "name": "add", "description": "adds", "parameters": {"type": "object"}, "strict": True}
TRACE = "tr-" + "ef" * 16


def request(**fields) -> ResponsesRequest:
    return parsed(ResponsesRequest, json.dumps({"model": "tiny", "input": "hi", **fields}).encode())


def test_items_become_the_chat_conversation_they_are():
    req = request(
        instructions="be brief",
        input=[
            {"role": "user", "content": "add 2 and 3"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2}'},
            {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 3}'},
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
            {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
        ],
        tools=[TOOL],
        tool_choice={"type": "function", "name": "add"},
        max_output_tokens=9,
        parallel_tool_calls=False,
    )
    earlier = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    body = chat_body(req, earlier)
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        *earlier,
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 3}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "user", "content": "thanks"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "add", "description": "adds", "parameters": {"type": "object"}}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert (body["max_tokens"], body["parallel_tool_calls"]) == (9, False)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0]"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
        ({"truncation": "auto"}, "truncation"),
        ({"background": True}, "background"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_that_names_it(fields, param):
    with pytest.raises(APIError) as err:
        chat_body(request(**fields), [])
    assert err.value.status == 400 and err.value.param == param, (err.value.param, err.value.message)


def test_response_ids_are_their_trace_ids_and_nothing_else_is_one():
    assert trace_id_of(response_id(TRACE)) == TRACE
    for bad in ("resp_xyz", "tr-" + "ef" * 16, "resp_" + "EF" * 16, "resp_" + "ef" * 17, "", "resp_../../etc"):
        assert trace_id_of(bad) is None


CHAT_USAGE = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37, "prompt_tokens_details": {"cached_tokens": 16}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def test_a_unary_answer_is_a_response_the_sdk_parses():
    req = request(tools=[TOOL], metadata={"k": "v"})
    chat = {
        "choices": [{"message": {"content": "sum:", "tool_calls": [CALL]}, "finish_reason": "tool_calls"}],
        "usage": CHAT_USAGE,
    }
    r = Response.model_validate(response(chat, TRACE, "tiny", req.model_dump(exclude_unset=True), 1_700_000_000.0))
    assert r.id == response_id(TRACE) and r.status == "completed" and r.output_text == "sum:"
    call = r.output[1]
    assert (call.type, call.call_id, call.name, call.arguments) == ("function_call", "call_1", "add", '{"a": 1}')
    assert (r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens, r.usage.output_tokens) == (30, 16, 7)
    assert r.metadata == {"k": "v"} and r.tools[0].name == "add"
    cut = {"choices": [{"message": {"content": "ab"}, "finish_reason": "length"}], "usage": CHAT_USAGE}
    r = Response.model_validate(response(cut, TRACE, "tiny", {}, 0.0))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


EVENT = TypeAdapter(ResponseStreamEvent)


def events(raw: list[bytes]) -> list:
    out = []
    for piece in raw:
        name, data = piece.decode().strip().split("\n")
        obj = json.loads(data[len("data: ") :])
        assert name == "event: " + obj["type"]
        out.append(EVENT.validate_python(obj))
    return out


def test_a_stream_is_the_events_the_sdk_accumulates_into_the_same_response():
    req = request(tools=[TOOL]).model_dump(exclude_unset=True)
    s, seen = ResponsesStream(TRACE, "tiny", req), []
    s.finished = seen.append
    raw = s.chunk({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    raw += s.chunk({"choices": [{"delta": {"content": "sum"}}]})
    raw += s.chunk({"choices": [{"delta": {"content": ":"}}]})
    raw += s.chunk({"choices": [{"delta": {"tool_calls": [{**CALL, "index": 0}]}, "finish_reason": "tool_calls"}]})
    raw += s.chunk({"choices": [], "usage": CHAT_USAGE})
    assert not seen  # the answer is whole only at [DONE], once its trace is stored
    raw += s.done()
    assert seen == [s]
    parsed_events = events(raw)
    assert [e.sequence_number for e in parsed_events] == list(range(len(parsed_events)))
    assert parsed_events[0].type == "response.created" and parsed_events[-1].type == "response.completed"
    state = ResponseStreamState(input_tools=[TOOL], text_format=omit)
    for e in parsed_events:
        state.handle_event(e)
    final = parsed_events[-1].response
    assert final.output_text == "sum:" and final.output[1].arguments == '{"a": 1}' and final.usage.output_tokens == 7


def test_a_failure_mid_stream_is_an_error_then_a_failed_response():
    s = ResponsesStream(TRACE, "tiny", {})
    raw = s.chunk({"choices": [{"delta": {"content": "par"}}]})
    raw += s.failed({"message": "deployment 'd' failed mid-stream", "code": None})
    kinds = [e.type for e in events(raw)]
    assert kinds[-2:] == ["error", "response.failed"]
    assert events(raw)[-1].response.error.message == "deployment 'd' failed mid-stream"


def test_a_stored_turn_continues_without_its_instructions_and_lists_as_items():
    row = {
        "trace_id": TRACE,
        "team": "a",
        "gen_ai_conversation_id": TRACE,
        "gen_ai_request_model": "tiny",
        "api_request": json.dumps({"model": "tiny", "input": "add", "instructions": "be brief"}),
        "gen_ai_input_messages": json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": "add"}]),
        "response_content": None,
        "response_tool_calls": json.dumps([CALL]),
        "finish_reason": "tool_calls",
        "gen_ai_usage_input_tokens": 30,
        "gen_ai_usage_output_tokens": 7,
        "gen_ai_usage_cache_read_input_tokens": 16,
        "http_status": 200,
        "time_received": datetime(2026, 12, 4, tzinfo=timezone.utc),
    }
    turn = Turn.of_row(row)
    assert turn.conversation() == [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
    ]
    items = conversation_items(turn.conversation() + [{"role": "tool", "tool_call_id": "call_1", "content": "1"}])
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1]["call_id"] == items[2]["call_id"] == "call_1"
