"""`flywheel loop` as its user runs it: a verifiers taskset of their own (from PYTHONPATH), GRPO
on the served rollouts, the eval reward rising over two turns; and a crash mid-turn that a
`--resume` carries on from the last completed phase, without rolling out again."""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from deploy.cli.loop import run_loop
from deploy.stack.graphs import graph_processes
from loop.config import LoopConfig
from loop.phases import Loop
from loop.state import LoopState
from feedback.registry import Registry
from serve.keys import KeyStore
from tests.integration.conftest import LOCAL_STACK
from tests.integration.weights_check import PROMPT_IDS, greedy_gaps, served_greedy
from traces.store import TraceStore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("base_afterwards")]
ROOT = Path(__file__).resolve().parents[2]
HEAD_ENV = "tests.integration.vf_head_env:HeadTaskset"


def test_loop_on_an_environment_the_test_defines_raises_its_eval_reward_in_two_turns(stack):
    sets = [a for kv in [f"home={stack.home}", *LOCAL_STACK] for a in ("--set", kv)]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "flywheel"), "loop", "--env", HEAD_ENV, "--turns", "2", "--json", *sets],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout)  # stdout is the JSON document alone
    evals = [t["eval"] for t in result["turns"]]
    print(
        f"\nhead (first word), greedy eval: {[e['reward_mean'] for e in evals]}, "
        f"off-policy gap {[t['train']['off_policy_gap'] for t in result['turns'][1:]]}"
    )
    assert evals[2]["reward_mean"] > evals[0]["reward_mean"], evals
    assert result["env"] == HEAD_ENV and result["algo"] == "grpo" and Path(result["plot"]).exists()
    for t in result["turns"][1:]:
        assert t["rollouts"]["n"] == 32 * 8 and t["rollouts"]["rewarded"] == 32 * 8
        assert set(t["seconds"]) == {"rollouts", "export", "train", "deploy", "eval"}
        assert t["train"]["off_policy_gap"] >= 0 and t["eval"]["n"] == 64
    from feedback.registry import Registry

    ckpt = Registry(stack.home_path / "checkpoints.json").get(result["turns"][2]["version"])
    assert (ckpt.env, ckpt.turn, ckpt.parent) == (HEAD_ENV, 2, result["turns"][1]["version"])
    assert ckpt.dataset["kind"] == "rl" and ckpt.dataset["rows"] == 32 * 8


def test_the_loops_checkpoint_deployed_dedicated_serves_its_weights_to_its_team_alone(stack):
    """A checkpoint `flywheel loop` registered, on capacity of its own for team alpha, while the
    serverless deployment keeps serving: alpha's greedy tokens are that checkpoint's (a Hugging
    Face forward of it says so), and to beta it does not exist. Autoscaled with min 0: idle, its
    vLLM-CPU worker stops; 20 requests arriving at zero wake it, and each gets those tokens."""
    made = [c for c in Registry(stack.home_path / "checkpoints.json").list() if c.env == HEAD_ENV]
    assert made, "the loop test before this one registers the checkpoints"
    ckpt = max(made, key=lambda c: c.turn)
    gw = stack.resolved_gateway()
    url, admin = gw.url, {"Authorization": f"Bearer {stack.admin_key()}"}
    keys = KeyStore(gw.keys_file)
    alpha, beta = ({"Authorization": f"Bearer {keys.create(team)[1]}"} for team in ("alpha", "beta"))
    knobs = {"scale_down_delay_s": 1, "scale_to_zero_after_s": 20, "cold_start_timeout_s": 300}
    body = {"model": ckpt.version, "name": "loop", "team": "alpha", "replicas": {"min": 0, "max": 1}, "autoscale": knobs}
    created = httpx.post(f"{url}/v1/deployments", headers=admin, json=body)
    assert created.status_code == 202, created.text
    dep = created.json()
    try:
        t0 = time.monotonic()
        while (got := httpx.get(f"{url}/v1/deployments/{dep['id']}", headers=admin).json())["status"] != "RUNNING":
            assert got["status"] == "DEPLOYING" and time.monotonic() - t0 < 600, got
            assert served_greedy(url, {}) is not None  # the serverless deployment serves meanwhile
            time.sleep(1)
        served = served_greedy(url, alpha, model="alpha/loop")
        gaps = greedy_gaps(ckpt.base_model, served, ckpt.path) if ckpt.kind == "lora" else greedy_gaps(ckpt.path, served)
        print(f"\n{ckpt.version} ({ckpt.kind}) dedicated: served {served}, max gap to its argmax {max(gaps):.4f}")
        assert max(gaps) < 0.1, (served, gaps)
        body = {"model": "alpha/loop", "token_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 2}}
        refused = httpx.post(f"{url}/inference/v1/generate", headers=beta, json=body, timeout=60)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", refused.text
        assert "alpha/loop" not in [m["id"] for m in httpx.get(f"{url}/v1/models", headers=beta).json()["data"]]
        assert "alpha/loop" in [m["id"] for m in httpx.get(f"{url}/v1/models", headers=alpha).json()["data"]]
        asleep_then_woken_by_20(stack, url, admin, alpha, dep["id"], served)
    finally:
        httpx.delete(f"{url}/v1/deployments/{dep['id']}", headers=admin)
        t0 = time.monotonic()
        while httpx.get(f"{url}/v1/deployments/{dep['id']}", headers=admin).status_code != 404:
            assert time.monotonic() - t0 < 120, "the dedicated deployment was not deleted"
            time.sleep(0.5)


def asleep_then_woken_by_20(stack, url: str, admin: dict, alpha: dict, dep_id: str, served: list[int]) -> None:
    t0 = time.monotonic()
    while (got := httpx.get(f"{url}/v1/deployments/{dep_id}", headers=admin).json())["replicas"]["ready"] or [
        n for n in graph_processes(stack.run_dir).get(dep_id, []) if n.startswith("worker-")
    ]:
        assert time.monotonic() - t0 < 180, f"not scaled to zero: {got}"
        time.sleep(1)
    assert got["replicas"]["desired"] == 0 and got["decisions"][-1]["signal"] == "idle", got
    body = {"model": "alpha/loop", "token_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 6, "temperature": 0}}
    with ThreadPoolExecutor(20) as pool:
        answers = list(
            pool.map(lambda _: httpx.post(f"{url}/inference/v1/generate", headers=alpha, json=body, timeout=360), range(20))
        )
    assert [r.status_code for r in answers] == [200] * 20, [r.text[:200] for r in answers if r.status_code != 200][:3]
    assert [r.json()["choices"][0]["token_ids"] for r in answers] == [served] * 20  # the checkpoint's, woken
    ids = ", ".join(f"'{r.headers['x-trace-id']}'" for r in answers)
    t0, waits = time.monotonic(), []
    while len(waits) < 20 and time.monotonic() - t0 < 30:
        waits = TraceStore(stack.traces_path).sql(f"SELECT queue_wait_ms FROM traces WHERE trace_id IN ({ids})")
        waits = waits.column("queue_wait_ms").to_pylist()
        time.sleep(0.5)
    print(f"\nwoken from zero on vLLM-CPU: queue waits {min(waits):.0f}-{max(waits):.0f} ms")
    assert len(waits) == 20 and min(waits) > 1000, waits  # each waited at the gateway while the worker started


def test_a_loop_that_crashed_mid_turn_resumes_from_its_last_completed_phase(stack, monkeypatch):
    lc = LoopConfig(env=HEAD_ENV, turns=1, train_tasks=8, eval_tasks=8, samples=4, steps=5, seed=3)
    real_train, calls = Loop._train, []

    def train_that_crashes_once(self, *args):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("the trainer was killed")
        return real_train(self, *args)

    monkeypatch.setattr(Loop, "_train", train_that_crashes_once)
    with pytest.raises(RuntimeError, match="killed"):
        run_loop(stack, lc)
    state = LoopState.open(stack.home_path, "last", None)
    assert {"0.eval", "1.rollouts", "1.export"} <= set(state.data["phases"]) and "1.train" not in state.data["phases"]
    result = run_loop(stack, resume=state.run_id)
    assert result["run_id"] == state.run_id and len(calls) == 2
    state = LoopState.open(stack.home_path, state.run_id, None)
    assert state.data["attempts"] == [1]  # the turn was rolled out once, not again
    store = TraceStore(stack.traces_path)
    store.refresh()
    rows = store.sql(f"SELECT count(*) AS n FROM traces WHERE env_id LIKE '{state.run_id}-t1-%'")
    assert rows.column("n")[0].as_py() == 8 * 4
    assert set(state.data["phases"]) == {"0.eval", "1.rollouts", "1.export", "1.train", "1.deploy", "1.eval"}


def test_a_loop_releasing_dedicated_rolls_out_on_its_last_checkpoints_deployment_and_leaves_the_alias(stack):
    """`--deploy dedicated`: each turn's checkpoint on a deployment of its own for the loop's team;
    the next turn's rollouts and every eval after it are served there (on-policy), the previous
    turn's deployment goes (first, here: the local pool has room for one), and the alias keeps
    serving the warmed base."""
    # 8 samples a task: with 4, the warmed model answered every task's group alike once in four
    # clean runs (nothing to learn: no checkpoint, no deployment for this test to follow)
    lc = LoopConfig(env=HEAD_ENV, turns=2, train_tasks=8, eval_tasks=8, samples=8, steps=5, seed=4, deploy="dedicated")
    result = run_loop(stack, lc)
    gw = stack.resolved_gateway()
    admin = {"Authorization": f"Bearer {stack.admin_key()}"}
    state = json.loads((stack.home_path / "loops" / result["run_id"] / "state.json").read_text())
    first, second = (state["phases"][f"{t}.deploy"] for t in (1, 2))
    try:
        assert Registry(gw.checkpoints_file).current("tiny") == result["turns"][0]["version"]
        store = TraceStore(stack.traces_path)

        def served(env_id: str) -> list[dict]:
            sql = "SELECT DISTINCT deployment, checkpoint_version, gen_ai_request_model FROM traces WHERE env_id = $1"
            return store.sql(sql, params=[env_id]).to_pylist()

        turns = result["turns"]
        assert served(turns[1]["eval"]["env_id"]) == [
            {
                "deployment": first["deployment"],
                "checkpoint_version": first["version"],
                "gen_ai_request_model": first["served_model"],
            }
        ]
        assert {r["deployment"] for r in served(turns[2]["rollouts"]["env_id"])} == {first["deployment"]}  # on-policy
        assert {r["deployment"] for r in served(turns[2]["eval"]["env_id"])} == {second["deployment"]}
        t0 = time.monotonic()
        while httpx.get(f"{gw.url}/v1/deployments/{first['deployment']}", headers=admin).status_code != 404:
            assert time.monotonic() - t0 < 120, "the previous turn's deployment was not deleted"
            time.sleep(0.5)
        assert httpx.get(f"{gw.url}/v1/deployments/{second['deployment']}", headers=admin).json()["status"] == "RUNNING"
    finally:
        for dep in (first, second):
            httpx.delete(f"{gw.url}/v1/deployments/{dep['deployment']}", headers=admin)
        t0 = time.monotonic()
        while httpx.get(f"{gw.url}/v1/deployments/{second['deployment']}", headers=admin).status_code != 404:
            assert time.monotonic() - t0 < 120, "the dedicated deployment was not deleted"
            time.sleep(0.5)
