"""The GLM tool-call parser, with the literal inputs that break public parsers."""

import json

import pytest

from serve.tools.definitions import parse_tools
from serve.tools.glm_parser import StreamingParser, ToolCallParseError, parse


def tools(**props):
    return parse_tools(
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": props}}}]}
    )


def args(text, req):
    content, calls = parse(text, req)
    assert len(calls) == 1
    return json.loads(calls[0].arguments)


def test_html_entities_stay_as_written():
    req = tools(q={"type": "string"})
    assert args("<tool_call>f<arg_key>q</arg_key><arg_value>a &lt; b &amp;&amp; c</arg_value></tool_call>", req) == {
        "q": "a &lt; b &amp;&amp; c"
    }


def test_a_string_that_looks_like_json_stays_a_string():
    req = tools(payload={"type": "string"}, n={"type": "string"})
    text = (
        '<tool_call>f<arg_key>payload</arg_key><arg_value>{"a": 1}</arg_value>'
        "<arg_key>n</arg_key><arg_value>42</arg_value></tool_call>"
    )
    assert args(text, req) == {"payload": '{"a": 1}', "n": "42"}


def test_nullable_and_union_values_keep_their_json_type():
    req = tools(
        note={"type": ["string", "null"]},
        x={"anyOf": [{"type": "integer"}, {"type": "string"}]},
        tag={"type": ["string", "null"]},
    )
    text = (
        "<tool_call>f<arg_key>note</arg_key><arg_value>null</arg_value>"
        "<arg_key>x</arg_key><arg_value>42</arg_value>"
        "<arg_key>tag</arg_key><arg_value>hello</arg_value></tool_call>"
    )
    assert args(text, req) == {"note": None, "x": 42, "tag": "hello"}


def test_typed_values_and_refs():
    req = parse_tools(
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}}}},
                            "properties": {"p": {"$ref": "#/$defs/pt"}, "ok": {"type": "boolean"}, "n": {"type": "integer"}},
                        },
                    },
                }
            ]
        }
    )
    text = (
        '<tool_call>f\n<arg_key>p</arg_key>\n<arg_value>{"x": 1.5}</arg_value>\n'
        "<arg_key>ok</arg_key>\n<arg_value>true</arg_value>\n<arg_key>n</arg_key>\n<arg_value>-3</arg_value>\n</tool_call>"
    )
    assert args(text, req) == {"p": {"x": 1.5}, "ok": True, "n": -3}


@pytest.mark.parametrize(
    "text, message",
    [
        ("<tool_call>f<arg_key>q</arg_key></tool_call>", "no <arg_value>"),
        ("<tool_call>f<arg_key>q</arg_key>oops<arg_value>1</arg_value></tool_call>", "no <arg_value>"),
        ("<tool_call>f<arg_value>1</arg_value></tool_call>", "malformed tool name"),
        ("<tool_call><tool_call>f</tool_call>", "malformed tool name"),
        ("<tool_call>get weather<arg_key>q</arg_key><arg_value>1</arg_value></tool_call>", "malformed tool name"),
        ("<tool_call>f<arg_key>q</arg_key><arg_value>1", "ended inside a tool call"),
    ],
)
def test_malformed_markup_is_an_error_not_empty_arguments(text, message):
    with pytest.raises(ToolCallParseError, match=message):
        parse(text, tools(q={"type": "string"}))


def test_streaming_gives_the_same_result_as_whole_parsing_and_never_a_partial_name():
    req = tools(q={"type": "string"}, n={"type": "integer"})
    text = (
        "Let me check. <tool_call>f<arg_key>q</arg_key><arg_value>x &lt; y</arg_value>"
        "<arg_key>n</arg_key><arg_value>7</arg_value></tool_call><tool_call>f<arg_key>q</arg_key>"
        "<arg_value>second</arg_value></tool_call>"
    )
    whole_content, whole_calls = parse(text, req)
    for step in (1, 2, 3, 5, 11):
        p = StreamingParser(req)
        events = []
        for i in range(0, len(text), step):
            events += p.feed(text[i : i + step])
        events += p.finish()
        content = "".join(e[1] for e in events if e[0] == "content")
        calls = [e[1] for e in events if e[0] == "call"]
        assert content == whole_content == "Let me check. "
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
        assert all("<" not in e[1] for e in events if e[0] == "content")


def test_text_that_merely_resembles_markup_is_content():
    content, calls = parse("a <tool and <tool_cal x", tools())
    assert content == "a <tool and <tool_cal x" and calls == []
