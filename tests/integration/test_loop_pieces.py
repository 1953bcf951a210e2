"""The pieces of the loop against the real stack: verifiers environments through the gateway,
token-in/token-out generation, and exports that keep the engine's token ids."""

import httpx
import pytest

from envs.vf_run import NotEnoughTasks, run_env
from feedback.export import export
from serve.keys import KeyStore
from traces.store import TraceStore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def team_key(stack):
    _, key = KeyStore(stack.resolved_gateway().keys_file).create("evals", "integration tests")
    return key


def test_a_verifiers_environment_runs_through_the_gateway_and_its_rewards_land_in_sql(stack, gateway_url, team_key):
    results = run_env("envs.vf_wordops", gateway_url, team_key, "tiny", n=4, rollouts=2, max_tokens=8, env_id="vf-words-test")
    assert len(results) == 8 and all(r.ok for r in results)
    rows = (
        TraceStore(stack.traces_path)
        .sql(
            "SELECT t.example_id, t.rollout_id, t.gen_ai_conversation_id AS session, t.team, r.reward "
            "FROM traces t JOIN rewards r USING (trace_id) WHERE t.env_id = 'vf-words-test'"
        )
        .to_pylist()
    )
    assert len(rows) == 8
    by_session = {r.session_id: r.reward for r in results}
    for row in rows:
        assert row["team"] == "evals" and row["example_id"].startswith("tail-")
        assert row["rollout_id"].startswith(f"vf-words-test/{row['example_id']}/")
        assert row["reward"] == pytest.approx(by_session[row["session"]])
    assert len({r["rollout_id"] for r in rows}) == 8 and len({r["session"] for r in rows}) == 8


def test_a_taskset_without_task_ids_runs_and_a_short_one_says_what_to_pass(stack, gateway_url, team_key):
    taskset = "tests.integration.vf_head_env:AnonymousTaskset"
    results = run_env(taskset, gateway_url, team_key, "tiny", n=2, max_tokens=4, env_id="vf-anon-test", taskset_args={"n": 3})
    assert sorted(r.example_id for r in results) == ["task-0", "task-1"]
    rows = (
        TraceStore(stack.traces_path)
        .sql("SELECT DISTINCT example_id FROM traces WHERE env_id = 'vf-anon-test' ORDER BY 1")
        .to_pylist()
    )
    assert rows == [{"example_id": "task-0"}, {"example_id": "task-1"}]
    with pytest.raises(NotEnoughTasks, match="--train-tasks and --eval-tasks that add up to at most 3"):
        run_env(taskset, gateway_url, team_key, "tiny", n=2, offset=2, env_id="vf-anon-short", taskset_args={"n": 3})


def test_token_in_token_out_generate_is_captured_like_any_request(stack, gateway_url):
    prompt = [2, 203, 2316, 225, 21, 22, 3]
    r = httpx.post(
        f"{gateway_url}/inference/v1/generate",
        timeout=60,
        json={
            "model": "tiny",
            "token_ids": prompt,
            "sampling_params": {"max_tokens": 6, "temperature": 0, "logprobs": 1, "skip_special_tokens": False},
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert len(choice["token_ids"]) == 6
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in choice["token_ids"]]
    store = TraceStore(stack.traces_path)
    import time

    for _ in range(50):
        store.refresh()
        row = store.sql(f"SELECT * FROM traces_full WHERE trace_id = '{r.headers['x-trace-id']}'").to_pylist()
        if row:
            break
        time.sleep(0.2)
    row = row[0]
    assert row["prompt_token_ids"] == prompt and row["completion_token_ids"] == choice["token_ids"]
    assert row["completion_logprobs"] == pytest.approx([e["logprob"] for e in choice["logprobs"]["content"]], abs=1e-6)
    assert row["gen_ai_operation_name"] == "generate"


def test_an_rl_export_holds_the_engines_token_ids_and_its_hash_is_reproducible(stack, openai_client, tmp_path):
    engine = {}
    for i in range(4):
        raw = openai_client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": f"count to {i}"}],
            max_tokens=5,
            logprobs=True,
            extra_headers={"X-Env-ID": "export-test"},
            extra_body={"nvext": {"extra_fields": ["completion_token_ids"]}},
        )
        engine[raw.headers["x-trace-id"]] = raw.parse().model_dump()["nvext"]["completion_token_ids"]
    store = TraceStore(stack.traces_path)
    sql = "SELECT * FROM traces WHERE env_id = 'export-test'"
    import time

    while store.sql(f"SELECT count(*) AS n FROM ({sql})").column("n")[0].as_py() < 4:
        time.sleep(0.2)
        store.refresh()
    first = export(store, "rl", tmp_path / "a", sql)
    second = export(store, "rl", tmp_path / "b", sql)
    assert first["content_hash"] == second["content_hash"] and first["rows"] == 4
    from datasets import load_from_disk

    for row in load_from_disk(str(tmp_path / "a")):
        assert row["completion_ids"] == engine[row["trace_id"]]
