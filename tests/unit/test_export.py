"""Exports keep the engine's token ids, shape rows for each trainer, and hash reproducibly."""

import json

import pytest
from datasets import load_from_disk

from feedback.export import export
from traces.feedback import write_feedback
from traces.store import TraceStore
from traces.writer import TraceWriter


@pytest.fixture
def store(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    prompts = {"p1": [5, 6, 7], "p2": [8, 9]}
    rewards = []
    for i in range(8):
        p = "p1" if i < 5 else "p2"
        tid = f"tr-{i}"
        writer.submit(
            {
                "trace_id": tid,
                "gen_ai_operation_name": "chat",
                "gen_ai_request_model": "tiny",
                "checkpoint_version": "base",
                "http_status": 200,
                "gen_ai_input_messages": json.dumps([{"role": "user", "content": p}]),
                "gen_ai_tool_definitions": json.dumps([{"type": "function", "function": {"name": "f"}}]),
                "response_content": f"answer {i}",
                "response_tool_calls": json.dumps(
                    [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
                )
                if i == 0
                else None,
                "prompt_token_ids": prompts[p],
                "completion_token_ids": [100 + i, 200 + i],
                "completion_logprobs": [-0.5, -0.25 * i],
            }
        )
        rewards.append({"trace_id": tid, "name": "reward", "reward": float(i % 3)})
    writer.close()
    write_feedback(tmp_path, rewards)
    return TraceStore(tmp_path)


def test_sft_export_has_chat_messages_tools_and_exact_token_ids(store, tmp_path):
    m = export(store, "sft", tmp_path / "sft")
    ds = load_from_disk(str(tmp_path / "sft"))
    assert m["rows"] == len(ds) == 8
    row = ds[0]
    assert row["messages"][0]["role"] == "user" and row["messages"][-1]["content"] == "answer 0"
    assert row["messages"][-1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert json.loads(row["tools"])[0]["function"]["name"] == "f"
    assert row["prompt_token_ids"] == [5, 6, 7] and row["completion_token_ids"] == [100, 200]


def test_rl_export_rows_are_token_level_with_group_advantages(store, tmp_path):
    export(store, "rl", tmp_path / "rl", "SELECT * FROM traces WHERE http_status = 200")
    ds = load_from_disk(str(tmp_path / "rl"))
    row = ds[3]
    assert row["prompt_ids"] == [5, 6, 7] and row["prompt_mask"] == [0, 0, 0]
    assert row["completion_ids"] == [103, 203] and row["completion_mask"] == [1, 1]
    assert row["completion_logprobs"] == pytest.approx([-0.5, -0.75])
    assert row["reward"] == 0.0
    p1 = [r for r in ds if r["prompt_ids"] == [5, 6, 7]]
    assert sum(r["advantage"] for r in p1) == pytest.approx(0.0)


def test_preference_pairs_pick_best_and_worst_per_prompt(store, tmp_path):
    export(store, "preference", tmp_path / "pref")
    ds = load_from_disk(str(tmp_path / "pref"))
    assert len(ds) == 2
    for row in ds:
        assert row["chosen_reward"] > row["rejected_reward"]
    p1 = next(r for r in ds if r["prompt_token_ids"] == [5, 6, 7])
    assert (p1["chosen_trace_id"], p1["rejected_trace_id"]) == ("tr-2", "tr-0")


def test_the_same_export_twice_gives_the_same_hash(store, tmp_path):
    a = export(store, "rl", tmp_path / "a")
    b = export(store, "rl", tmp_path / "b")
    assert a["content_hash"] == b["content_hash"] and a["rows"] == 8
    c = export(store, "rl", tmp_path / "c", "SELECT * FROM traces WHERE trace_id <> 'tr-1'")
    assert c["content_hash"] != a["content_hash"]


def test_an_export_query_must_return_trace_rows(store, tmp_path):
    with pytest.raises(ValueError, match="whole trace rows"):
        export(store, "sft", tmp_path / "x", "SELECT trace_id FROM traces")
