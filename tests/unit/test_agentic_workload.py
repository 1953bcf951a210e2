"""The agentic bench's request plans: growing sessions, cold arrivals, Mooncake traces, and the
ideal prefix reuse the measured reuse is compared against."""

import json

import pytest

from deploy.bench.workload import SessionShape, ideal_cached, mooncake_plan, session_plan, to_mooncake

SHAPE = SessionShape(sessions=4, turns=3, shared_prefix=64, history=256, step=40, output=8, cold_fraction=0.25, cold_prompt=200)


def test_session_turns_grow_by_the_step_over_their_history_and_cold_jobs_share_nothing():
    jobs = session_plan(SHAPE)
    sessions = [j for j in jobs if j.requests[0].session]
    cold = [j for j in jobs if not j.requests[0].session]
    assert len(sessions) == 4 and len(cold) == 4  # 12 turns / 0.75 * 0.25
    for job in sessions:
        lengths = [len(r.prompt) for r in job.requests]
        assert lengths == [64 + 256 + 40 * (k + 1) for k in range(3)]
        for a, b in zip(job.requests, job.requests[1:]):
            assert b.prompt[: len(a.prompt)] == a.prompt  # each turn extends the previous prompt
    firsts = [j.requests[0].prompt for j in sessions]
    assert all(p[:64] == firsts[0][:64] for p in firsts) and firsts[0][64:80] != firsts[1][64:80]
    assert session_plan(SHAPE)[0].requests[0].prompt == jobs[0].requests[0].prompt  # seeded


def test_ideal_reuse_counts_whole_shared_blocks_and_leaves_the_last_token_to_compute():
    a = list(range(100))
    assert ideal_cached([a, a + [7] * 30, list(range(50)) + [9] * 50, a[:64]], block=32) == [0, 96, 32, 32]


def test_a_mooncake_trace_round_trip_keeps_the_prefix_structure(tmp_path):
    jobs = session_plan(SHAPE)
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in to_mooncake(jobs, block_tokens=16)))
    replay = mooncake_plan(path, block_tokens=16)
    prompts = [r.prompt for j in jobs for r in j.requests]
    replayed = [j.requests[0].prompt for j in replay]
    assert [len(p) for p in replayed] == [len(p) for p in prompts]
    assert ideal_cached(replayed, 16) == ideal_cached(prompts, 16)
    times = [j.requests[0].at_s for j in replay]
    assert times == sorted(times) and times[0] > 0


def test_a_scaled_trace_shrinks_lengths_and_a_broken_row_names_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 100, "hash_ids": [1, 2]}\n'
        '{"timestamp": 5, "input_length": 700, "output_length": 10, "hash_ids": [1, 3]}\n'
    )
    small = mooncake_plan(path, scale=0.05)
    assert [len(j.requests[0].prompt) for j in small] == [51, 35]
    assert small[0].requests[0].prompt[:26] == small[1].requests[0].prompt[:26]  # shared block 1
    path.write_text('{"timestamp": 0, "input_length": 10}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:1: .*needs output_length, hash_ids"):
        mooncake_plan(path)
