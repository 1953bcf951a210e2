"""What a deployment serves after a swap, checked against a Hugging Face forward of a checkpoint."""

import httpx
import torch

PROMPT_IDS = list(range(10, 40))


def served_greedy(url: str, headers: dict, model: str = "tiny") -> list[int]:
    r = httpx.post(
        f"{url}/inference/v1/generate",
        headers=headers,
        timeout=60,
        json={"model": model, "token_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 6, "temperature": 0}},
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def greedy_gaps(model_dir, completion: list[int], adapter=None) -> list[float]:
    """Per position: how far (nats) each served token is below that checkpoint's argmax (the
    weights in ``model_dir``, with the LoRA ``adapter`` merged into them when given)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([PROMPT_IDS + completion])).logits[0].float(), -1)
    n = len(PROMPT_IDS)
    return [(logp[n - 1 + i].max() - logp[n - 1 + i, t]).item() for i, t in enumerate(completion)]


def assert_serves(url, headers, new_dir, old_dir) -> None:
    served = served_greedy(url, headers)
    new, old = greedy_gaps(new_dir, served), greedy_gaps(old_dir, served)
    print(f"\nserved {served}: max gap to new argmax {max(new):.4f}, to old {max(old):.2f}")
    assert max(new) < 0.1, (served, new)  # the new weights' argmax at every position
    assert max(old) > 0.1, (served, old)  # and not what the old weights would say
