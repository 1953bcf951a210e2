"""Counting a long text prompt against the context: a slice at a time, stopping once it is over,
and never more than the prompt's true count (what is refused cannot fit)."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from serve.context_limit import SLICE_CHARS, _pieces, check_text
from serve.errors import APIError


@pytest.fixture
def model_path(tmp_path):
    tok = Tokenizer(models.WordLevel({"word": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    return str(tmp_path)


def test_a_prompt_of_many_messages_is_refused_from_its_first_slices_with_a_lower_bound(model_path):
    body = {"messages": [{"role": "user", "content": "word " * 1000}] * 20_000, "max_tokens": 1}
    with pytest.raises(APIError) as refused:
        check_text(body, 2048, model_path)
    counted = int(refused.value.message.split("at least ")[1].split(" ")[0])
    assert 2048 < counted < 20_000 * 1000  # over the context, and counted no further than needed
    assert refused.value.param == "messages" and refused.value.code == "context_length_exceeded"


def test_a_single_long_text_is_cut_at_whitespace_and_its_count_stays_a_lower_bound(model_path):
    text = "word " * 60_000  # 300,000 characters: several slices
    assert len(_pieces(text)) > 1 and "".join(_pieces(text)) == text
    check_text({"prompt": text, "max_tokens": 1}, 60_001, model_path)  # exactly fits: not refused
    with pytest.raises(APIError) as refused:
        check_text({"prompt": text + "word " * 100, "max_tokens": 1}, 60_001, model_path)
    assert refused.value.param == "prompt"


def test_a_long_stretch_without_whitespace_stays_one_piece():
    text = "x" * (3 * SLICE_CHARS) + " tail"
    assert _pieces(text) == ["x" * (3 * SLICE_CHARS), " tail"]
