"""Agentic request plans: growing multi-turn sessions mixed with cold arrivals, or a Mooncake trace.

Prompts are token ids (the completions API takes them as-is), so the same plan drives the mocker
and real vLLM and the prefix structure is exact: turn k+1's prompt starts with turn k's prompt.
The production shape is ~6K new tokens per turn on a ~140K-token prompt (4.3 %); the defaults keep
that ratio at a size the tiny model and the mocker handle.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

FIRST_ID, LAST_ID = 16, 4000  # inside the tiny model's vocabulary, clear of special tokens


class SessionShape(BaseModel):
    sessions: int = Field(32, description="agent sessions in the plan")
    turns: int = Field(6, description="turns per session")
    shared_prefix: int = Field(1024, description="tokens every session starts with (system prompt, tools)")
    history: int = Field(12_000, description="session-specific history before the first turn")
    step: int = Field(560, description="new tokens per turn (tool output + the last answer): ~4.3 %")
    output: int = Field(128, description="tokens generated per turn")
    cold_fraction: float = Field(0.2, description="share of jobs that are cold arrivals")
    cold_prompt: int = Field(8_000, description="a cold arrival's uncached prompt")
    seed: int = 0


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    session: str | None = None
    at_s: float | None = None  # trace replay: send time from the start


@dataclass
class Job:
    """What one simulated user does next: a whole session (turns in order) or one cold request."""

    requests: list[Request] = field(default_factory=list)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(FIRST_ID, LAST_ID) for _ in range(n)]


def session_plan(shape: SessionShape) -> list[Job]:
    rng = random.Random(shape.seed)
    shared = _tokens(rng, shape.shared_prefix)
    sessions = []
    for s in range(shape.sessions):
        prompt = shared + _tokens(rng, shape.history)
        turns = []
        for _ in range(shape.turns):
            prompt = prompt + _tokens(rng, shape.step)
            turns.append(Request(prompt, shape.output, session=f"s{shape.seed}-{s}"))
        sessions.append(Job(turns))
    n_cold = round(shape.sessions * shape.turns * shape.cold_fraction / (1 - shape.cold_fraction))
    cold = [Job([Request(_tokens(rng, shape.cold_prompt), shape.output)]) for _ in range(n_cold)]
    jobs = sessions + cold
    rng.shuffle(jobs)
    return jobs


def _block_tokens(hash_id: int, n: int, salt: int) -> list[int]:
    return _tokens(random.Random(hash_id * 1_000_003 + salt), n)


def mooncake_plan(
    path: Path, block_tokens: int = 512, scale: float = 1.0, time_scale: float = 1.0, limit: int | None = None, salt: int = 0
) -> list[Job]:
    """A Mooncake-style trace (JSON lines: timestamp ms, input_length, output_length, hash_ids with
    one id per ``block_tokens`` tokens; equal ids mean equal content). ``scale`` shrinks every
    length (a 0.05 scale turns 512-token blocks into 25-token ones) so the tiny model can serve it;
    ``time_scale`` stretches the arrival times."""
    jobs = []
    per_block = max(1, round(block_tokens * scale))
    for n, line in enumerate(Path(path).read_text().splitlines()):
        if limit is not None and n >= limit:
            break
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in row]
        if missing:
            raise ValueError(f"{path}:{n + 1}: a Mooncake trace row needs {', '.join(missing)}")
        ids, length = row["hash_ids"], max(1, round(row["input_length"] * scale))
        out, ts = max(1, round(row["output_length"] * scale)), float(row["timestamp"])
        prompt = [t for h in ids for t in _block_tokens(int(h), per_block, salt)]
        if len(prompt) < length:  # the last block may be partial, ids may not cover the tail
            prompt += _block_tokens(-(n + 1), length - len(prompt), salt)
        jobs.append(Job([Request(prompt[:length], out, at_s=ts / 1000 * time_scale)]))
    return jobs


def prefix_hashes(prompt: list[int], block: int, partial: bool = False) -> list[int]:
    """One hash per block, each covering the whole prompt up to that block's end, so equal hashes
    mean equal prefixes; ``partial`` also hashes a trailing incomplete block."""
    end = len(prompt) if partial else len(prompt) // block * block
    h, out = 0, []
    for b in range(0, end, block):
        h = hash((h, tuple(prompt[b : b + block])))
        out.append(h)
    return out


def ideal_cached(prompts: list[list[int]], block: int) -> list[int]:
    """Per request, in send order: the cached tokens an infinite cache with perfect routing gives,
    i.e. the longest whole-block prefix shared with any earlier request (an engine always computes
    the last token, so a full hit still leaves one block to run)."""
    seen: set[int] = set()
    out = []
    for prompt in prompts:
        hashes = prefix_hashes(prompt, block)
        hit = 0
        for h in hashes[: (len(prompt) - 1) // block]:
            if h not in seen:
                break
            hit += 1
        seen.update(hashes)
        out.append(hit * block)
    return out


def to_mooncake(jobs: list[Job], block_tokens: int = 512, rate_per_s: float = 2.0, seed: int = 0) -> list[dict]:
    """The plan as Mooncake trace rows (Poisson arrivals at ``rate_per_s``, session turns in
    order): equal prefixes get equal hash ids, so replaying the rows reproduces the reuse."""
    rng = random.Random(seed)
    ids: dict[int, int] = {}
    rows, t = [], 0.0
    for job in jobs:
        for req in job.requests:
            t += rng.expovariate(rate_per_s)
            hashes = [ids.setdefault(h, len(ids)) for h in prefix_hashes(req.prompt, block_tokens, partial=True)]
            rows.append(
                {
                    "timestamp": round(t * 1000),
                    "input_length": len(req.prompt),
                    "output_length": req.max_tokens,
                    "hash_ids": hashes,
                }
            )
    return rows
