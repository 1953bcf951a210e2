"""Union, nullable, enum and untyped arguments: what the grammar lets through is what the parser
reads back, and it validates.

A top-level argument is raw text only when its schema admits only strings; every other argument,
unions included, is one JSON text (``serve.tools.arg_values``). Before that rule, xgrammar wrote a
union's string branch raw while the parser tried JSON first: a nullable ``"a"`` was read as ``a``
(under ``minLength``), and a union string could hold ``</arg_value>`` and end the value early. Each
test drives the real matcher over a byte-level vocabulary (helpers from ``test_tool_utf8``).
"""

from __future__ import annotations

import json

import pytest
from test_tool_utf8 import _check_call, accepts, call, matcher, tool_req, vocab  # noqa: F401 (fixture)

from serve.tools.arg_values import written_raw
from serve.tools.definitions import Bounds, parse_tools
from serve.tools.glm_parser import parse

UNIONS = {
    "anyOf string|integer": {
        "anyOf": [{"type": "string", "minLength": 2, "maxLength": 6}, {"type": "integer", "minimum": 0, "maximum": 99}]
    },
    "type list": {"type": ["string", "integer"], "minLength": 2, "maxLength": 6, "minimum": 0, "maximum": 99},
    "oneOf string|boolean": {"oneOf": [{"type": "string", "minLength": 2, "maxLength": 6}, {"type": "boolean"}]},
    "nullable type list": {"type": ["string", "null"], "minLength": 2, "maxLength": 6},
    "Optional[str] (anyOf with null)": {"anyOf": [{"type": "string", "minLength": 2, "maxLength": 6}, {"type": "null"}]},
    "unbounded anyOf": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
}
OTHERS = {
    "mixed enum": {"enum": ["café", "日本語", "a<b", 1, None]},
    "const": {"const": "Zürich"},
    "untyped": {},
    "number": {"type": "number"},
    "$ref to a union": {"$ref": "#/$defs/u"},
}
WORDS = ["café", "日本語", "😀ok", "naïve", "e\u0301"]
# What a model might write, raw or JSON: markup, JSON that a raw reading would take as a string,
# strings a JSON reading would shorten, edge whitespace, ill-formed UTF-8.
WRITTEN = [
    "café",
    '"café"',
    "Zürich",
    '"Zürich"',
    "日本語",
    '"日本語"',
    '"😀"',
    "😀😀",
    "a",
    '"a"',
    '"ab"',
    "ab",
    "null",
    '"null"',
    "42",
    '"42"',
    "true",
    "[1]",
    '{"x": "é"}',
    "a<b",
    '"a<b"',
    '"a\\u003cb"',
    "a</arg_value>b",
    '"a</arg_value>b"',
    "a</tool_call>b",
    '"x</tool_call>"',
    '"ab" ',
    " café",
    '"\\""',
    '"a\\nb"',
    b'"a\xc0\x80"',
    b"a\xed\xa0\x80",
    b'"\xf4\x90\x80\x80"',
]


def req_for(schema: dict):
    if "$ref" in schema:
        return parse_tools(
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "$defs": {"u": UNIONS["nullable type list"]},
                                "properties": {"a": schema},
                                "required": ["a"],
                                "additionalProperties": False,
                            },
                        },
                    }
                ],
                "tool_choice": "required",
                "parallel_tool_calls": False,
            }
        )
    return tool_req({"a": schema}, required=["a"])


def decoded(req, *value: str | bytes):
    text = b"".join(
        p.encode() if isinstance(p, str) else p
        for p in ["<tool_call>f<arg_key>a</arg_key><arg_value>", *value, "</arg_value></tool_call>"]
    )
    _, calls = parse(text.decode(), req)
    return json.loads(calls[0].arguments)["a"]


def test_only_arguments_that_admit_only_strings_are_written_raw():
    root = {"$defs": {"s": {"type": "string"}, "n": {"type": ["string", "null"]}}}
    raw = [
        {"type": "string"},
        {"type": ["string"]},
        {"enum": ["a", "b"]},
        {"const": "a"},
        {"$ref": "#/$defs/s"},
        {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "pattern": "^[0-9]+$"}]},
    ]
    json_ = [
        *UNIONS.values(),
        {"enum": ["a", None]},
        {"const": 1},
        {},
        {"type": "integer"},
        {"$ref": "#/$defs/n"},
        {"type": "object"},
        {"anyOf": [{"type": "string"}, {}]},
    ]
    assert all(written_raw(s, root) for s in raw)
    assert not any(written_raw(s, root) for s in json_)


@pytest.mark.parametrize("name", list(UNIONS))
def test_a_union_string_is_written_as_json_with_any_characters(vocab, name):
    req = req_for(UNIONS[name])
    for word in WORDS:
        assert accepts(vocab, req, call("a", json.dumps(word, ensure_ascii=False))), word
        assert decoded(req, json.dumps(word, ensure_ascii=False)) == word
        assert not accepts(vocab, req, call("a", word)), word  # raw: the parser would not know


def test_non_string_members_of_a_union_are_json_too(vocab):
    assert accepts(vocab, req_for(UNIONS["anyOf string|integer"]), call("a", "42"))
    assert accepts(vocab, req_for(UNIONS["type list"]), call("a", "7"))
    assert accepts(vocab, req_for(UNIONS["oneOf string|boolean"]), call("a", "false"))
    for name in ["nullable type list", "Optional[str] (anyOf with null)"]:
        req = req_for(UNIONS[name])
        assert accepts(vocab, req, call("a", "null")) and decoded(req, "null") is None
        assert accepts(vocab, req, call("a", '"null"')) and decoded(req, '"null"') == "null"


def test_a_nullable_string_is_counted_as_the_parser_reads_it(vocab):
    """The reported case: ``"a"`` was three raw characters to the grammar, ``a`` to the parser."""
    req = req_for(UNIONS["nullable type list"])
    assert not accepts(vocab, req, call("a", '"a"'))
    assert not accepts(vocab, req, call("a", '"ab"', "c"))
    assert accepts(vocab, req, call("a", '"ab"')) and decoded(req, '"ab"') == "ab"


@pytest.mark.parametrize("name", list(UNIONS) + list(OTHERS))
def test_whatever_the_grammar_accepts_decodes_to_a_valid_call(vocab, name):
    schema = {**UNIONS, **OTHERS}[name]
    req = req_for(schema)
    problems, admitted = [], 0
    for value in WRITTEN:
        parts = call("a", value)
        if accepts(vocab, req, parts):
            admitted += 1
            problems += _check_call(req, {"a": schema}, name, b"".join(p.encode() if isinstance(p, str) else p for p in parts))
    assert not problems, problems
    assert admitted >= 1


@pytest.mark.parametrize(
    "schema, prefix",
    [
        ({"type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"]}, '{"t": "a'),
        ({"type": "array", "items": {"type": "string"}}, '["a'),
        ({"type": "object", "properties": {"m": {}}, "required": ["m"]}, '{"m": "a'),
        ({"type": "object", "additionalProperties": True}, '{"k": "a'),
        ({"type": "object", "additionalProperties": True}, '{"a'),
        (UNIONS["unbounded anyOf"], '"a'),
        (OTHERS["untyped"], '"a'),
        ({"type": "string"}, "a"),
    ],
)
def test_no_string_inside_a_value_can_hold_markup(vocab, schema, prefix):
    """Inside any string, the closing markup (token or bytes) is refused: the parser would end the
    value there. ``<`` is refused outright (a grammar cannot count characters and refuse only
    ``</``); a JSON string may still carry it as ``\\u003c`` where a literal needs it."""
    m = matcher(vocab, req_for(schema))
    assert all(m.accept_token(t) for t in vocab.tokens(*call("a", prefix)[:-2])), prefix
    allowed = vocab.allowed(m)
    assert vocab.ids[b"</tool_call>"] not in allowed
    if prefix != "a":  # (after a raw "a", </arg_value> may end the value, written as a token or bytes)
        assert vocab.ids[b"</arg_value>"] not in allowed and vocab.ids[b"<"] not in allowed


def test_an_untyped_argument_is_any_json_value_with_safe_strings(vocab):
    req = req_for({})
    for value in ['"é"', "1.5", "-3", "true", "null", '["a", 1, [null]]', '{"k": {"j": "中"}}']:
        assert accepts(vocab, req, call("a", value)), value
        assert decoded(req, value) == json.loads(value)
    for value in ["é", '"a\\u0000"', b'"\xc0\x80"']:
        assert not accepts(vocab, req, call("a", value)), value


def test_enum_and_const_strings_in_a_json_argument_are_quoted_exactly(vocab):
    enum, const = req_for(OTHERS["mixed enum"]), req_for({"enum": ["Zürich", 3]})
    for value, expected in [('"café"', "café"), ('"日本語"', "日本語"), ('"a\\u003cb"', "a<b"), ("1", 1), ("null", None)]:
        assert accepts(vocab, enum, call("a", value)) and decoded(enum, value) == expected, value
    for value in ["café", '"cafe"', '"a<b"', "2", '"1"']:
        assert not accepts(vocab, enum, call("a", value)), value
    assert accepts(vocab, const, call("a", '"Zürich"')) and not accepts(vocab, const, call("a", "Zürich"))


def test_declared_extra_arguments_follow_the_same_rule(vocab):
    req = parse_tools(
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
                    },
                }
            ],
            "tool_choice": "required",
        },
        Bounds(),
    )
    assert accepts(vocab, req, call("a", '"日本"')) and decoded(req, '"日本"') == "日本"
    assert not accepts(vocab, req, call("a", "日本"))
