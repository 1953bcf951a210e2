"""The loop trains on its own rollouts only: another team (or another key) that sends the same,
guessable env id cannot put its traces or rewards into the checkpoint."""

import pytest

from loop.algorithms import ALGORITHMS
from loop.config import LoopConfig
from loop.scope import run_scope
from traces.feedback import write_feedback
from traces.store import TraceStore
from traces.writer import TraceWriter

ENV = "run-1-t0-a0"


@pytest.fixture
def store(tmp_path):
    writer = TraceWriter(tmp_path, "seed")
    rows = [
        ("ours-0", "red", "key-red", 0),
        ("ours-1", "red", "key-red", 1),
        ("other-key", "red", "key-red-2", 2),
        ("theirs", "blue", "key-blue", 3),
    ]
    for tid, team, key, ex in rows:
        writer.write(
            {
                "trace_id": tid,
                "team": team,
                "api_key_id": key,
                "env_id": ENV,
                "example_id": str(ex),
                "gen_ai_request_model": "tiny",
                "http_status": 200,
                "prompt_token_ids": [1, 2],
                "completion_token_ids": [3],
            }
        )
    writer.close()
    write_feedback(
        tmp_path,
        [
            {"trace_id": t, "team": team, "name": "reward", "reward": 1.0}
            for t, team in (("ours-0", "red"), ("ours-1", "red"), ("other-key", "red"), ("theirs", "blue"))
        ],
    )
    return TraceStore(tmp_path)


@pytest.mark.parametrize("algo", ["grpo", "rs"])
def test_training_data_is_the_loops_team_and_key_only(store, algo):
    sql = ALGORITHMS[algo](LoopConfig(algo=algo)).training_sql(run_scope("red", "key-red"), ENV, "run-1")
    assert sorted(store.sql(sql).column("trace_id").to_pylist()) == ["ours-0", "ours-1"]


def test_an_env_id_with_a_quote_cannot_widen_the_query(store):
    sql = ALGORITHMS["grpo"](LoopConfig()).training_sql(run_scope("red", "key-red"), "x' OR '1'='1", "run-1")
    assert store.sql(sql).num_rows == 0
