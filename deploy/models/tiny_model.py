"""A tiny GLM-flavoured chat model made on this machine, saved in the Hugging Face layout.

No weights can be downloaded here, so tests and the demo serve a model we build: a byte-level
BPE tokenizer trained on the Python standard library's sources and a random ``Qwen2ForCausalLM``
small enough to run on one CPU core. The same seed gives the same files.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

EOS = "<|endoftext|>"
# Role markers are special (the detokenizer drops them); the markup the model writes for
# reasoning and tool calls is ordinary added tokens, so it survives detokenization and the
# reasoning / tool-call parsers can see it.
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
MARKUP_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
]
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Generation ends at EOS or when the model starts the next user / tool turn.
STOP_TOKENS = [EOS, "<|user|>", "<|observation|>"]


def stdlib_sources(max_bytes: int) -> list[str]:
    """Python stdlib sources, in a fixed order (present on every machine): the tokenizer's training
    text, and deploy/bench/kv_accuracy.py's evaluation text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def build_tokenizer(vocab_size: int = 4096, corpus_bytes: int = 3_000_000):
    """Train the byte-level BPE tokenizer (deterministic for a fixed corpus)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # Qwen2's own pipeline (NFC, its split regex: one digit per piece, then bytes). transformers
    # 5 always loads a qwen2 model's tokenizer as Qwen2Tokenizer, which rebuilds this pipeline
    # from vocab + merges; matching it keeps vLLM (AutoTokenizer) and Dynamo's frontend
    # (tokenizer.json) token-for-token identical.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_sources(corpus_bytes), trainer=trainer)
    tok.add_tokens(MARKUP_TOKENS)
    return tok


def _tokenizer_config(tok) -> dict:
    added = {}
    for token in [EOS, *ROLE_TOKENS, *MARKUP_TOKENS]:
        added[str(tok.token_to_id(token))] = {
            "content": token,
            "special": token in (EOS, *ROLE_TOKENS),
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "eos_token": EOS,
        "pad_token": EOS,
        "bos_token": None,
        "unk_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": TEMPLATE_PATH.read_text(),
    }


def make_tiny_model(out_dir: str | Path, seed: int = 0, hidden: int = 128, layers: int = 4, vocab_size: int = 4096) -> Path:
    """Write tokenizer + random Qwen2 weights to ``out_dir``; returns the directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(tok), indent=2))
    (out / "chat_template.jinja").write_text(TEMPLATE_PATH.read_text())
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": EOS, "pad_token": EOS}))

    stop_ids = [tok.token_to_id(t) for t in STOP_TOKENS]
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=stop_ids,
        bos_token_id=None,
        pad_token_id=stop_ids[0],
        rope_theta=10000.0,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = stop_ids
    model.generation_config.pad_token_id = stop_ids[0]
    model.save_pretrained(out, safe_serialization=True)
    return out
