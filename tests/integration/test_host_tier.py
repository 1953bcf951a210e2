"""`local-tiered`: a prefix evicted from the worker's KV cache comes back from the host-DRAM tier
(vLLM's MooncakeStoreConnector over a Mooncake store on loopback) instead of being recomputed, and
the engine's metrics say so."""

import random
import re

import httpx
import pytest

from deploy.stack.config import load_config
from deploy.stack.launcher import down, up
from tests.integration.conftest import exposed_listeners

# Runs last (see conftest): one more vLLM worker next to the shared stack, as the P/D test does.
pytestmark = [pytest.mark.integration, pytest.mark.runs_last]

BLOCK = 32


def counter(metrics: str, name: str) -> float:
    return sum(float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", metrics, re.M))


def complete(cfg, prompt: list[int]) -> dict:
    r = httpx.post(
        f"{cfg.frontend_url}/v1/completions",
        timeout=120,
        json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return {
        "text": body["choices"][0]["text"],
        "cached": (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
    }


def test_an_evicted_prefix_is_loaded_from_host_memory(stack, tmp_path):
    cfg = load_config(
        "local-tiered",
        [
            f"home={tmp_path}",
            f"model_dir={stack.model_path}",
            "frontend.port=18500",
            "gateway.port=18510",
            "worker.system_port_base=18520",
            "host_tier.rpc_port=18551",
            "host_tier.metadata_port=18552",
            "host_tier.metrics_port=18553",
            "worker.enforce_eager=true",
            "worker.num_kv_blocks=24",
            "worker.max_model_len=512",
        ],
        environ={},
    )  # 24 blocks: 2 prompts fit
    rng = random.Random(0)
    prompts = {name: [rng.randrange(16, 4000) for _ in range(330)] for name in "ABCD"}
    up(cfg)
    try:
        metrics = lambda: httpx.get(f"{cfg.worker_admin_url(0)}/metrics", timeout=10).text  # noqa: E731
        cold = complete(cfg, prompts["A"])
        for name in "BCD":  # 3 x 11 blocks through a 24-block cache: A's blocks are reused
            complete(cfg, prompts[name])
        before = metrics()
        again = complete(cfg, prompts["A"])
        after = metrics()
        tier = httpx.get(f"http://127.0.0.1:{cfg.host_tier.metrics_port}/metrics", timeout=10).text
        listening, exposed = exposed_listeners(cfg)
    finally:
        down(cfg)
    # Mooncake's metadata server and transfer engine bound 0.0.0.0 / [::] whatever they were told
    assert {"mooncake-master", "mooncake-metadata", "worker-0"} <= listening and not exposed, exposed
    external = counter(after, "vllm:external_prefix_cache_hits_total") - counter(before, "vllm:external_prefix_cache_hits_total")
    local = counter(after, "vllm:prefix_cache_hits_total") - counter(before, "vllm:prefix_cache_hits_total")
    print(
        f"\ncold A cached {cold['cached']}, A after eviction cached {again['cached']}: "
        f"{external:.0f} tokens from the host tier, {local:.0f} from the worker's cache"
    )
    assert cold["cached"] == 0
    assert again["cached"] >= 330 // BLOCK * BLOCK - BLOCK  # all whole blocks but the last computed one
    assert external == again["cached"] and local == 0  # served by the tier, not by the device cache
    assert again["text"] == cold["text"]  # the reloaded KV is the same KV
    assert counter(tier, "master_batch_get_replica_list_items_total") > 0
