"""Runs an environment's tasks through the gateway like any client and posts the rewards back.

Every rollout carries ``X-Env-ID``, ``X-Example-ID``, ``X-Rollout-ID`` and ``X-Session-ID``, so
its trace row says where it came from; the gateway answers with ``X-Trace-ID``, which is what
the reward is posted against (``POST /v1/feedback``).
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import httpx


@dataclass
class Rollout:
    example_id: str
    rollout_id: str
    trace_id: str
    completion: str
    reward: float


def run_rollouts(base_url: str, api_key: str, model: str, tasks: Sequence, samples: int,
                 reward_fn: Callable, env_id: str, temperature: float = 1.0, max_tokens: int = 8,
                 concurrency: int = 8, seed: int = 0) -> list[Rollout]:
    """``samples`` completions per task (greedy when temperature is 0)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=2)
    jobs = [(task, k) for task in tasks for k in range(samples)]

    def one(job) -> Rollout:
        task, k = job
        rollout_id = f"{env_id}-{task.example_id}-{k}-{uuid.uuid4().hex[:8]}"
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": task.prompt}], max_tokens=max_tokens,
            temperature=temperature, seed=seed * 100_003 + k,
            extra_headers={"X-Env-ID": env_id, "X-Example-ID": task.example_id,
                           "X-Rollout-ID": rollout_id, "X-Session-ID": rollout_id})
        text = raw.parse().choices[0].message.content or ""
        return Rollout(task.example_id, rollout_id, raw.headers["x-trace-id"], text, reward_fn(task, text))

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, jobs))


def post_rewards(base_url: str, api_key: str, rollouts: Sequence[Rollout], env_id: str) -> None:
    body = {"feedback": [{"trace_id": r.trace_id, "reward": r.reward, "source": f"env:{env_id}"}
                         for r in rollouts]}
    resp = httpx.post(f"{base_url}/v1/feedback", json=body,
                      headers={"Authorization": f"Bearer {api_key}"}, timeout=60)
    resp.raise_for_status()


def mean_reward(rollouts: Sequence[Rollout]) -> float:
    return sum(r.reward for r in rollouts) / max(len(rollouts), 1)
