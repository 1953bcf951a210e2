"""A LoRA hot-swap under steady load: no failed request, one switch-over point in the traces,
and the new outputs are the new weights' (logprobs checked against a Hugging Face forward)."""

import threading
import time

import httpx
import pytest
import torch

from feedback.hotswap import HotSwap
from feedback.registry import BASE, Registry
from feedback.train import TrainConfig, train_lora
from traces.store import TraceStore

pytestmark = pytest.mark.integration

PROMPT = [{"role": "user", "content": "Reverse the word: swap"}]


def hf_logprobs(model_dir, adapter, prompt_ids, completion_ids):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    n = len(prompt_ids)
    return [logp[n - 1 + i, t].item() for i, t in enumerate(completion_ids)]


def test_lora_swap_under_20_rps_fails_nothing_and_serves_the_new_weights(stack, tmp_path):
    gw = stack.resolved_gateway()
    url = f"http://{gw.host}:{gw.port}"
    registry = Registry(stack.home_path / "checkpoints.json")
    swap = HotSwap(url, gw.admin_key, registry, gw.deployments[0].name, "tiny")
    swap.reset("tiny")
    # An adapter that changes the model a lot: learn to answer with one fixed sequence.
    rows = [{"prompt_token_ids": list(range(10, 40)), "completion_token_ids": [500, 501, 502, 503]}] * 8
    ckpt = train_lora(stack.model_path, rows, tmp_path / "lora", TrainConfig(steps=30, lr=1e-2))
    version = f"hotswap-test-{int(time.time())}"
    registry.register(version, "lora", ckpt, str(stack.model_path))

    results, stop = [], threading.Event()

    def load():  # 20 requests per second, each on its own thread so slow ones do not throttle
        workers = []
        while not stop.is_set():
            def one():
                try:
                    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, headers={"X-Env-ID": "swap-load"},
                                   json={"model": "tiny", "messages": PROMPT, "max_tokens": 6,
                                         "temperature": 0, "logprobs": True})
                    results.append(r)
                except httpx.HTTPError as exc:
                    results.append(exc)
            t = threading.Thread(target=one)
            t.start()
            workers.append(t)
            time.sleep(0.05)
        for t in workers:
            t.join()

    def wait_for_answers(n: int) -> None:  # counts, not rates: a slow machine just takes longer
        deadline = time.monotonic() + 120
        while len(results) < n:
            assert time.monotonic() < deadline, f"only {len(results)} of {n} requests answered"
            time.sleep(0.05)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        wait_for_answers(20)              # traffic before the swap...
        swap.deploy("tiny", version)
        wait_for_answers(len(results) + 20)  # ...and after it
    finally:
        stop.set()
        loader.join()

    failed = [r for r in results if not isinstance(r, httpx.Response) or r.status_code != 200]
    assert not failed, (len(results), failed[:3])

    store = TraceStore(stack.traces_path)
    deadline = time.monotonic() + 15
    while store.sql("SELECT count(*) AS n FROM traces WHERE env_id = 'swap-load'").column("n")[0].as_py() < len(results):
        assert time.monotonic() < deadline
        time.sleep(0.3)
        store.refresh()
    versions = store.sql("SELECT checkpoint_version FROM traces WHERE env_id = 'swap-load' "
                         "ORDER BY time_received").column("checkpoint_version").to_pylist()
    switch = versions.index(version)
    assert set(versions[:switch]) == {BASE} and set(versions[switch:]) == {version}  # one switch-over
    assert 0 < switch < len(versions)

    last = store.sql("SELECT trace_id, completion_token_ids, completion_logprobs FROM traces "
                     "WHERE env_id = 'swap-load' ORDER BY time_received DESC LIMIT 1").to_pylist()[0]
    prompt_ids = store.prompt_token_ids([last["trace_id"]])[last["trace_id"]]
    served = last["completion_logprobs"]
    new = hf_logprobs(stack.model_path, ckpt, prompt_ids, last["completion_token_ids"])
    old = hf_logprobs(stack.model_path, None, prompt_ids, last["completion_token_ids"])
    err_new = max(abs(a - b) for a, b in zip(served, new))
    err_old = max(abs(a - b) for a, b in zip(served, old))
    print(f"\nmax |served - HF(new)| = {err_new:.4f}, max |served - HF(base)| = {err_old:.4f}")
    assert err_new < 0.1 and err_old > 5 * err_new

    # Rolling back moves the alias to the base model the same way.
    assert swap.rollback("tiny") == BASE
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, headers={"X-Env-ID": "swap-rollback"},
                   json={"model": "tiny", "messages": PROMPT, "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200
    models = {m["id"]: m["checkpoint_version"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert models["tiny"] == BASE


def test_a_killed_worker_comes_back_by_itself_with_the_adapter_its_alias_serves(stack, tmp_path):
    import os
    import signal

    from deploy.processes import ProcessManager

    gw = stack.resolved_gateway()
    url = f"http://{gw.host}:{gw.port}"
    registry = Registry(stack.home_path / "checkpoints.json")
    swap = HotSwap(url, gw.admin_key, registry, gw.deployments[0].name, "tiny")
    rows = [{"prompt_token_ids": list(range(10, 40)), "completion_token_ids": [500, 501, 502, 503]}] * 4
    ckpt = train_lora(stack.model_path, rows, tmp_path / "lora", TrainConfig(steps=3, lr=1e-2))
    version = f"survivor-{int(time.time())}"
    registry.register(version, "lora", ckpt, str(stack.model_path))
    swap.deploy("tiny-survivor", version)

    def serves(model: str) -> bool:
        try:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                           json={"model": model, "messages": PROMPT, "max_tokens": 2})
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    assert serves("tiny-survivor")
    pm = ProcessManager(stack.run_dir)
    victim = pm.pid("worker-0")
    os.killpg(victim, signal.SIGKILL)
    t0 = time.monotonic()
    # no command: the supervisor restarts the worker, which loads the alias's adapter again
    while not (pm.pid("worker-0") not in (None, victim) and serves("tiny-survivor")):
        assert time.monotonic() - t0 < 240, "the killed vLLM worker did not come back serving its adapter"
        time.sleep(1)
    print(f"\nvLLM worker killed -> serving its LoRA alias again in {time.monotonic() - t0:.0f} s")
    assert serves("tiny")
