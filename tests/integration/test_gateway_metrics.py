"""`/metrics` on Dynamo's mocker: time to first token and the gateway's added latency, per
deployment, one observation for each answered request and none for a refused one."""

from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration


def _histograms(url: str) -> dict[tuple[str, str, str], float]:
    """(metric, deployment, count|sum) -> value."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        if family.name in ("flywheel_ttft_seconds", "flywheel_added_latency_seconds"):
            for s in family.samples:
                if s.name.endswith(("_count", "_sum")):
                    out[(family.name, s.labels["deployment"], s.name.rsplit("_", 1)[1])] = s.value
    return out


def test_ttft_and_added_latency_are_observed_per_deployment(sim_stack):
    gw = sim_stack.resolved_gateway()
    url = f"http://{gw.host}:{gw.port}"
    before = _histograms(url)
    served = Counter()
    with httpx.Client(timeout=60) as http:
        for i in range(8):
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"count {i}"}],
                "max_tokens": 4,
                "stream": i % 2 == 0,
            }
            r = http.post(f"{url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            served[r.headers["x-deployment"]] += 1
        refused = http.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": []})
        assert refused.status_code == 400
    after = _histograms(url)

    def delta(metric: str, dep: str, kind: str) -> float:
        return after.get((metric, dep, kind), 0) - before.get((metric, dep, kind), 0)

    for dep, n in served.items():
        assert delta("flywheel_ttft_seconds", dep, "count") == n
        assert delta("flywheel_added_latency_seconds", dep, "count") == n
        # the gateway's part is a part: never more than the whole time to first token
        assert 0 < delta("flywheel_added_latency_seconds", dep, "sum") < delta("flywheel_ttft_seconds", dep, "sum")
    for metric, dep, kind in after:  # nothing for the refused request, or for a deployment not used
        if dep not in served:
            assert delta(metric, dep, kind) == 0
