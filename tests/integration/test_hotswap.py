"""A LoRA hot-swap under steady load: no failed request, one switch-over point in the traces,
and the new outputs are the new weights' (logprobs checked against a Hugging Face forward)."""

import time

import httpx
import pytest
import torch

from feedback.hotswap import HotSwap
from feedback.registry import BASE, Registry
from feedback.train import TrainConfig, train_full, train_lora
from tests.integration.steady_load import SteadyLoad, wait_for_trace_rows
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

    body = {"model": "tiny", "messages": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": True}
    with SteadyLoad(f"{url}/v1/chat/completions", body, rps=20, headers={"X-Env-ID": "swap-load"}) as load:
        load.wait_for(20)  # traffic before the swap...
        swap.deploy("tiny", version)
        load.wait_for(len(load.results) + 20)  # ...and after it
    results = load.results
    assert not load.failed(), (len(results), load.failed()[:3])

    store = TraceStore(stack.traces_path)
    wait_for_trace_rows(store, "swap-load", len(results))
    versions = (
        store.sql("SELECT checkpoint_version FROM traces WHERE env_id = 'swap-load' ORDER BY time_received")
        .column("checkpoint_version")
        .to_pylist()
    )
    switch = versions.index(version)
    assert set(versions[:switch]) == {BASE} and set(versions[switch:]) == {version}  # one switch-over
    assert 0 < switch < len(versions)

    last = store.sql(
        "SELECT trace_id, completion_token_ids, completion_logprobs FROM traces "
        "WHERE env_id = 'swap-load' ORDER BY time_received DESC LIMIT 1"
    ).to_pylist()[0]
    prompt_ids = store.prompt_token_ids([last["trace_id"]])[last["trace_id"]]
    served = last["completion_logprobs"]
    new = hf_logprobs(stack.model_path, ckpt, prompt_ids, last["completion_token_ids"])
    old = hf_logprobs(stack.model_path, None, prompt_ids, last["completion_token_ids"])
    err_new = max(abs(a - b) for a, b in zip(served, new))
    err_old = max(abs(a - b) for a, b in zip(served, old))
    print(f"\nmax |served - HF(new)| = {err_new:.4f}, max |served - HF(base)| = {err_old:.4f}")
    # bf16 engine against the fp32 reference: under 0.1 until 2026-11, 0.19 with the packages a
    # fresh install resolves on 2026-12-01 (the code of 794f052 measures the same 0.1936); the
    # base is 3.1 away, so the adapter is what is served
    assert err_new < 0.3 and err_old > 10 * err_new

    # Rolling back moves the alias to the base model the same way.
    assert swap.rollback("tiny") == BASE
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        headers={"X-Env-ID": "swap-rollback"},
        json={"model": "tiny", "messages": PROMPT, "max_tokens": 6, "temperature": 0},
    )
    assert r.status_code == 200
    models = {m["id"]: m["checkpoint_version"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert models["tiny"] == BASE

    # A split: half the sessions on the adapter, half on the base; each trace's arm says which,
    # and its greedy tokens are that arm's weights'
    swap.split("tiny", {BASE: 0.5, version: 0.5})
    for i in range(12):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            headers={"X-Env-ID": "swap-split", "X-Session-ID": f"split-{i}"},
            json={"model": "tiny", "messages": PROMPT, "max_tokens": 6, "temperature": 0},
        )
        assert r.status_code == 200, r.text
    wait_for_trace_rows(store, "swap-split", 12)
    by_arm: dict[str, set] = {}
    for row in store.sql("SELECT arm, completion_token_ids FROM traces WHERE env_id = 'swap-split'").to_pylist():
        by_arm.setdefault(row["arm"], set()).add(tuple(row["completion_token_ids"]))
    assert set(by_arm) == {BASE, version} and all(len(t) == 1 for t in by_arm.values()), by_arm
    assert by_arm[BASE] != by_arm[version]
    swap.reset("tiny")


def test_a_killed_worker_comes_back_by_itself_with_the_weights_and_adapter_its_aliases_serve(stack, tmp_path):
    import os
    import signal

    from deploy.stack.processes import ProcessManager

    gw = stack.resolved_gateway()
    url = f"http://{gw.host}:{gw.port}"
    registry = Registry(stack.home_path / "checkpoints.json")
    swap = HotSwap(url, gw.admin_key, registry, gw.deployments[0].name, "tiny", stack.model_path)
    rows = [{"prompt_token_ids": list(range(10, 40)), "completion_token_ids": [500, 501, 502, 503]}] * 8
    ckpt = train_lora(stack.model_path, rows, tmp_path / "lora", TrainConfig(steps=3, lr=1e-2))
    version = f"survivor-{int(time.time())}"
    registry.register(version, "lora", ckpt, str(stack.model_path))
    swap.deploy("tiny-survivor", version)
    # and full weights reloaded in place under `tiny`, which a restarted worker must not forget
    full = train_full(stack.model_path, rows, tmp_path / "full", TrainConfig(steps=10, lr=1e-3))
    registry.register(f"{version}-full", "full", full, str(stack.model_path))
    swap.deploy("tiny", f"{version}-full")

    def greedy() -> list[int] | None:
        try:
            r = httpx.post(
                f"{url}/inference/v1/generate",
                timeout=30,
                json={"model": "tiny", "token_ids": list(range(10, 40)), "sampling_params": {"max_tokens": 4, "temperature": 0}},
            )
        except httpx.HTTPError:
            return None
        return r.json()["choices"][0]["token_ids"] if r.status_code == 200 else None

    swapped = greedy()
    assert swapped == [500, 501, 502, 503], swapped

    def serves(model: str) -> bool:
        try:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={"model": model, "messages": PROMPT, "max_tokens": 2})
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    assert serves("tiny-survivor")
    pm = ProcessManager(stack.run_dir)
    victim = pm.pid("worker-0")
    os.killpg(victim, signal.SIGKILL)
    t0 = time.monotonic()
    live = httpx.get(f"{url}/liveness", timeout=10)  # the supervisor has not restarted it yet
    assert live.status_code == 503 and live.json()["error"]["message"].startswith("1 of 1 workers"), live.text
    # no command: the supervisor restarts the worker, which loads the alias's adapter again
    while not (pm.pid("worker-0") not in (None, victim) and serves("tiny-survivor") and greedy() == swapped):
        assert time.monotonic() - t0 < 240, "the killed vLLM worker did not come back serving its weights"
        time.sleep(1)
    print(f"\nvLLM worker killed -> serving its full weights and LoRA alias again in {time.monotonic() - t0:.0f} s")
    swap.reset("tiny")
    assert greedy() != swapped
    # leave no alias on an adapter behind: a later blue-green deploy would (rightly) refuse
    assert httpx.delete(f"{url}/admin/models/tiny-survivor", headers=swap.headers).status_code == 200
    swap.unload_adapter("tiny-survivor", version)


def test_the_same_adapter_name_with_a_new_path_serves_the_new_adapter(stack, tmp_path):
    """prime-rl loads each step's adapter under one name (load_inplace): the name must serve the
    newest weights, not stay on the first ones (Dynamo's default answers "already loaded")."""
    gw = stack.resolved_gateway()
    url, headers = f"http://{gw.host}:{gw.port}", {"Authorization": f"Bearer {gw.admin_key}"}
    prompt = list(range(10, 40))
    adapters = [
        train_lora(
            stack.model_path,
            [{"prompt_token_ids": prompt, "completion_token_ids": t}] * 8,
            tmp_path / f"step-{i}",
            TrainConfig(steps=30, lr=1e-2),
        )
        for i, t in enumerate([[500, 501, 502, 503], [600, 601, 602, 603]])
    ]
    for new, old in [(adapters[0], None), (adapters[1], adapters[0]), (adapters[0], adapters[1])]:
        r = httpx.post(
            f"{url}/load_lora_adapter", headers=headers, timeout=200, json={"lora_name": "policy-inplace", "lora_path": str(new)}
        )
        assert r.status_code == 200, r.text
        r = httpx.post(
            f"{url}/inference/v1/generate",
            timeout=60,
            json={
                "model": "policy-inplace",
                "token_ids": prompt,
                "sampling_params": {"max_tokens": 4, "temperature": 0, "logprobs": 1},
            },
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        served = [c["logprob"] for c in choice["logprobs"]["content"]]
        err_new = max(abs(a - b) for a, b in zip(served, hf_logprobs(stack.model_path, new, prompt, choice["token_ids"])))
        assert err_new < 0.1, (new, choice["token_ids"], err_new)
        if old is not None:
            err_old = max(abs(a - b) for a, b in zip(served, hf_logprobs(stack.model_path, old, prompt, choice["token_ids"])))
            assert err_old > 5 * err_new, (choice["token_ids"], err_new, err_old)
