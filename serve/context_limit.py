"""Requests that cannot fit the model's context get ``400 context_length_exceeded`` with both
numbers, before anything is admitted or sent (engines differ: vLLM answers 400, Dynamo's mocker
a bare 500).

``max_tokens`` alone and token-id prompts are checked by counting. A text prompt is tokenized only
when it might not fit: a byte-level BPE token is at least one byte, so a prompt whose UTF-8 size
(with admission's margin for the chat template) is below the room left cannot overflow, and
ordinary requests cost nothing. A longer one is
tokenized with the deployment's own tokenizer (its ``tokenizer.json``), counting the message texts
only, so the count is a lower bound (the chat template adds tokens): what it refuses cannot fit.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from serve.admission import worst_case_tokens
from serve.errors import APIError


def _overflow(max_model_len: int, prompt_len: int, wanted: int, at_least: bool) -> APIError:
    return APIError(400, f"This model's maximum context length is {max_model_len} tokens; you asked for "
                         f"{'at least ' if at_least else ''}{prompt_len + wanted} ({prompt_len} in the prompt, "
                         f"{wanted} to complete). Shorten the prompt or lower max_tokens.",
                    param="messages" if at_least else "prompt", code="context_length_exceeded")


def check_counts(body: dict, max_model_len: int | None) -> None:
    """What can be decided without a tokenizer: ``max_tokens`` alone, or a token-id prompt."""
    if not max_model_len:
        return
    wanted = body.get("max_completion_tokens") or body.get("max_tokens")
    param = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    prompt = body.get("prompt")
    prompt_len = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) else 0
    if prompt_len and prompt_len + (wanted or 1) > max_model_len:
        raise _overflow(max_model_len, prompt_len, wanted or 1, at_least=False)
    if wanted and wanted >= max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens; {param} = "
                            f"{wanted} leaves no room for the prompt.", param=param,
                       code="context_length_exceeded")


def prompt_texts(body: dict) -> list[str]:
    """The text a prompt is made of: a completion's string prompt, or every message's text."""
    if isinstance(body.get("prompt"), str):
        return [body["prompt"]]
    texts: list[str] = []
    for message in body.get("messages") or []:
        content: Any = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return texts


def might_overflow(body: dict, max_model_len: int | None, worst: tuple[int, int] | None = None) -> bool:
    """True when the prompt is long enough that it could overflow (cheap: the same byte bound
    admission reserves by, ``worst`` when the caller has it, no tokenizer)."""
    if not max_model_len:
        return False
    bound, _ = worst or worst_case_tokens(body)
    return bound + (body.get("max_completion_tokens") or body.get("max_tokens") or 1) > max_model_len


@functools.lru_cache(maxsize=8)
def _tokenizer(model_path: str):
    from tokenizers import Tokenizer

    path = Path(model_path) / "tokenizer.json"
    return Tokenizer.from_file(str(path)) if path.exists() else None


def check_text(body: dict, max_model_len: int, model_path: str | None) -> None:
    """Tokenize a long text prompt (call off the event loop) and refuse it if it cannot fit."""
    tok = _tokenizer(model_path) if model_path else None
    if tok is None:  # no tokenizer to count with: the engine decides
        return
    wanted = body.get("max_completion_tokens") or body.get("max_tokens") or 1
    prompt_len = sum(len(e.ids) for e in tok.encode_batch(prompt_texts(body), add_special_tokens=False))
    if prompt_len + wanted > max_model_len:
        raise _overflow(max_model_len, prompt_len, wanted, at_least=isinstance(body.get("messages"), list))
