"""GRPO on exported rows: group-normalised advantages, an off-policy gap that measures the
distance to the engine's logprobs, and an update that moves probability to the rewarded answer."""

import pytest
import torch

from feedback.grpo import GRPOConfig, _token_logprobs, group_advantages, train_grpo

PROMPT = [2, 203, 268, 1391, 30, 2947, 3]


def row(completion, reward, logprobs=None, prompt=PROMPT):
    return {
        "prompt_ids": prompt,
        "completion_ids": completion,
        "reward": reward,
        "completion_logprobs": logprobs if logprobs is not None else [-1.0] * len(completion),
    }


def test_advantages_are_normalised_per_prompt_and_flat_groups_are_dropped():
    rows = [
        row([5], 1.0),
        row([6], 0.0),
        row([7], 0.0),
        row([8], 1.0),
        row([5], 0.5, prompt=[9, 9]),
        row([6], 0.5, prompt=[9, 9]),
    ]  # no spread: no signal
    got = group_advantages(rows)
    assert len(got) == 4
    assert [round(a, 3) for _, a in got] == [1.0, -1.0, -1.0, 1.0]


def test_no_group_with_a_spread_of_rewards_is_an_error():
    with pytest.raises(ValueError, match="different rewards"):
        train_grpo("unused", [row([5], 1.0), row([6], 1.0)], "unused")


def engine_logprobs(model_dir, completion, shift=0.0):
    """What an engine running exactly these weights would report for ``completion``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([PROMPT + completion])
    with torch.no_grad():
        lp = _token_logprobs(model, ids, torch.ones_like(ids))[0, len(PROMPT) :]
    return [x + shift for x in lp.tolist()]


def score(model_dir, adapter, completion) -> float:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), adapter)
    ids = torch.tensor([PROMPT + completion])
    with torch.no_grad():
        return _token_logprobs(model, ids, torch.ones_like(ids))[0, len(PROMPT) :].sum().item()


def test_the_update_moves_probability_to_the_rewarded_completion(tiny_model_dir, tmp_path):
    good, bad = [500, 501, 0], [600, 601, 0]
    rows = [row(good, 1.0, engine_logprobs(tiny_model_dir, good)), row(bad, 0.0, engine_logprobs(tiny_model_dir, bad))] * 4
    metrics = train_grpo(tiny_model_dir, rows, tmp_path / "a", GRPOConfig(steps=15, batch_size=8))
    assert metrics["off_policy_gap"] < 1e-3  # same weights as the "engine": no gap
    before = engine_logprobs(tiny_model_dir, good), engine_logprobs(tiny_model_dir, bad)
    assert score(tiny_model_dir, tmp_path / "a", good) > sum(before[0]) + 1.0
    assert score(tiny_model_dir, tmp_path / "a", bad) < sum(before[1])
    assert (tmp_path / "a" / "adapter_config.json").exists()


def test_the_off_policy_gap_is_the_distance_to_the_engines_logprobs(tiny_model_dir, tmp_path):
    good, bad = [500, 501], [600, 601]
    rows = [
        row(good, 1.0, engine_logprobs(tiny_model_dir, good, shift=0.5)),
        row(bad, 0.0, engine_logprobs(tiny_model_dir, bad, shift=-0.5)),
    ]
    metrics = train_grpo(tiny_model_dir, rows, tmp_path / "b", GRPOConfig(steps=1, batch_size=2))
    assert metrics["off_policy_gap"] == pytest.approx(0.5, abs=1e-3)
