"""Batch leases and results: what keeps a line from running twice or being lost."""

import json

from serve.batch.lines import check_lines
from traces.batch_store import BatchStore


def _batch(store: BatchStore, chunks: int = 3) -> str:
    store.create(
        {"id": "batch_x", "created_at": 0, "status": "in_progress", "_chunks": chunks},
        [{"n": i, "custom_id": f"c{i}", "body": {}} for i in range(chunks)],
        [],
    )
    return "batch_x"


def test_a_running_chunk_is_never_leased_twice_by_anyone(tmp_path):
    store = BatchStore(tmp_path)
    bid = _batch(store)
    assert store.claim(bid, "gw-a/1", 1, 60) == ([0], [])
    assert store.claim(bid, "gw-a/1", 1, 60) == ([1], [])  # its own running chunk is not handed out again
    assert store.claim(bid, "gw-b/1", 5, 60) == ([2], [])  # another replica gets only what is free
    assert store.claim(bid, "gw-b/1", 5, 60) == ([], [])


def test_a_dead_owner_is_taken_over_and_marked_as_such(tmp_path):
    store = BatchStore(tmp_path)
    bid = _batch(store)
    store.claim(bid, "gw-a/1", 2, 60)
    # the same instance restarted (a new lifetime): its old leases are dead at once
    assert store.claim(bid, "gw-a/2", 3, 60) == ([0, 1, 2], [0, 1])
    store.release(bid, "gw-a/1", [0], done=True)  # the dead lifetime's late word changes nothing
    assert store.chunks_left(bid) == 3
    store.release(bid, "gw-a/2", [0, 1], done=True)
    store.release(bid, "gw-a/2", [2], done=False)
    assert store.chunks_left(bid) == 1 and store.claim(bid, "gw-b/1", 3, 60) == ([2], [])
    bid2 = "batch_y"
    store.create({"id": bid2, "created_at": 0, "status": "in_progress", "_chunks": 1}, [], [])
    store.claim(bid2, "gw-a/1", 1, -1)  # a lease that has lapsed
    assert store.claim(bid2, "gw-b/1", 1, 60) == ([0], [0])


def test_results_survive_a_torn_last_line_and_are_read_incrementally(tmp_path):
    store = BatchStore(tmp_path)
    bid = _batch(store)
    store.append_results(bid, "gw-a/1", [{"n": 0, "ok": True}])
    assert set(store.results(bid)) == {0}
    with open(tmp_path / "_batches" / "batches" / bid / "results-gw-a.1.jsonl", "ab") as f:
        f.write(b'{"n": 1, "ok"')  # a crash mid-write: nobody was told this line was stored
    assert set(store.results(bid)) == {0}
    store.append_results(bid, "gw-b/1", [{"n": 1, "ok": False}, {"n": 0, "ok": False}])
    results = BatchStore(tmp_path).results(bid)
    assert results[0]["ok"] is True and results[1]["ok"] is False  # the first answer of a line wins


def test_every_bad_line_is_refused_with_its_reason_and_the_rest_run():
    ok = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "tiny", "messages": [{"role": "user", "content": "é"}]},
    }
    lines = [
        ok,
        "[1]",
        {**ok, "custom_id": ""},
        ok,
        {**ok, "custom_id": "b", "method": "GET"},
        {**ok, "custom_id": "c", "body": {**ok["body"], "stream": True}},
        {**ok, "custom_id": "d", "body": {"model": "tiny"}},
        {**ok, "custom_id": "e"},
    ]
    data = b"\n".join(json.dumps(x).encode() if isinstance(x, dict) else x.encode() for x in lines) + b"\n\n{"
    good, refused = check_lines(data, "/v1/chat/completions", {"tiny"}, 100)
    assert [(g["n"], g["custom_id"]) for g in good] == [(0, "a"), (7, "e")]
    codes = {r["n"]: r["line"]["error"]["code"] for r in refused}
    assert codes == {
        1: "invalid_request",
        2: "missing_custom_id",
        3: "duplicate_custom_id",
        4: "invalid_method",
        5: "invalid_body",
        6: "invalid_body",
        8: "invalid_json",
    }
    try:
        check_lines(data, "/v1/chat/completions", {"tiny"}, 3)
        raise AssertionError("a file over max_lines was taken")
    except ValueError as exc:
        assert "max_lines" in str(exc)


def test_the_scheduler_reads_only_batches_with_work_left_and_the_index_heals(tmp_path):
    import os
    import shutil

    store = BatchStore(tmp_path)
    for bid, created in (("batch_old", 1), ("batch_new", 2)):
        store.create({"id": bid, "created_at": created, "status": "in_progress", "_chunks": 1}, [], [])
    assert [b["id"] for b in store.active()] == ["batch_old", "batch_new"]  # oldest first
    store.update("batch_old", lambda b: b.update(status="completed") or True)
    assert [b["id"] for b in store.active()] == ["batch_new"]
    assert sorted(p.name for p in store.active_dir.iterdir()) == ["batch_new"]  # the ended one's marker is gone
    assert {b["id"] for b in store.list()} == {"batch_old", "batch_new"}  # the history stays listed

    orphan = store.active_dir / "batch_crashed_in_create"  # a marker whose batch.json never came
    orphan.touch()
    assert [b["id"] for b in store.active()] == ["batch_new"] and orphan.exists()  # young: may still come
    os.utime(orphan, (1, 1))
    store.active()
    assert not orphan.exists()

    shutil.rmtree(store.active_dir)  # a store written before the index: built once, from the batches
    assert [b["id"] for b in BatchStore(tmp_path).active()] == ["batch_new"]
