"""The loop's training algorithms, a registry keyed by ``loop.algo``.

An algorithm says which of a turn's rows it trains on (one SQL over the store) and how it turns
them into a checkpoint. Adding one is a class here and a key in ``ALGORITHMS``; the phases do not
change.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from loop.config import LoopConfig
from loop.scope import quote


class NothingToLearn(Exception):
    """This turn's rows carry no signal (every group scored alike): the parent checkpoint stays."""


def _rewarded(scope: str) -> str:
    return (
        "SELECT t.*, r.reward FROM traces t JOIN rewards r USING (trace_id) "
        f"WHERE r.name = 'reward' AND t.http_status = 200 AND {scope} AND "
    )


class Algorithm:
    export_kind: ClassVar[str]  # feedback.export's dataset kind

    def __init__(self, lc: LoopConfig):
        self.lc = lc

    @property
    def checkpoint_kind(self) -> str:
        return "lora"

    def training_sql(self, scope: str, env_id: str, run_id: str) -> str:
        raise NotImplementedError

    def from_rows(self, rows: str) -> str:
        """What it trains on among ``rows`` (a SELECT of whole trace rows with their ``reward``:
        a production turn's, loop/production.py)."""
        raise NotImplementedError

    def train(self, base: Path, rows: list[dict], out: Path, seed: int, init: str | None) -> dict:
        """Train from ``base`` (or the parent's ``init`` adapter or weights) into ``out``; the metrics."""
        raise NotImplementedError


class GRPO(Algorithm):
    """Policy gradient on this turn's groups, as sampled (tokens and logprobs) by the policy being updated."""

    export_kind = "rl"

    def training_sql(self, scope: str, env_id: str, run_id: str) -> str:
        return _rewarded(scope) + f"t.env_id = {quote(env_id)}"

    def from_rows(self, rows: str) -> str:
        return rows  # every rewarded row; groups are the rows of one prompt

    def train(self, base: Path, rows: list[dict], out: Path, seed: int, init: str | None) -> dict:
        from feedback.grpo import GRPOConfig, train_grpo

        try:
            return train_grpo(base, rows, out, GRPOConfig(steps=self.lc.steps, seed=seed), init_adapter=init)
        except ValueError as exc:
            raise NothingToLearn(str(exc)) from None


class RejectionSampling(Algorithm):
    """SFT on the first exact solve per task among the run's rollouts so far (a LoRA, or every
    weight with ``loop.full``)."""

    export_kind = "sft"

    @property
    def checkpoint_kind(self) -> str:
        return "full" if self.lc.full else "lora"

    def training_sql(self, scope: str, env_id: str, run_id: str) -> str:
        return (
            _rewarded(scope) + f"t.env_id LIKE {quote(run_id + '-t%')} AND r.reward >= {float(self.lc.solve_at)} "
            "QUALIFY row_number() OVER (PARTITION BY t.example_id ORDER BY t.trace_id) = 1"
        )

    def from_rows(self, rows: str) -> str:
        return (
            f"SELECT * FROM ({rows}) WHERE reward >= {float(self.lc.solve_at)} "
            "QUALIFY row_number() OVER (PARTITION BY example_id ORDER BY trace_id) = 1"
        )

    def train(self, base: Path, rows: list[dict], out: Path, seed: int, init: str | None) -> dict:
        from feedback.train import TrainConfig, train_full, train_lora

        losses: list[float] = []
        if self.lc.full:
            train_full(
                init or base,
                rows,
                out,
                TrainConfig(steps=self.lc.steps, lr=3e-4, seed=seed),
                progress=lambda s, loss: losses.append(loss),
            )
        else:
            train_lora(
                base,
                rows,
                out,
                TrainConfig(steps=self.lc.steps, seed=seed),
                progress=lambda s, loss: losses.append(loss),
                init_adapter=init,
            )
        return {"algo": "rs", "rows": len(rows), "loss_first": losses[0], "loss_last": losses[-1]}


ALGORITHMS: dict[str, type[Algorithm]] = {"grpo": GRPO, "rs": RejectionSampling}


def algorithm_for(lc: LoopConfig) -> Algorithm:
    return ALGORITHMS[lc.algo](lc)
