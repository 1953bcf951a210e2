"""The store's Parquet tree works from an S3-compatible object store (moto's local server)."""

import pytest

from traces.compactor import compact_levels
from traces.housekeeping import data_files, partitions
from traces.object_store import connect, s3_filesystem, upload
from traces.store import TraceStore
from traces.writer import TraceWriter

moto_server = pytest.importorskip("moto.server")


@pytest.fixture
def s3():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    fs = s3_filesystem(f"http://{host}:{port}", access_key="test", secret_key="test", allow_bucket_creation=True)
    fs.create_dir("traces-bucket")
    yield fs
    server.stop()


def test_queries_over_s3_match_the_local_store(tmp_path, s3):
    writer = TraceWriter(tmp_path, "gw")
    for i in range(40):
        writer.submit(
            {
                "trace_id": f"tr-{i}",
                "team": f"t{i % 3}",
                "gen_ai_request_model": f"m{i % 2}",
                "http_status": 200,
                "gen_ai_usage_output_tokens": i,
                "completion_token_ids": [i],
            }
        )
    writer.close()
    assert upload(tmp_path, s3, "traces-bucket/prod") == 2
    q = "SELECT team, model, count(*) AS n, sum(gen_ai_usage_output_tokens) AS out FROM traces GROUP BY ALL ORDER BY ALL"
    remote = connect(s3, "traces-bucket/prod").sql(q).fetchall()
    local = TraceStore(tmp_path).con.sql(q).fetchall()
    assert remote == local and sum(r[2] for r in remote) == 40


def test_a_merges_inputs_kept_beside_its_output_are_not_uploaded_twice(tmp_path, s3):
    writer = TraceWriter(tmp_path, "gw", max_age_s=3600)
    for i in range(40):
        writer.write({"trace_id": f"tr-{i}", "gen_ai_request_model": "m", "completion_token_ids": [i]})
        if i % 10 == 9:
            writer.flush()  # four files of ten rows
    writer.close()
    (part,) = partitions(tmp_path)
    assert compact_levels(tmp_path, part, fanout=4)["files_out"] == 1  # its four inputs stay a while
    assert len(data_files(part)) == 5
    assert upload(tmp_path, s3, "traces-bucket/kept") == 1
    assert connect(s3, "traces-bucket/kept").sql("SELECT count(DISTINCT trace_id), count(*) FROM traces").fetchall() == [(40, 40)]
