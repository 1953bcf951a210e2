"""KV-aware routing keeps an agent session's turns on the worker that holds its prefix; round-
robin scatters them. Two Dynamo mocker workers behind the real frontend (the router and the
KV events are real; only the model is simulated)."""

import random

import httpx
import pytest

from deploy.stack.config import load_config
from deploy.stack.launcher import down, up

pytestmark = pytest.mark.integration


def run_sessions(router_mode: str, tmp_path) -> dict:
    cfg = load_config(
        "sim",
        [
            f"home={tmp_path / router_mode}",
            "frontend.port=19700",
            "worker.system_port_base=19710",
            "gateway.port=19720",
            "worker.count=2",
            f"frontend.router_mode={router_mode}",
            "worker.speedup_ratio=50",
        ],
        environ={},
    )
    up(cfg)
    rng = random.Random(0)
    stay, cached, prompt_tokens, ideal = 0, 0, 0, 0
    try:
        for s in range(6):
            history = " ".join(f"w{rng.randrange(1000)}" for _ in range(150))
            last, last_prompt = None, 0
            for turn in range(5):
                history += " " + " ".join(f"t{rng.randrange(1000)}" for _ in range(40))
                r = httpx.post(
                    f"{cfg.frontend_url}/v1/chat/completions",
                    timeout=60,
                    json={
                        "model": "tiny",
                        "messages": [{"role": "user", "content": history}],
                        "max_tokens": 4,
                        "nvext": {"extra_fields": ["worker_id"]},
                    },
                ).json()
                assert "nvext" in r, r
                worker = r["nvext"]["worker_id"]["decode_worker_id"]
                if turn:
                    stay += worker == last
                    cached += r["usage"]["prompt_tokens_details"]["cached_tokens"]
                    prompt_tokens += r["usage"]["prompt_tokens"]
                    ideal += last_prompt // 32 * 32  # the previous prompt, in whole 32-token blocks
                last, last_prompt = worker, r["usage"]["prompt_tokens"]
    finally:
        down(cfg)
    return {"same_worker": stay / (6 * 4), "prefix_reuse": cached / prompt_tokens, "reuse_of_ideal": cached / ideal}


def test_kv_routing_keeps_sessions_on_their_worker_and_reuses_the_prefix(tmp_path):
    kv = run_sessions("kv", tmp_path)
    rr = run_sessions("round-robin", tmp_path)
    print(f"\nkv: {kv}\nround-robin: {rr}")
    assert kv["same_worker"] == 1.0 and kv["reuse_of_ideal"] >= 0.9
    # round-robin alternates: every turn lands on the other worker, which saw the session only
    # two turns ago, so it recomputes the last turn's growth
    assert rr["same_worker"] < 0.5 and rr["reuse_of_ideal"] < kv["reuse_of_ideal"] - 0.1
