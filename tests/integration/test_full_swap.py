"""Full-weight swaps in place, as prime-rl drives them (pause keep -> update_weights -> resume) and
as `flywheel checkpoint deploy/rollback` does, under steady load: nothing fails, a request sent
while paused finishes after the resume, and what is served afterwards is the new checkpoint's
greedy output by a Hugging Face forward of it (and not the old one's)."""

import json
import shutil
import threading

import httpx
import pytest

from feedback.hotswap import HotSwap
from feedback.registry import BASE, Registry
from feedback.train import TrainConfig, train_full
from tests.integration.conftest import flywheel_cli
from tests.integration.steady_load import SteadyLoad, wait_for_trace_rows
from tests.integration.weights_check import PROMPT_IDS, assert_serves, served_greedy
from traces.store import TraceStore

pytestmark = pytest.mark.integration

LOAD = {"model": "tiny", "messages": [{"role": "user", "content": "Reverse the word: full"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def checkpoints(stack, tmp_path_factory):
    """Two full fine-tunes that answer PROMPT_IDS with different fixed sequences."""
    out = tmp_path_factory.mktemp("full")

    def trained(name: str, target: list[int]):
        rows = [{"prompt_token_ids": PROMPT_IDS, "completion_token_ids": target}] * 8
        return train_full(stack.model_path, rows, out / name, TrainConfig(steps=10, lr=1e-3))

    return trained("step_1", [500, 501, 502, 503]), trained("step_2", [600, 601, 602, 603])


@pytest.fixture
def admin(stack):
    gw = stack.resolved_gateway()
    url = f"http://{gw.host}:{gw.port}"
    headers = {"Authorization": f"Bearer {gw.admin_key}"}
    swap = HotSwap(
        url, gw.admin_key, Registry(stack.home_path / "checkpoints.json"), gw.deployments[0].name, "tiny", stack.model_path
    )
    swap.reset("tiny")
    yield url, headers, swap
    swap.reset("tiny")  # the session's other tests expect the base weights


def greedy_sent_now(url, headers) -> tuple[threading.Thread, dict]:
    """The base model's greedy request, sent now on a thread of its own: the thread, and a dict
    that holds its tokens under "ids" once it is answered."""
    paused: dict = {}
    sent = threading.Thread(target=lambda: paused.setdefault("ids", served_greedy(url, headers)))
    sent.start()
    return sent, paused


def post(url, path, headers, **kw):
    r = httpx.post(f"{url}{path}", headers=headers, timeout=720, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def test_prime_rl_pause_update_resume_twice_under_load(stack, admin, checkpoints):
    url, headers, _ = admin
    step_1, step_2 = checkpoints
    with SteadyLoad(f"{url}/v1/chat/completions", LOAD, rps=20, headers={"X-Env-ID": "full-load"}) as load:
        load.wait_for(20)
        for old, new in [(stack.model_path, step_1), (step_1, step_2)]:
            post(url, "/pause?mode=keep&clear_cache=false", headers)
            sent, paused = greedy_sent_now(url, headers)
            got = post(url, "/update_weights", headers, json={"weight_dir": str(new)})
            assert got["weight_version"] == new.name and all(w["ok"] for w in got["workers"])
            sent.join(timeout=2)
            assert "ids" not in paused  # frozen while paused (keep), not failed...
            post(url, "/resume", headers)
            post(url, "/resume", headers)  # idempotent
            sent.join(timeout=120)
            assert paused["ids"]  # ...and finished after the resume
            assert_serves(url, headers, new, old)
            load.wait_for(len(load.results) + 20)
    assert not load.failed(), (len(load.results), load.failed()[:3])
    print(f"\n{len(load.results)} requests under load through two swaps, 0 failed")

    store = TraceStore(stack.traces_path)
    wait_for_trace_rows(store, "full-load", len(load.results))
    versions = (
        store.sql("SELECT checkpoint_version AS v FROM traces WHERE env_id = 'full-load' ORDER BY time_received")
        .column("v")
        .to_pylist()
    )
    changes = [v for i, v in enumerate(versions) if i == 0 or v != versions[i - 1]]
    assert changes == [BASE, "step_1", "step_2"], changes  # each weight version once, in order
    card = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}["tiny"]
    assert card["checkpoint_version"] == "step_2" and card["root"] == str(step_2)


def test_checkpoint_deploy_twice_then_rollback_serves_the_first_again(stack, admin, checkpoints):
    url, headers, swap = admin
    step_1, step_2 = checkpoints
    registry = swap.registry
    for name, path in [("full-a", step_1), ("full-b", step_2)]:
        if name not in {c.version for c in registry.list()}:
            registry.register(name, "full", path, str(stack.model_path))
    with SteadyLoad(f"{url}/v1/chat/completions", LOAD, rps=20) as load:
        load.wait_for(10)
        swap.deploy("tiny", "full-a")
        swap.deploy("tiny", "full-b")
        assert_serves(url, headers, step_2, step_1)
        done = flywheel_cli(stack, "checkpoint", "rollback")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "full-a" in done.stdout
        assert_serves(url, headers, step_1, step_2)
        done = flywheel_cli(stack, "checkpoint", "rollback")
        assert done.returncode == 0 and "base" in done.stdout, done.stdout + done.stderr
        assert_serves(url, headers, stack.model_path, step_1)
        load.wait_for(len(load.results) + 10)
    assert not load.failed(), (len(load.results), load.failed()[:3])


def test_weights_unlike_the_old_ones_in_every_tensor_are_served_exactly(stack, admin, tmp_path):
    # The fine-tunes above move the weights a little; a model made from another seed moves every
    # tensor, the tied embedding / LM head included (a reload once left the old head in place).
    from deploy.models.tiny_model import make_tiny_model

    url, headers, swap = admin
    other = make_tiny_model(tmp_path / "other-seed", seed=7)
    if "other-seed" not in {c.version for c in swap.registry.list()}:
        swap.registry.register("other-seed", "full", other, str(stack.model_path))
    swap.deploy("tiny", "other-seed")
    assert_serves(url, headers, other, stack.model_path)
    swap.reset("tiny")
    assert_serves(url, headers, stack.model_path, other)


def test_a_reset_after_an_adapter_over_swapped_weights_serves_the_base_weights_again(stack, admin, checkpoints, tmp_path):
    # `flywheel loop` serves its LoRAs over weights it reloaded: the alias then names the adapter,
    # and the swapped weights under it must not be forgotten by a reset (or a restarted worker)
    from feedback.train import train_lora

    url, headers, swap = admin
    step_1, _ = checkpoints
    rows = [{"prompt_token_ids": PROMPT_IDS, "completion_token_ids": [700, 701]}] * 4
    adapter = train_lora(stack.model_path, rows, tmp_path / "adapter", TrainConfig(steps=2))
    for name, kind, path in [("under", "full", step_1), ("over", "lora", adapter)]:
        if name not in {c.version for c in swap.registry.list()}:
            swap.registry.register(name, kind, path, str(stack.model_path))
    swap.deploy("tiny", "under")
    swap.deploy("tiny", "over")
    route = httpx.get(f"{url}/admin/models", headers=headers).json()["tiny"]
    assert route["lora_path"] == str(adapter.resolve()) and route["weight_dir"] == str(step_1.resolve())
    swap.reset("tiny")
    assert_serves(url, headers, stack.model_path, step_1)


def test_reloads_and_pauses_while_an_adapter_serves_traffic_take_effect_and_fail_no_request(stack, admin, checkpoints, tmp_path):
    """Dynamo refuses to pause (keep) while an adapter's request runs, and says so in a 200 the
    gateway once read as success: a reload under a canary's adapter traffic was recorded but never
    made (CI of stop 55: `tiny` stayed on the loop's weights for every later test). And the base
    requests batched beside the adapter's are the base's: on CPU they once got the adapter in the
    engine's last LoRA slot (deploy/engine/vllm_plugin.py), where the busy one lands here."""
    from feedback.train import train_lora

    url, headers, swap = admin
    step_1, step_2 = checkpoints
    for name, target in (("first-adapter", [800, 801]), ("busy-adapter", [700, 701])):
        rows = [{"prompt_token_ids": PROMPT_IDS, "completion_token_ids": target}] * 4
        adapter = train_lora(stack.model_path, rows, tmp_path / name, TrainConfig(steps=2))
        post(url, "/load_lora_adapter", headers, json={"lora_name": name, "lora_path": str(adapter)})
        served_greedy(url, headers, name)  # in a slot: the busy one in the second (the engine has 2)
    busy = {"model": "busy-adapter", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    try:
        with SteadyLoad(f"{url}/v1/chat/completions", busy, rps=40) as load:  # several in flight at any time
            load.wait_for(20)
            for new, old in ((step_1, stack.model_path), (step_2, step_1), (stack.model_path, step_2)):
                before = len(load.results)
                post(url, "/update_weights", headers, json={"weight_dir": str(new)})
                assert_serves(url, headers, new, old)
                assert len(load.results) > before  # the adapter was busy meanwhile
            post(url, "/pause?mode=keep", headers)
            sent, paused = greedy_sent_now(url, headers)
            sent.join(timeout=3)
            assert "ids" not in paused  # paused indeed: the base request waits...
            post(url, "/resume", headers)
            sent.join(timeout=60)
            assert paused["ids"]  # ...and is answered after the resume
    finally:
        for name in ("first-adapter", "busy-adapter"):
            httpx.post(f"{url}/unload_lora_adapter", headers=headers, json={"lora_name": name}, timeout=60)
    print(f"\nadapter traffic through 3 reloads and a pause: {len(load.results)} requests, {len(load.failed())} failed")
    assert load.results and not load.failed(), load.failed()[:3]


def test_no_request_after_a_weight_change_reuses_kv_from_before_it(stack, admin, checkpoints):
    url, headers, _ = admin
    long_prompt = {
        "model": "tiny",
        "max_tokens": 2,
        "temperature": 0,
        "messages": [{"role": "user", "content": "a prefix worth caching " * 12}],
    }

    def cached(**extra) -> int:
        r = httpx.post(f"{url}/v1/chat/completions", json={**long_prompt, **extra}, timeout=60)
        assert r.status_code == 200, r.text
        return (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    cached()
    assert cached() > 0  # the prefix cache works...
    post(url, "/update_weights", headers, json={"weight_dir": str(checkpoints[0])})
    assert cached() == 0  # ...and nothing computed before the swap is reused
    # prime-rl's way: a salt per policy version; requests share KV only within one salt
    cached(cache_salt="policy-1")
    assert cached(cache_salt="policy-1") > 0
    assert cached(cache_salt="policy-2") == 0


def test_the_engine_contract_rl_trainers_call(stack, admin, tmp_path):
    url, headers, _ = admin
    card = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}["tiny"]
    assert card["max_model_len"] == stack.worker.max_model_len and card["parent"] is None
    live = httpx.get(f"{url}/liveness")
    assert live.status_code == 200 and all(w["ok"] for w in live.json()["workers"])
    r = httpx.post(f"{url}/init_broadcaster", headers=headers, json={})
    assert r.status_code == 404 and "update_weights" in r.json()["error"]["message"]
    # a directory that is no checkpoint, or one of another shape, is refused before any worker pauses
    r = httpx.post(f"{url}/update_weights", headers=headers, json={"weight_dir": str(tmp_path)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "weight_dir"
    other = tmp_path / "other"
    shutil.copytree(stack.model_path, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    r = httpx.post(f"{url}/update_weights", headers=headers, json={"weight_dir": str(other)})
    assert r.status_code == 400 and "blue-green" in r.json()["error"]["message"], r.text
    assert httpx.post(f"{url}/update_weights", json={"weight_dir": str(other)}).status_code == 401
    r = httpx.post(f"{url}/pause?mode=forever", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "mode"
