"""The loop's base checkpoint: the tiny model after a short warm-up on the word-list family.

A random-weight model cannot discover a task by sampling: nothing it says is ever right, so
RL has nothing to reinforce. The warm-up gives it skills without the task: full fine-tuning
(next-token loss on the answer) on ``Apply NAME to: WORDS`` for the four operations of
``envs.wordops``, each under its four known names, plus a fifth of examples under a throwaway
name with a random operation. What it never sees: the names in ``wordops.UNSEEN_NAMES``
(``tail``, the demo's task, and ``head``, the tests'). Asked to apply one of those, the warmed
model answers with one of its skills at random, so some samples are right and RL can learn
which one the reward wants. It is saved in the Hugging Face layout with ``warmup.json``
(the recipe, what it saw, the final loss) and rebuilt only when the recipe changes.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from envs import wordops
from feedback.train import pad_batch

THROWAWAY_SHARE = 0.2


@dataclass(frozen=True)
class WarmupRecipe:
    steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0

    def key(self) -> str:
        seen = {
            "recipe": asdict(self),
            "names": wordops.KNOWN_NAMES,
            "throwaway": wordops.THROWAWAY_NAMES,
            "words": wordops.WORDS,
            "lengths": [wordops.MIN_WORDS, wordops.MAX_WORDS],
            "throwaway_share": THROWAWAY_SHARE,
        }
        return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:16]


def _example(tok, eos: int, rng: random.Random) -> tuple[list[int], list[int]]:
    operation = rng.choice(sorted(wordops.OPERATIONS))
    if rng.random() < THROWAWAY_SHARE:
        name = rng.choice(wordops.THROWAWAY_NAMES)
    else:
        name = rng.choice(wordops.KNOWN_NAMES[operation])
    words = rng.sample(wordops.WORDS, rng.randint(wordops.MIN_WORDS, wordops.MAX_WORDS))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": wordops.prompt(name, words)}], tokenize=True, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    answer = " " + " ".join(wordops.OPERATIONS[operation](words))
    return list(prompt), tok(answer, add_special_tokens=False)["input_ids"] + [eos]


def warm_up(
    base_model: str | Path,
    out_dir: str | Path,
    recipe: WarmupRecipe = WarmupRecipe(),
    progress: Callable[[int, int, float], None] | None = None,
) -> Path:
    """Fine-tune ``base_model`` on the word-list family into ``out_dir`` (skipped when
    ``out_dir`` already holds this recipe's result); returns ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from feedback.train import copy_beside_weights

    out = Path(out_dir)
    stamp = out / "warmup.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == recipe.key():
        return out
    t0 = time.monotonic()
    torch.manual_seed(recipe.seed)
    tok = AutoTokenizer.from_pretrained(base_model)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    # one warm ramp then a long decay: the loss falls from ~8 to ~0.1 in 1,500 steps here
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=recipe.steps, pct_start=0.1)
    rng = random.Random(recipe.seed)
    model.train()
    loss = float("nan")
    for step in range(recipe.steps):
        pairs = [_example(tok, eos, rng) for _ in range(recipe.batch_size)]
        ids, mask, labels = pad_batch(
            [{"prompt_token_ids": p, "completion_token_ids": c} for p, c in pairs], eos, max(len(p) + len(c) for p, c in pairs)
        )
        out_loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        out_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        loss = out_loss.item()
        if progress:
            progress(step + 1, recipe.steps, loss)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    copy_beside_weights(base_model, out)
    stamp.write_text(
        json.dumps(
            {
                "key": recipe.key(),
                "recipe": asdict(recipe),
                "base_model": str(base_model),
                "saw": {
                    "operations": sorted(wordops.OPERATIONS),
                    "names": wordops.KNOWN_NAMES,
                    "throwaway_names": len(wordops.THROWAWAY_NAMES),
                    "throwaway_share": THROWAWAY_SHARE,
                    "words": len(wordops.WORDS),
                    "lengths": [wordops.MIN_WORDS, wordops.MAX_WORDS],
                },
                "never_saw": wordops.UNSEEN_NAMES,
                "loss_last": loss,
                "seconds": round(time.monotonic() - t0, 1),
            },
            indent=2,
        )
    )
    return out
