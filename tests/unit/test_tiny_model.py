import hashlib
import json

from tokenizers import Tokenizer
from transformers import AutoTokenizer

from deploy.models.tiny_model import make_tiny_model

SAMPLES = [
    "def f(x):\n    return 12345 + 0.5e-3  # comment",
    "Numbers 0 7 42 3.14159 1e10 -273.15 2026-11-29 0xDEADBEEF 1_000_000",
    "  leading spaces, tabs\t\tand\n\n\nblank lines  ",
    "unicode: héllo café naïve 中文 日本語 emoji 🚀 e\u0301 (combining accent)",
    "<think>plan</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    "<|user|>\nhi<|assistant|>\nhello<|endoftext|>",
    "class A(B):\n\tdef __init__(self, *args, **kw): super().__init__(*args, **kw)",
]


def test_tokenizer_json_and_autotokenizer_give_identical_ids(tiny_model_dir):
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(tiny_model_dir)
    for text in SAMPLES:
        assert raw.encode(text).ids == auto.encode(text), text


def test_chat_template_renders_tools_reasoning_and_tool_results(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "call the tool",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"name": "get_weather"' in text
    assert "<think>call the tool</think>" in text
    assert "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>" in text
    assert "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>" in text
    assert "<|observation|>\n<tool_response>sunny</tool_response>" in text
    assert text.endswith("<|assistant|>")


def test_markup_survives_detokenization_but_role_markers_do_not(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode("<|user|>x<tool_call>f</tool_call><think>y</think>")
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == "x<tool_call>f</tool_call><think>y</think>"


def test_same_seed_gives_identical_files(tmp_path):
    a = make_tiny_model(tmp_path / "a", seed=3)
    b = make_tiny_model(tmp_path / "b", seed=3)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert hashlib.sha256((a / name).read_bytes()).digest() == hashlib.sha256((b / name).read_bytes()).digest()
    assert json.loads((a / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
