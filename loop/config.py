"""What a loop run is asked to do: the ``[loop]`` table of the stack's typed configuration.

Set like every other key: in a profile's ``[loop]`` table, as ``FLYWHEEL_LOOP__TURNS=5``, or as
``--set loop.turns=5``; ``flywheel loop``'s flags are shorthands for the same keys.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from feedback.canary import CanaryPolicy


class LoopConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: str = Field("envs.vf_wordops", description="verifiers taskset: MODULE or MODULE:Taskset, importable from PYTHONPATH")
    env_args: dict = Field(default_factory=dict, description="the taskset's config fields")
    turns: int = Field(3, ge=0)
    algo: Literal["grpo", "rs"] = Field(
        "grpo",
        description="a key of loop.algorithms.ALGORITHMS: grpo "
        "(policy gradient on the engine's logprobs) or rs "
        "(rejection sampling: SFT on exact solves)",
    )
    train_tasks: int = Field(32, ge=1, description="tasks rolled out each turn (the first ones)")
    eval_tasks: int = Field(64, ge=1, description="the tasks after them, held back for the greedy eval")
    samples: int = Field(8, ge=1, description="rollouts per task (the GRPO group)")
    max_tokens: int = Field(8, ge=1, description="max tokens per model turn")
    steps: int = Field(40, ge=1, description="optimiser steps per turn")
    solve_at: float = Field(1.0, description="an exact solve: reward at least this (the max)")
    seed: int = 0
    full: bool = Field(False, description="rs only: fine-tune every weight, reload in place")
    from_traces: str | None = Field(
        None,
        description="train on production traffic, not rollouts: one SELECT over the team's views returning "
        "trace_id and reward (loop/production.py); each turn takes those rows served by the serving "
        "checkpoint since the last turn",
    )
    min_rows: int = Field(128, ge=1, description="--from-traces: rewarded rows a turn waits for before it trains")
    wait_rows_s: float = Field(1800, gt=0, description="--from-traces: how long a turn waits for them")
    deploy: Literal["direct", "canary", "dedicated"] | None = Field(
        None,
        description="how a turn's checkpoint is released: direct (the alias moves to it), canary (a share of "
        "the alias's sessions, promoted or rolled back on online reward) or dedicated (a deployment of "
        "its own for the loop's team, which the loop's rollouts and evals then use); default canary "
        "with --from-traces, else direct",
    )
    canary: CanaryPolicy = Field(default_factory=CanaryPolicy, description="deploy canary: the canary's policy")

    @property
    def release(self) -> str:
        return self.deploy or ("canary" if self.from_traces else "direct")
