import random
from datetime import datetime, timedelta, timezone

from traces.store import TraceStore
from traces.writer import TraceWriter


def agent_session(writer, session: str, turns: int, rng: random.Random, start=None) -> dict:
    """Each turn's prompt = the previous prompt + part of its output + a few hundred new tokens."""
    prompt, originals = [rng.randrange(4000) for _ in range(500)], {}
    for turn in range(turns):
        completion = [rng.randrange(4000) for _ in range(rng.randrange(20, 80))]
        tid = f"{session}-{turn}"
        originals[tid] = list(prompt)
        writer.write(
            {
                "trace_id": tid,
                "gen_ai_conversation_id": session,
                "gen_ai_request_model": "m",
                "prompt_token_ids": list(prompt),
                "completion_token_ids": completion,
                "time_received": start or datetime.now(timezone.utc),
                "http_status": 200,
            }
        )
        # the template re-renders the assistant turn: keep only some of its tokens, then add more
        prompt = (
            prompt + completion[: rng.randrange(len(completion))] + [rng.randrange(4000) for _ in range(rng.randrange(100, 400))]
        )
    return originals


def test_a_20_turn_session_reads_back_every_full_prompt_exactly(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    originals = agent_session(writer, "s1", 20, random.Random(1))
    writer.close()
    store = TraceStore(tmp_path)
    by_sql = {
        r["trace_id"]: r["prompt_token_ids"] for r in store.sql("SELECT trace_id, prompt_token_ids FROM traces_full").to_pylist()
    }
    assert by_sql == originals
    assert store.prompt_token_ids(list(originals)) == originals
    stored = store.sql("SELECT sum(len(prompt_new_token_ids)) AS s FROM traces").column("s")[0].as_py()
    whole = sum(len(p) for p in originals.values())
    assert stored < whole / 5  # only the new tokens are kept


def test_a_prompt_that_does_not_extend_its_session_is_stored_whole(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    base = {"gen_ai_conversation_id": "s", "gen_ai_request_model": "m", "http_status": 200, "completion_token_ids": [5, 6]}
    writer.write({**base, "trace_id": "a", "prompt_token_ids": list(range(1000))})
    writer.submit({**base, "trace_id": "b", "prompt_token_ids": [9] + list(range(1000))})
    writer.close()
    rows = (
        TraceStore(tmp_path)
        .sql("SELECT trace_id, prompt_prefix_trace_id, len(prompt_new_token_ids) AS n FROM traces ORDER BY trace_id")
        .to_pylist()
    )
    assert rows[1] == {"trace_id": "b", "prompt_prefix_trace_id": None, "n": 1001}


def test_references_never_cross_a_date_partition(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    yesterday = datetime.now(timezone.utc) - timedelta(days=1)
    base = {"gen_ai_conversation_id": "s", "gen_ai_request_model": "m", "http_status": 200, "completion_token_ids": [5]}
    writer.write({**base, "trace_id": "old", "prompt_token_ids": list(range(500)), "time_received": yesterday})
    writer.submit({**base, "trace_id": "new", "prompt_token_ids": list(range(600)), "time_received": datetime.now(timezone.utc)})
    writer.close()
    ref = TraceStore(tmp_path).sql("SELECT prompt_prefix_trace_id AS r FROM traces WHERE trace_id = 'new'")
    assert ref.to_pylist() == [{"r": None}]


def test_a_prefix_reference_never_points_into_another_teams_trace(tmp_path):
    writer = TraceWriter(tmp_path, "gw")
    prompt = list(range(300))
    writer.write(
        {
            "trace_id": "blue-0",
            "team": "blue",
            "gen_ai_conversation_id": "shared-id",
            "gen_ai_request_model": "m",
            "prompt_token_ids": prompt,
            "completion_token_ids": [1, 2],
            "http_status": 200,
        }
    )
    # red guesses blue's session id, and names blue's trace as its parent: both are ignored
    for i, headers in enumerate(({"gen_ai_conversation_id": "shared-id"}, {"parent_trace_id": "blue-0"})):
        writer.write(
            {
                "trace_id": f"red-{i}",
                "team": "red",
                "gen_ai_request_model": "m",
                "prompt_token_ids": prompt + [7],
                "completion_token_ids": [3],
                "http_status": 200,
                **headers,
            }
        )
    # the same team's next turn still shares its session's prefix
    writer.write(
        {
            "trace_id": "blue-1",
            "team": "blue",
            "gen_ai_conversation_id": "shared-id",
            "gen_ai_request_model": "m",
            "prompt_token_ids": prompt + [1, 2, 9],
            "completion_token_ids": [4],
            "http_status": 200,
        }
    )
    writer.close()
    refs = {
        r["trace_id"]: r["prompt_prefix_trace_id"]
        for r in TraceStore(tmp_path).sql("SELECT trace_id, prompt_prefix_trace_id FROM traces").to_pylist()
    }
    assert refs == {"blue-0": None, "red-0": None, "red-1": None, "blue-1": "blue-0"}
    red = TraceStore(tmp_path, team="red")
    assert red.sql("SELECT trace_id, len(prompt_token_ids) AS n FROM traces_full ORDER BY 1").to_pylist() == [
        {"trace_id": "red-0", "n": 301},
        {"trace_id": "red-1", "n": 301},
    ]


def test_a_turn_whose_write_failed_is_never_a_reference_so_the_next_turn_rebuilds(tmp_path, monkeypatch):
    """The first turn's spool write fails (its client got a 503); the second turn, answered,
    must not be stored as a reference to the row that was never written."""
    from traces.spool import SpoolError

    writer = TraceWriter(tmp_path, "gw")
    base = {"gen_ai_conversation_id": "s", "gen_ai_request_model": "m", "http_status": 200, "completion_token_ids": [5, 6]}
    writer.write({**base, "trace_id": "t0", "prompt_token_ids": list(range(300))})
    real = writer.spool._write_locked

    def disk_full(buf):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.spool, "_write_locked", disk_full)
    try:
        writer.write({**base, "trace_id": "t1", "prompt_token_ids": list(range(600))})
    except SpoolError:
        pass
    else:
        raise AssertionError("a failed write was acknowledged")
    monkeypatch.setattr(writer.spool, "_write_locked", real)
    writer.write({**base, "trace_id": "t2", "prompt_token_ids": list(range(900))})
    writer.close()
    store = TraceStore(tmp_path)
    rows = {
        r["trace_id"]: r
        for r in store.sql("SELECT trace_id, prompt_prefix_trace_id AS ref, prompt_token_ids FROM traces_full").to_pylist()
    }
    assert set(rows) == {"t0", "t2"}
    assert rows["t2"]["ref"] == "t0" and rows["t2"]["prompt_token_ids"] == list(range(900))
