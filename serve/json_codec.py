"""JSON on the hot path: msgspec, several times faster than the json module both ways, with
json as the fallback for what msgspec refuses and strict JSON tolerates or Python can hold (NaN
and Infinity, integers past 64 bits, lone surrogates from a ``\\ud800`` escape), and for its
error messages."""

from __future__ import annotations

import json
from typing import Any

import msgspec


def decode(data: bytes) -> Any:
    """One JSON value; raises ``json.JSONDecodeError`` (or ``UnicodeDecodeError``) if invalid."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


def encode(value: Any) -> bytes:
    """Compact JSON, UTF-8. NaN and infinities are written ``null`` (strict JSON has no way to
    write them, and strict parsers, JavaScript's among them, refuse json's ``NaN``)."""
    try:
        return msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError):  # UnicodeEncodeError is a ValueError
        return json.dumps(value).encode()
