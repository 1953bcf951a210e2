"""`flywheel demo`: `flywheel loop` on the built-in task, 3 turns by default.

The task is ``envs.vf_wordops``: ``Apply tail to: w1 w2 w3`` wants the last word, and ``tail`` is
a name the warmed base model never saw (``deploy/models/warm_model.py`` says what it did see). GRPO on
the served rollouts' own tokens and logprobs has to find which of its skills the reward wants;
the exact-solve rate on held-back tasks is what it reports, the partial credit only shapes.
"""

from __future__ import annotations

from deploy.stack.config import StackConfig
from deploy.loop import run_loop
from deploy.loop_state import LoopConfig


def run_demo(cfg: StackConfig, keep_up: bool = False, turns: int = 3, seed: int = 0,
             full: bool = False, as_json: bool = False) -> dict:
    """``ok`` is True when the exact-solve rate after the last turn beats the base model's. With
    ``full``, each turn is rejection sampling fine-tuning every weight, reloaded in place."""
    lc = LoopConfig(turns=turns, seed=seed, algo="rs" if full else "grpo", full=full)
    result = run_loop(cfg, lc, keep_up=keep_up, as_json=as_json)
    evals = [t["eval"] for t in result["turns"]]
    result["ok"] = evals[-1]["exact_solve"] > evals[0]["exact_solve"]
    return result
