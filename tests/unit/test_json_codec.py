"""The hot path's JSON: what the json module reads and writes, msgspec's speed aside."""

import json
import math

import pytest

from serve import json_codec


@pytest.mark.parametrize(
    "text",
    [
        b'{"a": [1, 2.5, "\xc3\xa9", null, true]}',
        b'{"n": NaN, "i": -Infinity}',
        b'{"big": 123456789012345678901234567890}',
        b'"\\ud800 lone"',
        b'{"a": 1, "a": 2}',
    ],
)
def test_decode_reads_what_json_reads(text):
    got, want = json_codec.decode(text), json.loads(text)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True) or (math.isnan(got["n"]) and math.isnan(want["n"]))


@pytest.mark.parametrize("text", [b"{", b'{"a": tru}', b"\xff"])
def test_decode_refuses_what_json_refuses_with_its_errors(text):
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
        json_codec.decode(text)


@pytest.mark.parametrize("value", [{"a": ["é", 1, None]}, {"s": "lone \ud800"}, {"big": 2**70}])
def test_encode_writes_what_json_reads_back(value):
    assert json.loads(json_codec.encode(value)) == value


def test_a_number_json_cannot_hold_is_written_as_null_which_every_client_can_read():
    assert json_codec.encode({"lp": float("-inf"), "x": float("nan")}) == b'{"lp":null,"x":null}'
