"""A full reload is all workers or none: when one worker fails, every worker gets the previous
weights back, the answer names each worker's result, and no alias records the new version.
(The workers here answer through httpx's mock transport: making a real engine fail one reload on
cue is not possible; the integration suite swaps real weights.)"""

import asyncio
import json

import httpx
import pytest

from serve.config import Deployment, GatewayConfig, ModelRoute
from serve.errors import APIError
from serve.reload_gate import ReloadGate
from serve.weights import PAUSE, RESUME, UPDATE, FullWeights


def checkpoint(path, layers=4):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": layers}))
    (path / "model.safetensors").write_bytes(b"")
    return str(path)


@pytest.fixture
def deployment(tmp_path):
    base, new = checkpoint(tmp_path / "base"), checkpoint(tmp_path / "new")
    dep = Deployment(name="d", url="http://frontend", model_path=base, admin_urls=["http://w0", "http://w1"])
    config = GatewayConfig(deployments=[dep])
    routes = {
        "tiny": ModelRoute(deployment="d", upstream_model="tiny"),
        "tiny-lora": ModelRoute(deployment="d", upstream_model="a", lora_path=str(tmp_path)),
    }
    return dep, routes, FullWeights(config, routes, ReloadGate()), base, new


def reload_answered_by(weights, dep, new, answer):
    """``weights.reload`` to ``new`` (as version step_9), each worker call answered by ``answer``."""

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            return await weights.reload(http, dep, new, "step_9")

    return asyncio.run(go())


def run(weights, dep, new, broken: set[str], calls: list):
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        calls.append((request.url.host, request.url.path, body.get("model_path")))
        if request.url.path == UPDATE and request.url.host in broken and body["model_path"] == new:
            return httpx.Response(200, json={"status": "error", "message": "size mismatch in layer 3"})
        return httpx.Response(200, json={"status": "ok"})

    return reload_answered_by(weights, dep, new, answer)


def test_one_failing_worker_rolls_every_worker_back_and_moves_no_alias(deployment):
    dep, routes, weights, base, new = deployment
    calls = []
    with pytest.raises(APIError) as failed:
        run(weights, dep, new, broken={"w1"}, calls=calls)
    assert failed.value.status == 502 and "1 of 2 workers" in failed.value.message
    assert "http://w1" in failed.value.message and "size mismatch" in failed.value.message
    assert "serves 'base' again" in failed.value.message
    assert routes["tiny"].checkpoint_version == "base" and routes["tiny"].weight_dir is None
    # both workers, the one that took the new weights included, reload the previous ones
    assert sorted(h for h, p, m in calls if p == UPDATE and m == base) == ["w0", "w1"]
    assert [p for _, p, _ in calls][-2:] == [RESUME, RESUME]  # and the deployment runs again


def test_a_reload_that_works_everywhere_records_its_version_on_base_aliases_only(deployment):
    dep, routes, weights, base, new = deployment
    calls = []
    results = run(weights, dep, new, broken=set(), calls=calls)
    assert [r.ok for r in results] == [True, True]
    assert routes["tiny"].checkpoint_version == "step_9" and routes["tiny"].weight_dir == new
    assert routes["tiny-lora"].checkpoint_version == "base"  # an adapter's version is its own
    assert routes["tiny-lora"].weight_dir == new  # but it runs over the new weights
    paths = [p for _, p, _ in calls]
    assert paths.count(PAUSE) == 2 and paths.count(UPDATE) == 2 and paths.count(RESUME) == 2
    assert paths.index(RESUME) > max(i for i, p in enumerate(paths) if p == UPDATE)


def test_an_adapter_over_swapped_weights_is_what_the_deployment_serves_when_no_alias_is_on_the_base(deployment):
    # a loop moves its only alias from reloaded weights to an adapter over them: a rollback of a
    # failed reload (and a restarted worker) must still come back to those weights, not the base
    dep, routes, weights, base, new = deployment
    del routes["tiny"]
    routes["tiny-lora"] = routes["tiny-lora"].model_copy(update={"weight_dir": new})
    assert weights.serving(dep) == (new, "new")


def test_weights_of_another_shape_are_refused_before_any_worker_pauses(deployment, tmp_path):
    dep, routes, weights, base, new = deployment
    calls = []
    with pytest.raises(APIError) as refused:
        run(weights, dep, checkpoint(tmp_path / "deeper", layers=8), broken=set(), calls=calls)
    assert refused.value.status == 400 and "num_hidden_layers" in refused.value.message
    assert calls == []


def test_this_gateway_sends_a_reloading_deployment_nothing_until_it_has_resumed(deployment):
    """Dynamo refuses an adapter's request that reaches a paused engine (a 500): requests are held
    at the gateway's gate from the pause until the resume, and then go."""
    dep, routes, weights, base, new = deployment
    order = []

    async def go():
        reloading = asyncio.Event()

        async def answer(request: httpx.Request) -> httpx.Response:
            order.append(request.url.path)
            if request.url.path == UPDATE:
                reloading.set()
                await asyncio.sleep(0.2)  # the reload takes a while; the request arrives meanwhile
            return httpx.Response(200, json={"status": "ok"})

        async def request_arriving_mid_reload():
            await reloading.wait()
            await weights.gate.passage("d")
            order.append("request sent")
            await weights.gate.passage("other")  # another deployment's gate is open

        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            await asyncio.gather(weights.reload(http, dep, new, "step_9"), request_arriving_mid_reload())

    asyncio.run(go())
    assert order.index("request sent") > max(i for i, p in enumerate(order) if p == RESUME), order


def dynamo_says(body: dict) -> httpx.Response:
    """An engine route's answer as Dynamo's system server sends it: JSON labelled text/plain."""
    return httpx.Response(200, text=json.dumps(body), headers={"content-type": "text/plain; charset=utf-8"})


ADAPTER_BUSY = {"status": "error", "message": "Cannot pause generation in keep mode with active LoRA requests: tiny@a"}


def logged_in(calls: list, answer):
    """``answer``, noting each call's (worker, path) in ``calls``."""

    def logged(request: httpx.Request) -> httpx.Response:
        calls.append((request.url.host, request.url.path))
        return answer(request)

    return logged


def test_a_pause_refused_while_adapter_requests_run_is_asked_again_until_they_have_ended(deployment):
    dep, routes, weights, base, new = deployment
    calls, refusals = [], {"w0": 3, "w1": 1}

    def answer(request):
        if request.url.path == PAUSE and refusals[request.url.host] > 0:
            refusals[request.url.host] -= 1
            return dynamo_says(ADAPTER_BUSY)
        return dynamo_says({"status": "ok"})

    reload_answered_by(weights, dep, new, logged_in(calls, answer))
    assert [p for h, p in calls if h == "w0"].count(PAUSE) == 4
    first_update = calls.index(next(c for c in calls if c[1] == UPDATE))
    assert [p for _, p in calls[first_update:]].count(PAUSE) == 0  # every worker paused before any reload
    assert routes["tiny"].checkpoint_version == "step_9" and routes["tiny"].weight_dir == new


def test_adapter_requests_outlasting_pause_wait_s_are_a_503_that_changes_nothing(deployment):
    dep, routes, weights, base, new = deployment
    weights.config = weights.config.model_copy(update={"pause_wait_s": 0.2})
    calls = []

    def answer(request):
        return dynamo_says(ADAPTER_BUSY if request.url.path == PAUSE else {"status": "ok"})

    with pytest.raises(APIError) as refused:
        reload_answered_by(weights, dep, new, logged_in(calls, answer))
    assert refused.value.status == 503 and "adapter requests" in refused.value.message
    assert "nothing was changed" in refused.value.message and "pause_wait_s" in refused.value.message
    assert UPDATE not in [p for _, p in calls] and sorted(h for h, p in calls if p == RESUME) == ["w0", "w1"]
    assert routes["tiny"].checkpoint_version == "base" and routes["tiny"].weight_dir is None


def test_any_other_refusal_labelled_text_plain_is_a_failure_at_once_not_a_success(deployment):
    """Before: a refusal labelled text/plain (Dynamo's label) read as success, and the alias
    recorded weights the engine had never loaded."""
    dep, routes, weights, base, new = deployment
    for refused_path, says in ((PAUSE, "Invalid mode"), (UPDATE, "Worker must be paused")):
        calls = []

        def answer(request):
            if request.url.path == refused_path:
                return dynamo_says({"status": "error", "message": says})
            return dynamo_says({"status": "ok"})

        with pytest.raises(APIError) as failed:
            reload_answered_by(weights, dep, new, logged_in(calls, answer))
        assert failed.value.status == 502 and says in failed.value.message
        assert [p for h, p in calls if h == "w0"].count(PAUSE) == 1  # not asked again
        assert routes["tiny"].checkpoint_version == "base" and routes["tiny"].weight_dir is None


def test_a_reload_inside_a_clients_pause_leaves_its_requests_held_until_the_resume(deployment):
    """prime-rl pauses, reloads, resumes: the reload's end must not let requests through to the
    engine the client still holds paused (an adapter's request there is refused, a 500)."""
    dep, routes, weights, base, new = deployment
    order = []

    async def go():
        async def answer(request: httpx.Request) -> httpx.Response:
            order.append(request.url.path)
            return dynamo_says({"status": "ok"})

        async def request_arriving():
            await asyncio.sleep(0)
            await weights.gate.passage("d")
            order.append("request sent")

        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            weights.gate.hold("d")  # the client's /pause
            arriving = asyncio.create_task(request_arriving())
            await weights.reload(http, dep, new, "step_9")
            await asyncio.sleep(0.05)
            order.append("client resumes")
            weights.gate.release("d")  # its /resume
            await arriving

    asyncio.run(go())
    assert order.index("request sent") > order.index("client resumes"), order


def test_a_request_the_paused_engine_refused_unstarted_is_sent_again_once_the_reload_ends(monkeypatch):
    """A request that passed the gate just before a reload began reaches the paused engine, which
    refuses an adapter's request (a 500 before any token): sent again when the gate opens, it is
    answered; a failure with no reload begun meanwhile fails over as before."""
    from serve import forward
    from serve.attempt import AttemptFailed
    from serve.outcome import Outcome

    refused = AttemptFailed(APIError(500, "Internal server error", type="server_error"), Outcome.UPSTREAM_ERROR)
    fwd = forward.Forwarder.__new__(forward.Forwarder)
    fwd.reload_gate, fwd.config, fwd.pool = ReloadGate(), GatewayConfig(), None
    sent = []

    async def send(pool, attempt, timeout_s):
        sent.append(fwd.reload_gate.begun("d"))
        if len(sent) == 1:
            if attempt == "during a reload":
                fwd.reload_gate.hold("d")  # the reload begins while this request is on its way
                asyncio.get_running_loop().call_later(0.05, fwd.reload_gate.release, "d")
            raise refused
        return "answered"

    monkeypatch.setattr(forward, "send", send)
    assert asyncio.run(fwd._send_past_reloads("during a reload", "d")) == "answered"
    assert sent == [0, 1]  # the second time after the hold began, and ended
    sent.clear()
    with pytest.raises(AttemptFailed):
        asyncio.run(fwd._send_past_reloads("no reload", "d"))
    assert sent == [1]  # once: the next deployment's turn
