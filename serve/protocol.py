"""The OpenAI request models the gateway validates before anything reaches a deployment.

Only what the gateway itself relies on is typed; every other field passes through to the
engine unchanged (``extra="allow"``), so new OpenAI/vLLM parameters need no gateway change.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, examples=["tiny"])
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, description="up to 4 stop strings")
    cache_salt: str | None = Field(
        None,
        min_length=1,
        description="requests share prefix-cache KV only with requests of the same salt (e.g. one per policy version)",
    )

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop):
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    @field_validator("n")
    @classmethod
    def _single_choice(cls, n: int) -> int:
        # Each trace row is one trajectory; n > 1 would need one row per choice (not yet).
        if n != 1:
            raise ValueError("only n=1 is supported; send n separate requests")
        return n


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("only one prompt per request is supported")
            return prompt[0]
        if isinstance(prompt, list) and not prompt:
            raise ValueError("prompt must not be empty")
        return prompt


class GenerateSampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    max_tokens: int = Field(16, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    skip_special_tokens: bool | None = None


class GenerateRequest(BaseModel):
    """``POST /inference/v1/generate``: prime-rl's token-in/token-out request."""

    model: str = Field(min_length=1, examples=["tiny"])
    token_ids: list[int] = Field(min_length=1)
    sampling_params: GenerateSampling = GenerateSampling()
    cache_salt: str | None = None

    def completion_body(self) -> dict[str, Any]:
        sp = self.sampling_params.model_dump(exclude_none=True)
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": self.token_ids,
            "stream": False,
            "nvext": {"extra_fields": ["completion_token_ids"]},
        }
        for key in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop_token_ids"):
            if key in sp:
                body[key] = sp[key]
        if sp.get("logprobs") is not None:
            body["logprobs"] = max(sp["logprobs"], 1)
        if self.cache_salt:
            body["cache_salt"] = self.cache_salt
        return body


def generate_response(data: dict[str, Any]) -> dict[str, Any]:
    """A completion response -> prime-rl's generate response (token ids, "token_id:<id>")."""
    ids = (data.get("nvext") or {}).get("completion_token_ids") or []
    choice = (data.get("choices") or [{}])[0]
    out: dict[str, Any] = {"index": 0, "token_ids": ids, "finish_reason": choice.get("finish_reason")}
    lp = choice.get("logprobs")
    if lp and lp.get("token_logprobs") is not None:
        out["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": x} for i, x in zip(ids, lp["token_logprobs"])]}
    return {"id": data.get("id"), "object": "generate", "model": data.get("model"), "choices": [out], "usage": data.get("usage")}
