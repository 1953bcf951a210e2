"""GRPO on the engine's own tokens: a clipped, importance-weighted policy-gradient step on LoRA
parameters, from an ``export rl`` dataset.

Each row is one served completion with the token ids and per-token logprobs the engine sampled
it with (the behaviour policy) and its reward. Advantages are normalised within the group of
completions of the same prompt (reward minus the group's mean, over its standard deviation);
groups whose completions all scored the same teach nothing and are left out. The loss per token
is PPO's clipped surrogate, ``-min(r * A, clip(r, 1 - eps, 1 + eps) * A)`` with ``r = exp(logp_trainer
- logp_engine)``, so a step never moves the policy far from what produced the data.

Before the first step the trainer scores every completion once: the **off-policy gap** is the
mean absolute difference between its logprobs and the engine's for the same tokens (precision,
kernels and a stale adapter all show up there), reported with the training metrics.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from feedback.train import lora_model


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 40
    batch_size: int = 16
    lr: float = 2e-3
    clip_eps: float = 0.2
    rank: int = 8
    alpha: int = 16
    seed: int = 0


def group_advantages(rows: Sequence[dict]) -> list[tuple[dict, float]]:
    """(row, advantage) for each row whose prompt group has a spread of rewards."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("reward") is not None and r.get("completion_ids") and r.get("completion_logprobs"):
            groups[tuple(r["prompt_ids"])].append(r)
    out = []
    for members in groups.values():
        rewards = [m["reward"] for m in members]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
        if std < 1e-6:
            continue
        out += [(m, (m["reward"] - mean) / (std + 1e-4)) for m in members]
    return out


def _batch(items: Sequence[tuple[dict, float]], pad_id: int):
    """Input ids, attention mask, per-token engine logprobs, completion mask, advantages."""
    import torch

    seqs = []
    for row, adv in items:
        n = min(len(row["completion_ids"]), len(row["completion_logprobs"]))
        seqs.append((list(row["prompt_ids"]), list(row["completion_ids"][:n]), list(row["completion_logprobs"][:n]), adv))
    width = max(len(p) + len(c) for p, c, _, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    old = torch.zeros((len(seqs), width))
    tmask = torch.zeros((len(seqs), width))
    advs = torch.tensor([a for *_, a in seqs], dtype=torch.float32)
    for i, (p, c, lp, _) in enumerate(seqs):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attn[i, : len(p) + len(c)] = 1
        old[i, len(p) : len(p) + len(c)] = torch.tensor(lp)
        tmask[i, len(p) : len(p) + len(c)] = 1
    return ids, attn, old, tmask, advs


def _token_logprobs(model, ids, attn):
    """logp of each token given the ones before it (position 0 gets 0)."""
    import torch

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def train_grpo(
    base_model: str | Path,
    rows: Sequence[dict],
    out_dir: str | Path,
    cfg: GRPOConfig = GRPOConfig(),
    init_adapter: str | Path | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> dict:
    """Train a LoRA adapter (from ``init_adapter`` when given) with GRPO on ``rows`` and save
    it to ``out_dir``; returns the metrics (also written to ``flywheel_train.json``)."""
    import torch

    items = group_advantages(rows)
    if not items:
        raise ValueError("no prompt group has completions with different rewards: nothing to learn")
    model, pad_id = lora_model(base_model, cfg.rank, cfg.alpha, cfg.seed, init_adapter)
    with torch.no_grad():
        model.eval()
        ids, attn, old, tmask, _ = _batch(items, pad_id)
        gap = ((_token_logprobs(model, ids, attn) - old).abs() * tmask).sum() / tmask.sum()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    rng = random.Random(cfg.seed)
    losses, clipped = [], []
    for step in range(cfg.steps):
        ids, attn, old, tmask, advs = _batch(rng.sample(items, min(cfg.batch_size, len(items))), pad_id)
        ratio = torch.exp(_token_logprobs(model, ids, attn) - old)
        adv = advs[:, None]
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
        loss = -(surrogate * tmask).sum() / tmask.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        clipped.append((((ratio - 1).abs() > cfg.clip_eps).float() * tmask).sum().item() / tmask.sum().item())
        if progress:
            progress(step + 1, losses[-1])
    out = Path(out_dir)
    model.save_pretrained(out)
    metrics = {
        "algo": "grpo",
        "rows": len(rows),
        "rows_with_signal": len(items),
        "off_policy_gap": round(gap.item(), 5),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "clipped_share_last": round(clipped[-1], 4),
    }
    (out / "flywheel_train.json").write_text(
        json.dumps(
            {
                "base_model": str(base_model),
                "init_adapter": str(init_adapter) if init_adapter else None,
                "config": asdict(cfg),
                **metrics,
            },
            indent=2,
        )
    )
    return metrics
