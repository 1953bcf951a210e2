"""A gateway's spool is converted to Parquet in a process of its own: nothing is lost when that
process dies, it dies with its gateway, and a spool that falls behind refuses new requests."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.unit.conftest import seeded_gateway
from traces.store import TraceStore
from traces.writer import TraceWriter, spool_dir


def record(i: int) -> dict:
    day = datetime(2026, 12, 1, 12, tzinfo=timezone.utc) + timedelta(days=i % 2)
    return {
        "trace_id": f"tr-{i:04d}",
        "gen_ai_request_model": f"m{i % 3}",
        "time_received": day,
        "prompt_token_ids": [i, i + 1, i + 2],
        "completion_token_ids": [i * 7],
        "completion_logprobs": [-0.25 * (i % 4)],
        "http_status": 200,
    }


def stored(root: Path) -> dict:
    t = TraceStore(root).sql("SELECT trace_id, completion_token_ids, completion_logprobs FROM traces").to_pylist()
    return {r["trace_id"]: (r["completion_token_ids"], r["completion_logprobs"]) for r in t}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_records_are_converted_by_a_child_process_and_read_back_exactly(tmp_path):
    heard: list[str] = []
    writer = TraceWriter(tmp_path, "gw", mover="process", on_converted=lambda part, name, ids: heard.extend(ids))
    for i in range(40):
        writer.submit(record(i))
    assert writer.flush() == 0
    pid = writer.mover_process.pid
    assert pid is not None and pid != os.getpid() and alive(pid)
    assert stored(tmp_path) == {f"tr-{i:04d}": ([i * 7], [-0.25 * (i % 4)]) for i in range(40)}
    assert sorted(heard) == [f"tr-{i:04d}" for i in range(40)]
    writer.close()
    assert not alive(pid)


def test_a_killed_mover_loses_nothing_and_is_started_again(tmp_path):
    writer = TraceWriter(tmp_path, "gw", mover="process", max_age_s=60)
    for i in range(30):
        writer.submit(record(i))
    assert writer.flush() == 0
    first = writer.mover_process.pid
    os.kill(first, signal.SIGKILL)
    for i in range(30, 60):
        writer.submit(record(i))
    # the move that finds the child dead keeps its segment; the next one converts it
    waiting = [writer.flush() for _ in range(3)]
    assert waiting[-1] == 0, waiting
    assert writer.mover_process.pid not in (None, first)
    assert stored(tmp_path) == {f"tr-{i:04d}": ([i * 7], [-0.25 * (i % 4)]) for i in range(60)}
    writer.close()


def test_the_mover_exits_when_its_gateway_is_killed(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from traces.writer import TraceWriter
        w = TraceWriter({str(tmp_path)!r}, "gw", mover="process")
        w.write({{"trace_id": "tr-1", "http_status": 200}})
        w.flush()
        print(w.mover_process.pid, flush=True)
        time.sleep(600)
    """)
    gateway = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        mover = int(gateway.stdout.readline())
        assert alive(mover)
    finally:
        gateway.kill()
        gateway.wait()
    deadline = time.monotonic() + 30
    while alive(mover) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(mover)
    assert list(stored(tmp_path)) == ["tr-1"]


def test_a_spool_past_its_limit_refuses_new_requests_until_it_drains(tmp_path):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    with seeded_gateway(tmp_path, trace_spool_limit_mb=1) as (client, keys):
        auth = {"Authorization": f"Bearer {keys['red']}"}
        spools = [d for d in (tmp_path / "traces" / "_spool").iterdir() if d.name != "seed"]
        assert len(spools) == 1 and spools[0] == spool_dir(tmp_path / "traces", spools[0].name)
        # a segment that cannot be converted (no header: a disk that returns garbage, say) stays
        # in the spool, as a mover that cannot keep up leaves its backlog
        stuck = spools[0] / "seg-00000000000000000-00000001.spool"
        stuck.write_bytes(b"\0" * (2 << 20))
        deadline = time.monotonic() + 10
        while (r := client.post("/v1/chat/completions", json=chat, headers=auth)).status_code != 503 or r.json()["error"][
            "code"
        ] != "trace_store_behind":
            assert time.monotonic() < deadline, r.text
            time.sleep(0.05)
        assert r.headers["Retry-After"] == "1" and r.json()["error"]["type"] == "server_error"
        assert "2 MB" in r.json()["error"]["message"]
        metrics = client.get("/metrics", headers={"Authorization": "Bearer adm"}).text
        backlog = next(line for line in metrics.splitlines() if line.startswith("flywheel_trace_spool_backlog_bytes"))
        assert float(backlog.split()[1]) >= 2 << 20
        stuck.unlink()
        while (r := client.post("/v1/chat/completions", json=chat, headers=auth)).json()["error"]["code"] == "trace_store_behind":
            assert time.monotonic() < deadline + 10, r.text
            time.sleep(0.05)
        # on to the deployment, which does not answer here
        assert r.status_code == 503 and "unreachable" in r.json()["error"]["message"]
