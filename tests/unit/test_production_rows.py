"""A production turn's rows: the team's query, in the team's sandbox, served by the serving
checkpoint in the turn's window, rewarded; exported as GRPO groups or rejection-sampling solves."""

from datetime import datetime, timedelta, timezone

import pytest

from feedback.export import export
from loop.algorithms import ALGORITHMS
from loop.config import LoopConfig
from loop.production import check_query, production_rows
from traces.feedback import write_feedback
from traces.guard import QueryRefused
from traces.store import TraceStore
from traces.writer import TraceWriter

T0 = datetime(2026, 12, 4, 12, tzinfo=timezone.utc)
REWARDS = "SELECT trace_id, reward FROM rewards WHERE name = 'reward'"


@pytest.fixture
def store_root(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    rows = [  # (trace id, team, version, minutes after T0, example, reward)
        ("in-0", "red", "v1", 1, "e0", 1.0),
        ("in-1", "red", "v1", 2, "e0", 0.0),
        ("in-2", "red", "v1", 3, "e1", 1.0),
        ("in-3", "red", "v1", 4, "e1", 1.0),
        ("unrewarded", "red", "v1", 4, "e1", None),
        ("candidate", "red", "v2", 2, "e0", 1.0),  # a canary's candidate served it
        ("early", "red", "v1", -1, "e0", 1.0),  # an earlier turn's
        ("late", "red", "v1", 11, "e0", 1.0),  # the next turn's
        ("theirs", "blue", "v1", 2, "e0", 1.0),  # another team's
    ]
    feedback = []
    for tid, team, version, minutes, example, reward in rows:
        writer.write(
            {
                "trace_id": tid,
                "team": team,
                "checkpoint_version": version,
                "time_received": T0 + timedelta(minutes=minutes),
                "example_id": example,
                "gen_ai_request_model": "tiny",
                "gen_ai_input_messages": '[{"role": "user", "content": "q"}]',
                "http_status": 200,
                "prompt_token_ids": [1, 2, 3 if example == "e0" else 4],
                "completion_token_ids": [5],
                "completion_logprobs": [-0.5],
            }
        )
        if reward is not None:
            feedback.append({"trace_id": tid, "team": team, "name": "reward", "reward": reward})
    writer.close()
    write_feedback(tmp_path, feedback)
    return tmp_path


def window(query: str = REWARDS) -> str:
    return production_rows(query, "v1", T0.isoformat(), (T0 + timedelta(minutes=10)).isoformat())


def test_a_turn_takes_its_teams_rewarded_rows_of_the_serving_checkpoint_in_its_window(store_root):
    got = TraceStore(store_root, team="red").sql(f"SELECT trace_id, reward FROM ({window()}) ORDER BY trace_id").to_pylist()
    assert got == [
        {"trace_id": "in-0", "reward": 1.0},
        {"trace_id": "in-1", "reward": 0.0},
        {"trace_id": "in-2", "reward": 1.0},
        {"trace_id": "in-3", "reward": 1.0},
    ]
    # the query's own reward is the one trained on: inverted here
    inverted = window(REWARDS.replace("reward FROM", "1 - reward AS reward FROM"))
    assert TraceStore(store_root, team="red").sql(f"SELECT sum(reward) AS s FROM ({inverted})").to_pylist()[0]["s"] == 1.0


def test_grpo_exports_the_groups_and_rs_one_solve_per_task(store_root, tmp_path):
    grpo = export(TraceStore(store_root, team="red"), "rl", tmp_path / "rl", ALGORITHMS["grpo"](LoopConfig()).from_rows(window()))
    assert grpo["rows"] == 4
    rs = ALGORITHMS["rs"](LoopConfig(algo="rs")).from_rows(window())
    assert export(TraceStore(store_root, team="red"), "sft", tmp_path / "sft", rs)["rows"] == 2  # e0 and e1


@pytest.mark.parametrize(
    "query, says",
    [
        ("DELETE FROM traces", "only SELECT"),
        ("SELECT trace_id FROM traces", "lacks ['reward']"),
        ("SELECT trace_id, reward FROM read_parquet('/etc/x')", "table function"),
        ("SELECT nothing, reward FROM rewards", "does not run"),
    ],
)
def test_a_query_that_is_not_a_select_of_the_views_with_both_columns_is_refused(store_root, query, says):
    with pytest.raises(QueryRefused, match=says.replace("[", r"\[").replace("]", r"\]")):
        check_query(TraceStore(store_root, team="red"), query)
