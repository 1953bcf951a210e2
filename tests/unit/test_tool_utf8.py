"""Tool-call strings are valid UTF-8 text by construction, whatever byte pieces the tokenizer has.

A byte-level BPE vocabulary (ours included, see ``deploy/models/tiny_model.py``) has a token for every
single byte, and real ones also have pieces that stop or start inside a character, so only the
grammar decides whether an argument's bytes form UTF-8. xgrammar 0.2.7 matches a multi-byte
character against a negated class (``[^<]``, ``[^\\x00-\\x1f"\\\\]``) by its shape, not its code
point (an EBNF class takes any lead byte C0-F7 and the continuation bytes it announces): overlong
forms, surrogates and values past U+10FFFF get through, each counts as one character towards
``maxLength``, and decodes to several U+FFFD (the reported ``'opbufmmDe\\ufffd\\ufffd\\ufffd\\ufffd'``
for a ``maxLength: 10`` argument). The bounded schemas therefore write strings as positive ranges
of Unicode scalar values (``serve.tools.charsets.scalar_class``), which xgrammar compiles to
exactly the well-formed encodings. These tests drive the real matcher with a Hugging Face
byte-level tokenizer, on the EBNF the gateway sends to vLLM.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

import jsonschema
import pytest
import xgrammar as xgr

from serve.tools.definitions import Bounds, parse_tools, validate_call
from serve.tools.glm_parser import ToolCallParseError, parse
from serve.tools.grammar import MARKUP, grammar_for

EOS = "<|endoftext|>"
# Pieces beyond the 256 single bytes: a whole 2-byte and 3-byte character, and pieces that end
# inside a character (E4 B8, F0 9F), start inside one (98 80) or straddle two (A9 C3), as in
# real byte-level vocabularies.
PIECES = [b"\xc3\xa9", b"\xe4\xb8", b"\xe4\xb8\xad", b"\xa9\xc3", b"\xf0\x9f", b"\x98\x80", b"ab"]


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def byte_level_tokenizer():
    """A Hugging Face byte-level BPE tokenizer with byte pieces and partial UTF-8 pieces."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    b2u = _byte_to_unicode()
    spell = lambda bs: "".join(b2u[b] for b in bs)  # noqa: E731
    vocab = {b2u[b]: b for b in range(256)}
    merges = []
    for piece in PIECES:
        merges.append((spell(piece[:-1]), spell(piece[-1:])))
        vocab[spell(piece)] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True, normalized=False)])
    tok.add_tokens([AddedToken(m, normalized=False) for m in MARKUP])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


@dataclass
class Vocab:
    info: xgr.TokenizerInfo
    compiler: xgr.GrammarCompiler
    pieces: list[bytes]  # token id -> its bytes
    ids: dict[bytes, int]
    stop: int
    compiled: dict[str, xgr.CompiledGrammar] = field(default_factory=dict)

    def tokens(self, *parts: str | bytes) -> list[int]:
        """Markup as its token, anything else one single-byte piece per byte (the worst case)."""
        out = []
        for part in parts:
            if isinstance(part, str) and part in MARKUP:
                out.append(self.ids[part.encode()])
            else:
                data = part.encode() if isinstance(part, str) else part
                out += [self.ids[bytes([b])] for b in data]
        return out

    def allowed(self, matcher: xgr.GrammarMatcher) -> set[int]:
        mask = xgr.allocate_token_bitmask(1, self.info.vocab_size)
        matcher.fill_next_token_bitmask(mask)
        words = mask[0].tolist()
        return {i for i in range(self.info.vocab_size) if (words[i // 32] >> (i % 32)) & 1}


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    hf = byte_level_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(hf)
    assert info.vocab_type == xgr.VocabType.BYTE_LEVEL
    pieces = [bytes(p) for p in info.decoded_vocab]
    return Vocab(
        info,
        xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False),
        pieces,
        {p: i for i, p in enumerate(pieces)},
        hf.eos_token_id,
    )


def tool_req(props: dict, bounds: Bounds = Bounds(), required: list[str] | None = None):
    params = {"type": "object", "properties": props, "additionalProperties": False}
    if required is not None:
        params["required"] = required
    return parse_tools(
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        bounds,
    )


def matcher(vocab: Vocab, req) -> xgr.GrammarMatcher:
    # The EBNF text, as vLLM gets it (guided_grammar), not the in-memory grammar.
    ebnf = grammar_for(req)
    if ebnf not in vocab.compiled:
        vocab.compiled[ebnf] = vocab.compiler.compile_grammar(ebnf)
    return xgr.GrammarMatcher(vocab.compiled[ebnf])


def call(key: str, *value: str | bytes) -> list[str | bytes]:
    return ["<tool_call>", "f", "<arg_key>", key, "</arg_key>", "<arg_value>", *value, "</arg_value>", "</tool_call>"]


def accepts(vocab: Vocab, req, parts) -> bool:
    m = matcher(vocab, req)
    return all(m.accept_token(t) for t in vocab.tokens(*parts)) and m.accept_token(vocab.stop) and m.is_terminated()


# Argument kinds: (schema, how a value is written between <arg_value> tags, bounds).
KINDS = {
    "raw, maxLength 10": ({"type": "string", "maxLength": 10}, lambda v: [v], Bounds()),
    "json, nullable, maxLength 10": ({"type": ["string", "null"], "maxLength": 10}, lambda v: ['"', v, '"'], Bounds()),
    "json, anyOf string|integer": ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, lambda v: ['"', v, '"'], Bounds()),
    "raw, default bound": ({"type": "string"}, lambda v: [v], Bounds()),
    "raw, bound switched off": ({"type": "string"}, lambda v: [v], Bounds(max_string_length=None)),
    "raw, minLength only": ({"type": "string", "minLength": 1}, lambda v: [v], Bounds(max_string_length=None)),
    "json, nested maxLength 10": (
        {"type": "object", "properties": {"t": {"type": "string", "maxLength": 10}}, "required": ["t"]},
        lambda v: ['{"t": "', v, '"}'],
        Bounds(),
    ),
    "json, array item": ({"type": "array", "items": {"type": "string"}, "maxItems": 2}, lambda v: ['["', v, '"]'], Bounds()),
    "json, $defs": (
        {"$ref": "#/$defs/s", "$defs": {"s": {"type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"]}}},
        lambda v: ['{"t": "', v, '"}'],
        Bounds(),
    ),
}


def kind_accepts(vocab: Vocab, kind: str, *value: str | bytes) -> bool:
    schema, write, bounds = KINDS[kind]
    if "$defs" in schema:  # $defs live at the root of the parameters
        req = parse_tools(
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "$defs": schema["$defs"],
                                "properties": {"a": {"$ref": schema["$ref"]}},
                            },
                        },
                    }
                ],
                "tool_choice": "required",
            },
            bounds,
        )
    else:
        req = tool_req({"a": schema}, bounds)
    return accepts(vocab, req, call("a", *write(b"".join(v.encode() if isinstance(v, str) else v for v in value))))


def _utf8_prefix(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 text, or the start of some (Python's incremental decoder
    takes ED A0, the start of a surrogate, as a prefix: complete the last character instead)."""
    for k in range(4):
        for c in (0x80, 0x90, 0xA0, 0xBF):
            try:
                (data + bytes([c]) * k).decode("utf-8")
                return True
            except UnicodeDecodeError:
                pass
    return False


# ------------------------------------------------------------------------- (a) xgrammar pinned


def test_our_tokenizer_is_byte_level_with_a_piece_for_every_byte():
    """What vLLM hands the grammar for the tiny model: all 256 single bytes are tokens, the 128
    that are not UTF-8 on their own included (so a grammar that allows them gets them)."""
    from transformers import PreTrainedTokenizerFast

    from deploy.models.tiny_model import build_tokenizer

    info = xgr.TokenizerInfo.from_huggingface(
        PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(vocab_size=300, corpus_bytes=20_000), eos_token=EOS)
    )
    assert info.vocab_type == xgr.VocabType.BYTE_LEVEL
    singles = {bytes(p) for p in info.decoded_vocab if len(p) == 1}
    assert singles == {bytes([b]) for b in range(256)}


def test_xgrammar_negated_classes_admit_ill_formed_utf8(vocab):
    """Why the bounded schemas never use a negated class (xgrammar 0.2.7). If this fails,
    xgrammar now checks code points in [^...]; scalar_class stays correct either way."""

    def one_char(ebnf: str, data: bytes) -> bool:
        m = xgr.GrammarMatcher(vocab.compiler.compile_grammar(ebnf))
        return all(m.accept_token(vocab.ids[bytes([b])]) for b in data) and m.accept_token(vocab.stop)

    for data in [
        b"\xc0\x80",
        b"\xe0\x80\x80",
        b"\xed\xa0\x80",
        b"\xf0\x80\x80\x80",
        b"\xf4\x90\x80\x80",
        b"\xf5\x80\x80\x80",
        b"\xf7\xbf\xbf\xbf",
    ]:
        assert one_char("root ::= [^<]", data), data  # one "character" each; 2-4 U+FFFD decoded
    assert one_char(r"root ::= [^\u00e9]", "é".encode())  # non-ASCII members of [^...] are ignored
    # a 3-byte range over several lead bytes loses the tail of its last lead byte, and a Regex()
    # rule (nested JSON strings) merges touching ranges of one class into such a range:
    assert not one_char(r"root ::= [\u0800-\ud7ff]", "\ud000".encode())
    assert one_char(r"root ::= [\u0800-\ucfff\ud000-\ud7ff]", "\ud000".encode())
    assert not one_char(r'root ::= Regex("^[\\u0800-\\ucfff\\ud000-\\ud7ff]$")', "\ud000".encode())
    assert one_char(r'root ::= Regex("^(?:[\\u0800-\\ucfff]|[\\ud000-\\ud7ff])$")', "\ud000".encode())
    # never taken: a lone continuation byte, a lead byte followed by ASCII, bytes F8-FF
    for data in [b"\x80", b"\xc3a", b"\xf8\x80\x80\x80", b"\xff"]:
        assert not one_char("root ::= [^<] [^<]?", data), data


def test_bounded_strings_are_inlined_as_character_classes():
    """scalar_class is exact as an EBNF character class, not inside a Regex() rule (above): xgrammar
    inlines a pattern whose characters need no JSON escaping, which is what keeps it exact."""
    req = tool_req(
        {
            "a": {"type": "string", "maxLength": 5},
            "b": {
                "type": "object",
                "properties": {"t": {"type": "string"}, "l": {"type": "array", "items": {"type": "string", "minLength": 1}}},
            },
        }
    )
    ebnf = grammar_for(req)
    assert "Regex(" not in ebnf
    assert ebnf.count("\\ud000-\\ud7ff\\ue000-\\uffff\\U00010000-\\U0010ffff]") >= 4


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_matcher_never_takes_a_stray_or_unfinished_sequence(vocab, kind):
    """What xgrammar refuses by itself, on our grammar (true before the fix too, except where
    no pattern was set: an unbounded raw string took any bytes at all)."""
    assert kind_accepts(vocab, kind, "ab")
    assert not kind_accepts(vocab, kind, b"a\x80b")  # lone continuation byte
    assert not kind_accepts(vocab, kind, b"a\xc3b")  # lead byte, then ASCII
    assert not kind_accepts(vocab, kind, b"ab\xe4\xb8")  # 3-byte sequence cut by the closing markup / quote


def test_after_a_lead_byte_only_its_continuation_bytes_are_allowed(vocab):
    req = tool_req({"a": {"type": "string", "maxLength": 10}})

    def high(ids):  # the single-byte pieces above 0x7F among ids
        return {vocab.pieces[i][0] for i in ids if len(vocab.pieces[i]) == 1 and vocab.pieces[i][0] >= 0x80}

    m = matcher(vocab, req)
    assert all(m.accept_token(t) for t in vocab.tokens(*call("a", "ab")[:-2]))
    # a character may start with any lead byte of a well-formed sequence, never C0, C1, F5-FF
    assert high(vocab.allowed(m)) == set(range(0xC2, 0xF5))
    second = {
        0xC3: range(0x80, 0xC0),
        0xE0: range(0xA0, 0xC0),
        0xE4: range(0x80, 0xC0),
        0xED: range(0x80, 0xA0),
        0xF0: range(0x90, 0xC0),
        0xF4: range(0x80, 0x90),
    }
    for lead, continuations in second.items():
        assert m.accept_token(vocab.ids[bytes([lead])])
        allowed = vocab.allowed(m)
        assert high(allowed) == set(continuations), hex(lead)
        # every piece, multi-byte ones included, exactly when it carries on well-formed text: no
        # markup, ASCII or end of output in the middle of a character
        assert vocab.stop not in allowed
        assert allowed == {t for t, p in enumerate(vocab.pieces) if t != vocab.stop and _utf8_prefix(bytes([lead]) + p)}
        m.rollback(1)
    assert m.accept_token(vocab.ids[b"\xe4\xb8"])  # a piece that stops inside 中
    assert {vocab.pieces[i] for i in vocab.allowed(m)} == {bytes([b]) for b in range(0x80, 0xC0)} | {b"\xa9\xc3"}


# --------------------------------------------------------------- (b) characters and well-formed text

ILL_FORMED = {
    "overlong C0 80 (NUL)": b"\xc0\x80",
    "overlong C1 BF": b"\xc1\xbf",
    "overlong E0 80 80": b"\xe0\x80\x80",
    "overlong E0 9F BF": b"\xe0\x9f\xbf",
    "overlong F0 80 80 80": b"\xf0\x80\x80\x80",
    "overlong F0 8F BF BF": b"\xf0\x8f\xbf\xbf",
    "surrogate ED A0 80": b"\xed\xa0\x80",
    "surrogate ED BF BF": b"\xed\xbf\xbf",
    "past U+10FFFF F4 90 80 80": b"\xf4\x90\x80\x80",
    "lead F5": b"\xf5\x80\x80\x80",
    "lead F7": b"\xf7\xbf\xbf\xbf",
    "lone continuation": b"\x80",
    "lead then ASCII": b"\xc3b",
    "byte FE": b"\xfe",
    "byte FF": b"\xff",
}
BOUNDARY_CHARACTERS = [
    "\x7f",
    "\x80",
    "\u07ff",
    "\u0800",
    "\u0fff",
    "\u1000",
    "\ud000",
    "\ud7ff",
    "\ue000",
    "\ufffd",
    "\uffff",
    "\U00010000",
    "\U0010ffff",
    "é",
    "中",
    "部",
    "😀",
]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", list(ILL_FORMED))
def test_ill_formed_utf8_is_refused(vocab, kind, name):
    assert not kind_accepts(vocab, kind, b"a", ILL_FORMED[name], b"b")


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_unicode_scalar_value_can_be_written(vocab, kind):
    for ch in BOUNDARY_CHARACTERS:
        assert kind_accepts(vocab, kind, "a", ch, "b"), f"U+{ord(ch):04X}"


def test_the_reported_value_is_refused(vocab):
    req = tool_req({"note": {"type": ["string", "null"], "maxLength": 10}})
    value = b"opbufmmDe\xf5\x80\x80\x80"
    assert value.decode("utf-8", "replace") == "opbufmmDe\ufffd\ufffd\ufffd\ufffd"  # 13 characters
    # (a nullable string is written as JSON: serve.tools.arg_values)
    assert not accepts(vocab, req, call("note", b'"' + value + b'"'))
    assert accepts(vocab, req, call("note", '"opbufmmDe€"')) and accepts(vocab, req, call("note", "null"))


@pytest.mark.parametrize("ch", ["é", "中", "😀"])
def test_bounds_count_characters_not_bytes(vocab, ch):
    raw = tool_req({"a": {"type": "string", "minLength": 2, "maxLength": 10}})
    nullable = tool_req({"a": {"type": ["string", "null"], "minLength": 2, "maxLength": 10}})
    nested = tool_req(
        {"a": {"type": "object", "properties": {"t": {"type": "string", "minLength": 2, "maxLength": 10}}, "required": ["t"]}}
    )
    for n, ok in [(1, False), (2, True), (10, True), (11, False)]:
        assert accepts(vocab, raw, call("a", ch * n)) == ok, (ch, n)
        assert accepts(vocab, nullable, call("a", '"', ch * n, '"')) == ok, (ch, n)
        assert accepts(vocab, nested, call("a", '{"t": "', ch * n, '"}')) == ok, (ch, n)


def test_raw_values_cannot_start_or_end_with_whitespace_the_parser_strips(vocab):
    """``str.strip()`` removes Unicode whitespace too (U+00A0, U+3000, ...): a value that starts
    or ends with it would come back shorter than the grammar counted."""
    req = tool_req({"a": {"type": "string", "minLength": 2, "maxLength": 4}})
    for ws in ["\xa0", "\u3000", "\u2028", "\x1c", "\x85"]:
        assert not accepts(vocab, req, call("a", ws, "a")), repr(ws)
        assert not accepts(vocab, req, call("a", "a", ws)), repr(ws)
        assert accepts(vocab, req, call("a", "a", ws, "a")), repr(ws)


def test_enums_and_consts_with_accents_are_matched_exactly(vocab):
    words = ["café", "naïve", "日本語", "😀", "e\u0301"]
    req = tool_req(
        {
            "a": {"enum": words},
            "b": {"type": "object", "properties": {"e": {"enum": words}, "c": {"const": "Zürich"}}, "required": ["e", "c"]},
        }
    )
    for w in words:
        assert accepts(vocab, req, call("a", w)), w
        # (keys in sorted order: grammar_for serialises the tag with sort_keys, which orders properties)
        nested = json.dumps({"e": w, "c": "Zürich"}, ensure_ascii=False, sort_keys=True)
        assert accepts(vocab, req, call("b", nested)), w
    for w in ["cafe", "caf", "cafés", "é", "日本", "e", "\u00e9"]:  # U+00E9 is not "e" + U+0301
        assert not accepts(vocab, req, call("a", w)), w
    assert not accepts(vocab, req, call("a", b"caf\xc3"))
    assert not accepts(vocab, req, call("a", b"caf\xc0\xa9"))


def test_patterns_with_u_escapes_are_code_points(vocab):
    req = tool_req(
        {
            "a": {"type": "string", "pattern": "^[\\u00e0-\\u00ff]{2,3}$"},
            "b": {"type": "object", "properties": {"p": {"type": "string", "pattern": "^\\u00e9+\\u4e2d$"}}, "required": ["p"]},
        }
    )
    assert accepts(vocab, req, call("a", "éàü")) and accepts(vocab, req, call("a", "ÿà"))
    assert not accepts(vocab, req, call("a", "é")) and not accepts(vocab, req, call("a", "éàüö"))
    assert not accepts(vocab, req, call("a", "ea")) and not accepts(vocab, req, call("a", b"\xc3\xa9\xc3"))
    assert accepts(vocab, req, call("b", '{"p": "éé中"}')) and not accepts(vocab, req, call("b", '{"p": "é"}'))
    # the patterns the bounded schemas are written with mean the same to Python's re
    bounded = tool_req({"a": {"type": "object", "properties": {"t": {"type": "string"}}}, "b": {"type": "string"}})
    json_like = re.compile(bounded.tools[0].grammar_schema["properties"]["a"]["properties"]["t"]["pattern"])
    raw_like = re.compile(bounded.tools[0].grammar_schema["properties"]["b"]["pattern"])
    assert json_like.match("aé中😀\x7f") and not json_like.match('a"') and not json_like.match("a\x1f")
    assert not json_like.match("a<")  # no markup inside <arg_value>, JSON-encoded or not
    assert raw_like.match('aé中😀\x1f"b') and not raw_like.match("a<b") and not raw_like.match(" a")


def test_scalar_class_is_every_scalar_value_but_the_excluded_ones():
    from serve.tools.charsets import STRIPPED_WHITESPACE, scalar_class

    cls = re.compile(f"^{scalar_class('<' + STRIPPED_WHITESPACE)}$")
    assert {c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and not cls.match(chr(c))} == {ord("<")} | {
        c for c in range(0x110000) if chr(c).isspace()
    }
    assert not re.match(f"^{scalar_class('')}$", "\ud800")


# --------------------------------------------------------------------- (c) property: random schemas

WORDS = ["café", "naïve", "Zürich", "日本", "中文", "😀", "ok", "e\u0301"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "string", "string", "nullable", "enum", "const", "pattern", "integer", "boolean", "untyped"]
    if depth < 2:
        kinds += ["object", "array", "anyOf"]
    if depth == 0:  # where xgrammar's GLM style would write a union's strings raw
        kinds += ["union", "union", "union", "nullable", "mixed enum"]
    kind = rng.choice(kinds)
    if kind == "union":
        return random_union(rng)
    if kind == "untyped":
        return {}
    if kind == "mixed enum":
        return {"enum": rng.sample(WORDS, 2) + rng.sample([1, None, True, "null"], 2)}
    if kind in ("string", "nullable"):
        s = {"type": "string" if kind == "string" else ["string", "null"]}
        if rng.random() < 0.7:
            s["maxLength"] = rng.randint(1, 6)
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(0, s.get("maxLength", 3))
        return s
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(WORDS)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[\\u00e0-\\u00ff]{1,3}$", "^[a-z\\u4e2d]{1,3}$", "^\\u00e9[0-9]?$"])}
    if kind == "integer":
        return {"type": "integer", "minimum": 0, "maximum": 99}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "object":
        names = rng.sample("pqrs", rng.randint(1, 2))
        return {
            "type": "object",
            "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": names,
            "additionalProperties": False,
        }
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": 2}
    return {"anyOf": [{"type": "string", "maxLength": rng.randint(1, 5)}, {"type": "integer", "minimum": 0, "maximum": 9}]}


def random_union(rng: random.Random) -> dict:
    """A union with a string branch; its maxLength is sometimes long enough for markup (12 bytes)."""
    string = {"type": "string"}
    if rng.random() < 0.8:
        string["maxLength"] = rng.choice([rng.randint(1, 6), 16])
    if rng.random() < 0.3:
        string["minLength"] = rng.randint(0, min(string.get("maxLength", 3), 3))
    small = {"type": "integer", "minimum": 0, "maximum": 99}
    return rng.choice(
        [
            {"type": ["string", "integer"], **string, **{k: v for k, v in small.items() if k != "type"}},
            {"type": ["string", "null"], **{k: v for k, v in string.items() if k != "type"}},
            {"anyOf": [string, {"type": "null"}]},
            {"anyOf": [string, small]},
            {"oneOf": [string, {"type": "boolean"}]},
            {"anyOf": [{"enum": rng.sample(WORDS, 2)}, {"type": "array", "items": string, "maxItems": 2}]},
        ]
    )


def random_walk(vocab: Vocab, m: xgr.GrammarMatcher, rng: random.Random, max_steps: int = 300) -> bytes | None:
    """Sample what the grammar allows, as an adversarial model would: byte pieces above 0x7F are
    favoured (they are where ill-formed text comes from); the closing tokens more and more."""
    out = []
    for step in range(max_steps):
        allowed = sorted(vocab.allowed(m))
        closing = [
            t for t in allowed if t == vocab.stop or vocab.pieces[t] in (b'"', b"}", b"]", b"</arg_value>", b"</tool_call>")
        ]
        if closing and rng.random() < min(0.9, step / 60):
            token = rng.choice(closing)
        else:
            weights = [8 if vocab.pieces[t][0] >= 0x80 else 1 for t in allowed]
            token = rng.choices(allowed, weights)[0]
        assert m.accept_token(token)
        if token == vocab.stop:
            return b"".join(out)
        out.append(vocab.pieces[token])
    return None


def test_whatever_the_grammar_lets_through_is_utf8_and_valid(vocab):
    rng = random.Random(20240611)
    walks, finished, non_ascii, problems = 0, 0, 0, []
    for case in range(200):
        props = {n: random_schema(rng) for n in rng.sample("abcd", rng.randint(1, 2))}
        req = tool_req(props, Bounds(max_string_length=8), required=list(props))
        for _ in range(2):
            walks += 1
            data = random_walk(vocab, matcher(vocab, req), rng)
            if data is not None:
                finished += 1
                non_ascii += any(b >= 0x80 for b in data)
                problems += _check_call(req, props, case, data)
    assert not problems, "\n".join(map(repr, problems[:5]))
    assert finished >= 0.9 * walks and non_ascii >= 0.5 * finished, (walks, finished, non_ascii)


def _check_call(req, props, case, data: bytes) -> list:
    """Problems with one output the grammar let through: it must be UTF-8, parse to one call,
    and satisfy the declared schema."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [(case, props, data, f"not UTF-8: {exc}")]
    try:
        _, calls = parse(text, req)
    except ToolCallParseError as exc:
        return [(case, props, text, f"unparseable: {exc}")]
    if len(calls) != 1:
        return [(case, props, text, f"{len(calls)} calls")]
    why = validate_call(req, calls[0].name, calls[0].arguments)
    if why is None:  # and independently of the gateway's validator
        try:
            jsonschema.validate(json.loads(calls[0].arguments), req.tools[0].parameters)
        except jsonschema.ValidationError as exc:
            why = exc.message
    return [] if why is None else [(case, props, text, why)]
