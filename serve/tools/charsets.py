"""The characters a tool-call argument may hold, as regex patterns xgrammar compiles exactly.

Patterns are written as positive ranges of Unicode scalar values (``scalar_class``), never as
negated classes: xgrammar 0.2.x does not check a multi-byte character's code point against
``[^...]`` (it takes any lead byte C0-F7 followed by the continuation bytes it announces), so
with a byte-level vocabulary (every byte is a token) a value could hold overlong forms,
surrogates or code points past U+10FFFF, each counted as one character towards ``maxLength``
and decoded as several U+FFFD.

No string inside ``<arg_value>`` may hold ``<``, raw or JSON-encoded: the parser ends a value at
the first ``</arg_value>`` (and a call at the first ``</tool_call>``), and a grammar cannot both
count characters and refuse just the markup sequences.
"""

from __future__ import annotations

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # code points UTF-8 cannot encode
# What str.strip() (the GLM parser) removes from a raw value: str.isspace() characters.
STRIPPED_WHITESPACE = "".join(
    map(
        chr,
        [
            *range(0x09, 0x0E),
            *range(0x1C, 0x21),
            0x85,
            0xA0,
            0x1680,
            *range(0x2000, 0x200B),
            0x2028,
            0x2029,
            0x202F,
            0x205F,
            0x3000,
        ],
    )
)
UNBOUNDED = 1 << 20  # the length written for "no maxLength" (a {lo,hi} repetition needs a number)


def _escape(cp: int) -> str:
    # past U+FFFF the character itself: xgrammar's Regex() rules read no \U escape, Python's re
    # no \u{...}
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}" if cp <= 0xFFFF else chr(cp)


def _utf8_safe_ranges(lo: int, hi: int):
    """[lo, hi] as ranges xgrammar 0.2.x turns into exactly their UTF-8 encodings: each within
    one encoded length (a range across lengths admits overlong forms such as E0 80 80), and one
    of three or four bytes either ending on a 4096-code-point boundary or within one (xgrammar
    drops part of the last lead byte's tail otherwise: U+0800-U+D7FF refuses U+D000-U+D7FF)."""
    for first, last in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE_POINT)):
        a, b = max(lo, first), min(hi, last)
        if a > b:
            continue
        if a >= 0x800 and b & 0xFFF != 0xFFF and a < b & ~0xFFF:
            yield a, (b & ~0xFFF) - 1
            a = b & ~0xFFF
        yield a, b


def scalar_class(excluded: str = "") -> str:
    """A regex character class of every Unicode scalar value not in ``excluded``: one character
    of valid UTF-8 text, whatever bytes the tokenizer offers. Python's ``re`` reads it the same.

    xgrammar inlines such a pattern as an EBNF character class, which keeps the ranges apart
    and is as fast as a negated class. (Its ``Regex()`` rules, used for patterns it cannot
    inline, would merge the touching ranges back into unsafe ones; an alternation of classes
    avoids that, but masking a token inside a long string gets hundreds of times slower.)"""
    holes = sorted({(ord(c), ord(c)) for c in excluded} | {SURROGATES})
    ranges, start = [], 0
    for lo, hi in holes:
        if lo > start:
            ranges.append((start, lo - 1))
        start = max(start, hi + 1)
    if start <= MAX_CODE_POINT:
        ranges.append((start, MAX_CODE_POINT))
    pieces = [piece for lo, hi in ranges for piece in _utf8_safe_ranges(lo, hi)]
    return "[" + "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in pieces) + "]"


# printable, no quote or backslash (so never an escape: always valid inside a JSON string), no markup
JSON_STRING_CHAR = scalar_class('"\\<' + "".join(map(chr, range(0x20))))
RAW_CHAR = scalar_class("<")  # no markup in a raw GLM value
RAW_EDGE_CHAR = scalar_class("<" + STRIPPED_WHITESPACE)  # nor whitespace the parser would strip


def json_string_pattern(lo: int, hi: int, quoted: bool = False) -> str:
    """The content of a JSON string of lo..hi characters; with ``quoted``, the string with its
    quotes (for a top-level argument written as JSON, where xgrammar's GLM style would otherwise
    write the string raw)."""
    quote = '"' if quoted else ""
    return f"^{quote}{JSON_STRING_CHAR}{{{lo},{hi}}}{quote}$"


def raw_string_pattern(lo: int, hi: int) -> str:
    """A top-level GLM string argument of lo..hi characters that cannot contain markup (no
    ``<``) and has no whitespace at either end (the grammar's own separators are whitespace,
    and the parser strips them: everything ``str.strip()`` removes, Unicode spaces included)."""
    edge = RAW_EDGE_CHAR
    inner = f"{edge}{RAW_CHAR}{{{max(lo - 2, 0)},{max(hi - 2, 0)}}}{edge}" if hi >= 2 else None
    options = ([""] if lo == 0 else []) + ([edge] if lo <= 1 <= hi else []) + ([inner] if inner else [])
    return "^(?:" + "|".join(options) + ")$"


_REGEX_SPECIAL = set("\\^$.|?*+()[]{}/-")


def literal_pattern(text: str) -> str:
    """A pattern matching exactly ``text``."""
    return "^" + "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text) + "$"
