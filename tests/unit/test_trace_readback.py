"""A million records through a gateway's writer (spool, mover process, Parquet) read back exactly:
every id once, every token id and logprob as it was submitted."""

import numpy as np
import pyarrow.compute as pc

from traces.store import TraceStore
from traces.writer import TraceWriter

ROWS = 1_000_000


def expected(i: np.ndarray) -> dict[str, np.ndarray]:
    """What row ``i`` carries, as flat arrays (3 prompt tokens, 2 completion tokens each)."""
    return {
        "prompt_new_token_ids": np.stack([i, i + 1, i + 2], axis=1).ravel().astype(np.int32),
        "completion_token_ids": np.stack([i % 151_936, (i * 7) % 151_936], axis=1).ravel().astype(np.int32),
        # float32 values whose float64 (what a gateway hands over) rounds to themselves
        "completion_logprobs": np.stack([-(i % 1000) / 64, -(i % 7) / 8], axis=1).ravel().astype(np.float32),
    }


def test_a_million_ingested_rows_read_back_exactly(tmp_path):
    writer = TraceWriter(tmp_path, "gw", max_batch=100_000, mover="process")
    want = expected(np.arange(ROWS, dtype=np.int64))
    prompt = want["prompt_new_token_ids"].reshape(ROWS, 3).tolist()
    completion = want["completion_token_ids"].reshape(ROWS, 2).tolist()
    logprobs = want["completion_logprobs"].astype(np.float64).reshape(ROWS, 2).tolist()
    ticket = 0
    for i in range(ROWS):
        ticket = writer.submit(
            {
                "trace_id": f"tr-{i:07d}",
                "team": "red",
                "gen_ai_request_model": "tiny",
                "prompt_token_ids": prompt[i],
                "completion_token_ids": completion[i],
                "completion_logprobs": logprobs[i],
                "http_status": 200,
            }
        )
    writer.wait_durable(ticket, timeout=None)
    assert writer.flush(timeout=600) == 0
    writer.close()

    table = TraceStore(tmp_path).sql(
        "SELECT trace_id, prompt_new_token_ids, completion_token_ids, completion_logprobs FROM traces ORDER BY trace_id"
    )
    assert table.num_rows == ROWS
    ids = table.column("trace_id").combine_chunks()
    assert pc.all(pc.equal(ids, [f"tr-{i:07d}" for i in range(ROWS)])).as_py()
    for name, flat in want.items():
        column = table.column(name).combine_chunks()
        assert pc.all(pc.equal(pc.list_value_length(column), len(flat) // ROWS)).as_py(), name
        got = column.flatten().to_numpy()
        assert got.dtype == flat.dtype and np.array_equal(got, flat), name
