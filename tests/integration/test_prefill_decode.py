"""`local-pd` (prefill and decode on two vLLM-CPU workers, KV over NIXL) gives the same greedy
tokens as the aggregated `local` stack."""

import httpx
import pytest

from deploy.config import load_config
from deploy.launcher import down, up

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("base_alias")]

PROMPTS = ["hello there", "def fibonacci(n):\n    return 12345", "Reverse the word: planet",
           "a much longer prompt " * 40]


def greedy(frontend_url: str, prompt: str) -> tuple[list[int], dict]:
    r = httpx.post(f"{frontend_url}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
        "temperature": 0, "nvext": {"extra_fields": ["completion_token_ids", "worker_id"]}}).json()
    return r["nvext"]["completion_token_ids"], r["nvext"]["worker_id"]


def test_disaggregated_prefill_decode_matches_aggregated_greedy_tokens(stack, tmp_path):
    aggregated = [greedy(stack.frontend_url, p)[0] for p in PROMPTS]
    pd = load_config("local-pd", [f"home={tmp_path}", "frontend.port=18400", "gateway.port=18410",
                                  "worker.system_port_base=18420", "worker.nixl_port_base=15800",
                                  f"model_dir={stack.model_path}"], environ={})
    up(pd)
    try:
        results = [greedy(pd.frontend_url, p) for p in PROMPTS]
    finally:
        down(pd)
    assert [ids for ids, _ in results] == aggregated
    for _, workers in results:  # prefill and decode really ran on different workers
        assert workers["prefill_worker_id"] != workers["decode_worker_id"]
