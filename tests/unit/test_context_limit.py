"""Counting a long text prompt against the context: a slice at a time, stopping once it is over,
and never more than the prompt's true count (what is refused cannot fit)."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from serve.context_limit import SLICE_CHARS, _pieces, check_text
from serve.errors import APIError

ROOT = Path(__file__).resolve().parents[2]


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


def test_tools_the_chat_template_renders_into_the_prompt_count_against_the_context(tmp_path):
    """Many tools with short messages: the rendered prompt (what the engine tokenizes) is over the
    context, so the gateway answers 400 context_length_exceeded instead of passing on a request
    the engine refuses."""
    import json

    from serve.context_limit import _chat_template

    vocab = {w: i for i, w in enumerate(["[UNK]", "word", "<|system|>", "<|user|>", "<|assistant|>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    template = (ROOT / "deploy" / "models" / "chat_template.jinja").read_text()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "unk_token": "[UNK]"}))
    _chat_template.cache_clear()
    tools = [
        {
            "type": "function",
            "function": {"name": f"t{i}", "description": "word " * 20, "parameters": {"type": "object", "properties": {}}},
        }
        for i in range(120)
    ]
    short = {"messages": [{"role": "user", "content": "word word"}], "max_tokens": 1}
    check_text(short, 2048, str(tmp_path))  # the messages alone fit
    with pytest.raises(APIError) as refused:
        check_text({**short, "tools": tools}, 2048, str(tmp_path))
    assert refused.value.code == "context_length_exceeded"
    check_text({**short, "tools": tools[:2]}, 2048, str(tmp_path))  # a few tools still fit
