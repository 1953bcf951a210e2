"""Malformed tool requests get OpenAI-shaped 400s before reaching a deployment; the grammar
builder and the schema bounds behave as documented."""

import json
import re

import pytest
import xgrammar as xgr

from serve.tools.charsets import raw_string_pattern
from serve.tools.definitions import Bounds, parse_tools, validate_call
from serve.tools.grammar import grammar_for

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def chat(**kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.mark.parametrize(
    "tools, choice, param, message",
    [
        ([WEATHER, WEATHER], None, "tools[1].function.name", "duplicate"),
        ([{"type": "function", "function": {"name": "get weather"}}], None, "tools[0].function.name", "must match"),
        ([{"type": "function", "function": {"name": "x" * 65}}], None, "tools[0].function.name", "must match"),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}},
                }
            ],
            None,
            "tools[0].function.parameters",
            "not a valid JSON Schema",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "http://x/y.json"}}}},
                }
            ],
            None,
            "tools[0].function.parameters",
            "only local references",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}},
                }
            ],
            None,
            "tools[0].function.parameters",
            "points at nothing",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            None,
            "tools[0].function.parameters",
            "must describe an object",
        ),
        ([{"type": "retrieval"}], None, "tools[0]", "expected"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice", "not among"),
        ([WEATHER], "sometimes", "tool_choice", "must be"),
        (None, "required", "tool_choice", "needs tools"),
    ],
)
def test_malformed_tool_requests_get_a_400_naming_the_parameter(setup, tools, choice, param, message):
    client, _ = setup
    body = chat(**({"tools": tools} if tools else {}), **({"tool_choice": choice} if choice else {}))
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"] and err["code"] == "invalid_tools"


def test_schemas_are_bounded_for_the_grammar_but_validated_as_declared():
    req = parse_tools({"tools": [WEATHER]}, Bounds(max_string_length=20))
    schema = req.tools[0].grammar_schema["properties"]
    assert schema["days"]["maximum"] == 2**63 - 1 and schema["days"]["minimum"] == -(2**63)
    assert schema["city"]["pattern"] == raw_string_pattern(0, 20)
    assert validate_call(req, "get_weather", json.dumps({"city": "x" * 100})) is None  # declared: unbounded
    assert "undeclared" in validate_call(req, "get_time", "{}")
    assert "fail its schema" in validate_call(req, "get_weather", json.dumps({"days": 2}))


def test_the_maxlength_workaround_keeps_control_characters_out_of_json_strings():
    # xgrammar 0.2.x: a JSON string with maxLength compiles to [^"\\\r\n]{m,n}, which accepts raw
    # control characters (invalid JSON). The bounded schema uses a pattern that excludes them.
    # (Top-level GLM arguments are raw text, so only JSON-encoded, nested strings need it.)
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 5}}, "required": ["s"]}
    raw = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    params = {"type": "object", "properties": {"o": schema}}
    req = parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": params}}]})
    nested = req.tools[0].grammar_schema["properties"]["o"]
    fixed = xgr.Grammar.from_json_schema(json.dumps(nested), any_whitespace=False)
    bad = '{"s": "a\x01b"}'
    assert _accepts(raw, bad), "xgrammar fixed the bug: the workaround can go"
    assert not _accepts(fixed, bad)
    assert _accepts(fixed, '{"s": "abcde"}') and not _accepts(fixed, '{"s": "abcdef"}')


def _accepts(grammar, text: str) -> bool:
    from xgrammar.testing import _get_matcher_from_grammar

    matcher = _get_matcher_from_grammar(grammar)
    return matcher.accept_string(text) and matcher.is_terminated()


@pytest.mark.parametrize("layout", ["glm47", "glm45"])
def test_the_grammar_admits_only_declared_names_and_the_chosen_shape(layout):
    req = parse_tools({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False})
    g = xgr.Grammar.from_ebnf(grammar_for(req, layout))
    sep = "\n" if layout == "glm45" else ""
    good = f"<tool_call>get_weather{sep}<arg_key>city</arg_key>{sep}<arg_value>Oslo</arg_value>{sep}</tool_call>"
    assert _accepts(g, good)
    assert not _accepts(g, good.replace("get_weather", "get_time"))
    assert not _accepts(g, good + sep + good)  # parallel_tool_calls: false
    assert not _accepts(g, "Sure!")  # required: a call, not text
    none = xgr.Grammar.from_ebnf(grammar_for(parse_tools({"tools": [WEATHER], "tool_choice": "none"}), layout))
    assert _accepts(none, "Sure!") and not _accepts(none, good)
    assert re.search(r"get_weather", grammar_for(req, layout))


def test_bounded_raw_string_arguments_cannot_carry_markup_or_edge_whitespace():
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 1, "maxLength": 6}}, "required": ["a"]}
    req = parse_tools(
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}], "tool_choice": "required"}
    )
    g = xgr.Grammar.from_ebnf(grammar_for(req))
    call = "<tool_call>f<arg_key>a</arg_key><arg_value>{}</arg_value></tool_call>"
    for value, ok in [
        ("x", True),
        ("a b", True),
        ("abcdef", True),
        ("abcdefg", False),
        ("", False),
        ("x</arg_value>", False),
        ("a<b", False),
        ("a ", True),
    ]:
        # "a " is "a" plus the one separator the grammar allows: the parser strips it
        assert _accepts(g, call.format(value)) == ok, value


CUT = "Looking. <tool_call>lookup<arg_key>q</arg_key><arg_value>abc"  # max_tokens ran out mid-call
DONE = "<tool_call>lookup<arg_key>q</arg_key><arg_value>abc</arg_value></tool_call>"
LOOKUP = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_call_cut_by_max_tokens_is_the_clients_length_not_a_502(choice):
    from serve.tools.response import StreamTransformer, transform_message

    req = parse_tools(chat(tools=LOOKUP, tool_choice=choice))
    unary = transform_message(req, {"message": {"content": DONE + CUT}, "finish_reason": "length"})
    assert unary["finish_reason"] == "length"
    assert [c["function"]["arguments"] for c in unary["message"]["tool_calls"]] == ['{"q": "abc"}']
    alone = transform_message(req, {"message": {"content": CUT}, "finish_reason": "length"})
    assert alone["finish_reason"] == "length" and "tool_calls" not in alone["message"]
    assert alone["message"]["content"] == "Looking. "

    stream = StreamTransformer(req)
    deltas = [stream.chunk({"choices": [{"delta": {"content": piece}, "finish_reason": None}]}) for piece in (CUT[:20], CUT[20:])]
    last = stream.chunk({"choices": [{"delta": {"content": ""}, "finish_reason": "length"}]})
    assert last["choices"][0]["finish_reason"] == "length"
    assert "".join(d["choices"][0]["delta"]["content"] for d in deltas) == "Looking. "
    assert not any(d["choices"][0]["delta"].get("tool_calls") for d in deltas + [last])


def test_a_call_left_open_when_the_model_stopped_by_itself_is_still_invalid():
    from serve.errors import APIError
    from serve.tools.response import transform_message

    req = parse_tools(chat(tools=LOOKUP, tool_choice="auto"))
    with pytest.raises(APIError) as err:
        transform_message(req, {"message": {"content": CUT}, "finish_reason": "stop"})
    assert err.value.status == 502 and err.value.code == "invalid_tool_call"


def test_compiled_grammars_are_bounded_in_size_not_only_in_count():
    from serve.tools.grammar import _Grammars, structural_tag

    cache = _Grammars(max_chars=200_000)
    for i in range(40):
        cache.get(
            json.dumps(
                structural_tag(
                    parse_tools(
                        {
                            "tools": [
                                {
                                    "type": "function",
                                    "function": {
                                        "name": f"f{i}",
                                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                                    },
                                }
                            ]
                        }
                    )
                ),
                sort_keys=True,
            )
        )
    assert cache.chars <= 200_000 and 0 < len(cache._by_tag) < 40
