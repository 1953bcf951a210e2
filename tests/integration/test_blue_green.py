"""Blue-green deploy of a checkpoint of another shape (2 layers instead of 4), under load, by the
command a researcher types: a new deployment (a shared one, made and run like a team's dedicated
deployment) starts beside the profile's graph, the alias moves, the old graph drains and stops and
`up` leaves it stopped; then a rollback the same way back to the base model on the profile's graph,
and the shared deployment is deleted."""

import json

import httpx
import pytest
import torch

from deploy.stack.launcher import up
from deploy.stack.processes import ProcessManager
from deploy.stack.serverless import retired
from feedback.hotswap import HotSwap
from feedback.registry import BASE, Registry
from feedback.train import TrainConfig, copy_beside_weights, train_full
from tests.integration.conftest import flywheel_cli
from tests.integration.steady_load import SteadyLoad, wait_for_trace_rows
from tests.integration.weights_check import PROMPT_IDS, assert_serves
from traces.store import TraceStore

pytestmark = pytest.mark.integration

LOAD = {"model": "tiny", "messages": [{"role": "user", "content": "Reverse the word: green"}], "max_tokens": 4, "temperature": 0}


def two_layer_checkpoint(stack, out):
    """A model of another size on the same tokenizer, trained to answer PROMPT_IDS its own way."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(stack.model_path, num_hidden_layers=2, layer_types=["full_attention"] * 2)
    torch.manual_seed(3)
    fresh = out / "fresh"
    AutoModelForCausalLM.from_config(config).save_pretrained(fresh)
    copy_beside_weights(stack.model_path, fresh)
    rows = [{"prompt_token_ids": PROMPT_IDS, "completion_token_ids": [700, 701, 702, 703]}] * 8
    return train_full(fresh, rows, out / "two-layer", TrainConfig(steps=10, lr=1e-3))


def test_blue_green_deploy_of_another_shape_then_rollback_under_load(stack, tmp_path):
    gw = stack.resolved_gateway()
    url, headers = f"http://{gw.host}:{gw.port}", {"Authorization": f"Bearer {gw.admin_key}"}
    registry = Registry(stack.home_path / "checkpoints.json")
    HotSwap(url, gw.admin_key, registry, "local", "tiny", stack.model_path).reset("tiny")
    ckpt = two_layer_checkpoint(stack, tmp_path)
    assert json.loads((ckpt / "config.json").read_text())["num_hidden_layers"] == 2
    registry.register("two-layer", "full", ckpt, str(stack.model_path))
    pm = ProcessManager(stack.run_dir)
    blue = {n: pm.pid(n) for n in ("frontend", "worker-0")}

    with SteadyLoad(f"{url}/v1/chat/completions", LOAD, rps=10, headers={"X-Env-ID": "bg-load"}) as load:
        load.wait_for(10)
        done = flywheel_cli(stack, "checkpoint", "deploy", "two-layer", "--strategy", "blue-green")
        assert done.returncode == 0, done.stdout + done.stderr
        load.wait_for(len(load.results) + 10)
    assert not load.failed(), (len(load.results), load.failed()[:3])
    print(f"\n{len(load.results)} requests through a blue-green deploy, 0 failed")
    assert_serves(url, headers, ckpt, stack.model_path)

    # the profile's graph is stopped and stays so; the new one is a shared deployment the
    # supervisor runs, on the checkpoint, holding the slots the profile's graph gave back
    assert all(pm.pid(n) is None for n in blue), blue
    assert retired(stack.run_dir) == "two-layer"
    shared = [d for d in httpx.get(f"{url}/v1/deployments", headers=headers).json()["data"] if d["team"] is None]
    assert [(d["checkpoint_version"], d["status"], d["served_model"]) for d in shared] == [("two-layer", "RUNNING", "tiny")]
    dep = shared[0]["id"]
    assert pm.pid(f"frontend-{dep}") and pm.pid(f"worker-0-{dep}")
    up(stack)  # what runs is left alone, and the retired graph is not started again
    assert all(pm.pid(n) is None for n in blue), blue
    status = flywheel_cli(stack, "status", "--json")
    assert status.returncode == 0 and f"worker-0-{dep}" in status.stdout, status.stdout + status.stderr

    store = TraceStore(stack.traces_path)
    wait_for_trace_rows(store, "bg-load", len(load.results))
    rows = store.sql(
        "SELECT checkpoint_version AS v, deployment AS d FROM traces WHERE env_id = 'bg-load' ORDER BY time_received"
    ).to_pylist()
    changes = [(r["v"], r["d"]) for i, r in enumerate(rows) if i == 0 or r != rows[i - 1]]
    assert changes == [(BASE, "local"), ("two-layer", dep)], changes  # one switch-over

    done = flywheel_cli(stack, "checkpoint", "rollback", "--strategy", "blue-green")
    assert done.returncode == 0 and "base" in done.stdout, done.stdout + done.stderr
    assert_serves(url, headers, stack.model_path, ckpt)
    assert retired(stack.run_dir) is None and pm.pid("worker-0") and pm.pid(f"worker-0-{dep}") is None
    assert httpx.get(f"{url}/v1/deployments/{dep}", headers=headers).status_code == 404  # deleted, its slots free
    models = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert models["tiny"]["checkpoint_version"] == BASE
