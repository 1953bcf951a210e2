"""The tiny built-in trainer: LoRA SFT on engine-exact token ids, on CPU.

It trains on the token ids the engine saw and produced (``prompt_token_ids`` +
``completion_token_ids`` from the trace store), with the loss on the completion only, so there
is no re-rendering or re-tokenizing between serving and training. Real runs use an external
trainer (prime-rl, TRL); this one exists so one turn of the loop fits in minutes on 2 cores.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 40
    batch_size: int = 8
    lr: float = 3e-3
    rank: int = 8
    alpha: int = 16
    seed: int = 0
    max_len: int = 1024


def pad_batch(rows: Sequence[dict], pad_id: int, max_len: int):
    """(input ids, attention mask, labels) for prompt+completion rows: the prompt's labels
    are -100, so only the completion is learned; right-padded with ``pad_id``."""
    import torch

    seqs, labels = [], []
    for r in rows:
        prompt, completion = list(r["prompt_token_ids"]), list(r["completion_token_ids"])
        ids = (prompt + completion)[:max_len]
        seqs.append(ids)
        labels.append(([-100] * len(prompt) + completion)[:max_len])
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    label_ids = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, lab) in enumerate(zip(seqs, labels)):
        input_ids[i, : len(s)] = torch.tensor(s)
        label_ids[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(s)] = 1
    return input_ids, mask, label_ids


def _fit(
    model, rows: Sequence[dict], pad_id: int, cfg: TrainConfig, progress: Callable[[int, float], None] | None
) -> list[float]:
    """AdamW on the completion tokens of random batches of ``rows``; the loss of each step."""
    import torch

    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    model.train()
    losses = []
    for step in range(cfg.steps):
        input_ids, mask, labels = pad_batch(rng.sample(rows, min(cfg.batch_size, len(rows))), pad_id, cfg.max_len)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if progress:
            progress(step + 1, losses[-1])
    return losses


def _with_completions(rows: Sequence[dict]) -> list[dict]:
    rows = [r for r in rows if r.get("completion_token_ids")]
    if not rows:
        raise ValueError("no training rows with completion tokens")
    return rows


def lora_model(base_model: str | Path, rank: int, alpha: int, seed: int, init_adapter: str | Path | None = None):
    """(trainable LoRA model over ``base_model`` in fp32, its pad id): a new adapter, or
    ``init_adapter`` to continue from."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    if init_adapter is not None:
        return PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True), pad_id
    return get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    ), pad_id


def train_lora(
    base_model: str | Path,
    rows: Sequence[dict],
    out_dir: str | Path,
    cfg: TrainConfig = TrainConfig(),
    progress: Callable[[int, float], None] | None = None,
    init_adapter: str | Path | None = None,
) -> Path:
    """Fine-tune a LoRA adapter on ``rows`` (dicts with prompt/completion token ids) and save it
    in PEFT's layout (``adapter_config.json`` + ``adapter_model.safetensors``). With
    ``init_adapter``, training continues from that adapter (the parent checkpoint)."""
    rows = _with_completions(rows)
    model, pad_id = lora_model(base_model, cfg.rank, cfg.alpha, cfg.seed, init_adapter)
    losses = _fit(model, rows, pad_id, cfg, progress)
    out = Path(out_dir)
    model.save_pretrained(out)
    (out / "flywheel_train.json").write_text(
        json.dumps(
            {
                "base_model": str(base_model),
                "init_adapter": str(init_adapter) if init_adapter else None,
                "rows": len(rows),
                "config": cfg.__dict__,
                "loss_first": losses[0],
                "loss_last": losses[-1],
            },
            indent=2,
        )
    )
    return out


def train_full(
    base_model: str | Path,
    rows: Sequence[dict],
    out_dir: str | Path,
    cfg: TrainConfig = TrainConfig(lr=1e-4),
    progress: Callable[[int, float], None] | None = None,
) -> Path:
    """Fine-tune every parameter of ``base_model`` on ``rows`` and save a complete Hugging Face
    checkpoint (config, ``model.safetensors`` and the base's tokenizer files), the layout
    ``POST /update_weights`` reloads in place and a new deployment can start from."""
    import torch
    from transformers import AutoModelForCausalLM

    rows = _with_completions(rows)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    losses = _fit(model, rows, pad_id, cfg, progress)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    copy_beside_weights(base_model, out)
    (out / "flywheel_train.json").write_text(
        json.dumps(
            {
                "base_model": str(base_model),
                "kind": "full",
                "rows": len(rows),
                "config": cfg.__dict__,
                "loss_first": losses[0],
                "loss_last": losses[-1],
            },
            indent=2,
        )
    )
    return out


def copy_beside_weights(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer and every other file of checkpoint ``src`` that is not weights (and
    that ``dst`` lacks) into ``dst``, so ``dst`` is a checkpoint an engine can start from."""
    import shutil

    for f in Path(src).iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not (Path(dst) / f.name).exists():
            shutil.copy2(f, Path(dst) / f.name)
