"""A completion's tokens as text pieces with their logprobs, for the trace page.

The store keeps token ids exactly as the engine produced them; to show them as text the page
needs the tokenizer of the checkpoint that served them. Deployments name the model directory
their workers started on; its ``tokenizer.json`` is loaded once and kept.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from serve.config import GatewayConfig


@lru_cache(maxsize=8)
def _tokenizer(model_dir: str):
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    return Tokenizer.from_file(str(path)) if path.is_file() else None


def tokenizer_for(config: GatewayConfig, deployment: str | None):
    dirs = [d.model_path for d in config.deployments if d.name == deployment and d.model_path]
    dirs += [d.model_path for d in config.deployments if d.model_path]
    for model_dir in dirs:
        tok = _tokenizer(model_dir)
        if tok is not None:
            return tok
    return None


def pieces(token_ids: list[int] | None, logprobs: list[float] | None, tokenizer) -> list[dict]:
    """One entry per token: its text (``#id`` when no tokenizer is known), id, logprob, and a
    probability bucket 0-4 the page colours by (4: the model was sure, 0: below 5 %)."""
    out = []
    for i, token_id in enumerate(token_ids or []):
        lp = logprobs[i] if logprobs and i < len(logprobs) else None
        text = tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer else f"#{token_id}"
        if lp is None:
            bucket = None
        else:
            p = math.exp(lp)
            bucket = 4 if p >= 0.9 else 3 if p >= 0.6 else 2 if p >= 0.3 else 1 if p >= 0.05 else 0
        out.append({"text": text, "id": token_id, "logprob": lp, "bucket": bucket})
    return out
