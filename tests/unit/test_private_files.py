"""Everything the gateway stores holds some team's prompts or money: private to its user (files
0600, folders 0700), whatever the umask, like the spool and the secrets already were."""

import os
import stat

from tests.unit.conftest import seeded_gateway
from traces.housekeeping import compact


def test_traces_feedback_batches_and_ledgers_are_private(tmp_path):
    old = os.umask(0o022)
    try:
        with seeded_gateway(tmp_path, spend_file=str(tmp_path / "traces" / "spend.json"), budgets={"red": {"tokens": 1000}}) as (
            client,
            keys,
        ):
            red = {"Authorization": f"Bearer {keys['red']}"}
            assert client.post("/v1/feedback", json={"trace_id": "tr-0", "reward": 1}, headers=red).status_code == 200
            f = client.post(
                "/v1/files",
                files={
                    "file": (
                        "in.jsonl",
                        b'{"custom_id": "a", "method": "POST", '
                        b'"url": "/v1/chat/completions", "body": {"model": "tiny", '
                        b'"messages": [{"role": "user", "content": "hi"}]}}\nnot json',
                    )
                },
                data={"purpose": "batch"},
                headers=red,
            ).json()
            assert (
                client.post(
                    "/v1/batches",
                    headers=red,
                    json={"input_file_id": f["id"], "completion_window": "24h", "endpoint": "/v1/chat/completions"},
                ).status_code
                == 200
            )
            client.post(
                "/v1/chat/completions",
                headers=red,
                json={"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            )
        compact(tmp_path / "traces")
    finally:
        os.umask(old)
    root = tmp_path / "traces"
    loose = []
    for p in [root, *root.rglob("*")]:
        if p.name.endswith(".lock"):
            continue
        mode = stat.S_IMODE(p.stat().st_mode)
        if mode & 0o077:
            loose.append((str(p.relative_to(root)), oct(mode)))
    assert not loose, loose
    assert list(root.rglob("*.parquet")) and list(root.rglob("results-*.jsonl")) and (root / "spend.json").exists()


def test_threads_replacing_one_file_at_once_each_replace_it_whole(tmp_path):
    """20 requests waking a scaled-to-zero deployment refreshed the shared table at once: two
    threads wrote the same temporary name and the second rename failed (a 500 in CI)."""
    from concurrent.futures import ThreadPoolExecutor

    from serve.secret_files import write_private
    from traces.files import write_atomic

    table, secret = tmp_path / "deployments.json", tmp_path / "keys.json"

    def write(i: int) -> None:
        for _ in range(50):
            write_atomic(table, f'{{"writer": {i}}}'.encode())
            write_private(secret, f'{{"writer": {i}}}')

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, range(16)))  # re-raises what any writer raised
    assert table.read_text().startswith('{"writer": ') and secret.read_text().startswith('{"writer": ')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deployments.json", "keys.json"]  # no temporary left
