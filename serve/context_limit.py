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


def _overflow(max_model_len: int, prompt_len: int, wanted: int, at_least: bool, param: str) -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens; you asked for "
        f"{'at least ' if at_least else ''}{prompt_len + wanted} ({prompt_len} in the prompt, "
        f"{wanted} to complete). Shorten the prompt or lower max_tokens.",
        param=param,
        code="context_length_exceeded",
    )


def check_counts(body: dict, max_model_len: int | None) -> None:
    """What can be decided without a tokenizer: ``max_tokens`` alone, or a token-id prompt."""
    if not max_model_len:
        return
    wanted = body.get("max_completion_tokens") or body.get("max_tokens")
    param = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
    prompt = body.get("prompt")
    prompt_len = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) else 0
    if prompt_len and prompt_len + (wanted or 1) > max_model_len:
        raise _overflow(max_model_len, prompt_len, wanted or 1, at_least=False, param="prompt")
    if wanted and wanted >= max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; {param} = {wanted} leaves no room for the prompt.",
            param=param,
            code="context_length_exceeded",
        )


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


@functools.lru_cache(maxsize=8)
def _chat_template(model_path: str):
    """The deployment's tokenizer with its chat template, as transformers loads it (None when it
    has none): the engine's prompt is that template rendered, tools included."""
    try:
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(model_path)
    except (OSError, ValueError):
        return None
    return tok if tok.chat_template else None


def _rendered(body: dict, model_path: str) -> list[str] | None:
    """A chat request with tools as the engine will see it: the template renders every tool's
    schema into the prompt, where the messages alone leave them uncounted (120 tools once passed
    this check and the engine refused the request, a 502 instead of this 400)."""
    template = _chat_template(model_path)
    if template is None:
        return None
    try:
        return [template.apply_chat_template(body["messages"], tools=body["tools"], tokenize=False, add_generation_prompt=True)]
    except Exception:  # a template that cannot render this request: count the messages, the engine decides
        return None


def count_prompt_tokens(messages: list[dict], tools: list[dict] | None, model_path: str | None) -> int:
    """The tokens of a chat prompt as the engine renders it (its chat template, tools
    included); the message texts alone for a model without a template. Call off the loop."""
    template = _chat_template(model_path) if model_path else None
    if template is not None:
        try:
            ids = template.apply_chat_template(
                messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
            )
            return len(ids)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render this request
            raise APIError(400, f"the model's chat template cannot render these messages: {exc}", param="messages") from None
    tok = _tokenizer(model_path) if model_path else None
    if tok is None:
        raise APIError(503, "this model has no tokenizer to count with", type="server_error")
    texts = prompt_texts({"messages": messages})
    return sum(len(e.ids) for e in tok.encode_batch_fast(texts, add_special_tokens=False)) if texts else 0


def check_text(body: dict, max_model_len: int, model_path: str | None) -> None:
    """Tokenize a long text prompt (call off the event loop) and refuse it if it cannot fit.

    Counted a slice at a time, stopping as soon as the count is over: a 20 MB prompt is refused
    after its first few thousand tokens, and no single tokenizer call holds the GIL long enough
    to stall the gateway's other streams (one ``encode`` of a 2 MB string held it for 3 s)."""
    tok = _tokenizer(model_path) if model_path else None
    if tok is None:  # no tokenizer to count with: the engine decides
        return
    wanted = body.get("max_completion_tokens") or body.get("max_tokens") or 1
    texts = (
        _rendered(body, model_path) if body.get("tools") and isinstance(body.get("messages"), list) else None
    ) or prompt_texts(body)
    prompt_len, slices, whole = 0, _slices(texts), True
    for batch, cuts in slices:
        # a cut adds at most one token (a SentencePiece word start) and none for byte-level BPE,
        # whose merges never cross whitespace: less one per cut keeps the count a lower bound
        prompt_len += sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False)) - cuts
        if prompt_len + wanted > max_model_len:
            whole = next(slices, None) is None
            break
    if prompt_len + wanted > max_model_len:
        chat = isinstance(body.get("messages"), list)
        raise _overflow(max_model_len, prompt_len, wanted, at_least=chat or not whole, param="messages" if chat else "prompt")


SLICE_CHARS = 64 << 10


def _slices(texts: list[str]):
    """(texts, cuts): batches of about ``SLICE_CHARS``, a longer text cut at whitespace."""
    batch, size, cuts = [], 0, 0
    for text in texts:
        pieces = _pieces(text)
        for piece in pieces:
            batch.append(piece)
            size += len(piece)
            if size >= SLICE_CHARS:
                yield batch, cuts
                batch, size, cuts = [], 0, 0
        cuts += len(pieces) - 1
    if batch:
        yield batch, cuts


def _pieces(text: str) -> list[str]:
    """``text`` in pieces of about ``SLICE_CHARS``, each cut just before a whitespace character
    (where pre-tokenizers split anyway); a stretch with no whitespace is one piece."""
    pieces, start = [], 0
    while len(text) - start > SLICE_CHARS:
        cut = max(text.rfind(" ", start + 1, start + SLICE_CHARS), text.rfind("\n", start + 1, start + SLICE_CHARS))
        if cut <= start:
            cut = min(
                (i for i in (text.find(" ", start + SLICE_CHARS), text.find("\n", start + SLICE_CHARS)) if i > 0),
                default=len(text),
            )
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces
