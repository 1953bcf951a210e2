"""Every route, thrown hostile bodies (deep nesting, huge arrays, odd unicode, wrong types): a 4xx
in the route's own error shape, never a 500; the gateway stays healthy and its memory bounded."""

import json

import pytest
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.conftest import seeded_gateway

ODD_TEXT = st.sampled_from(
    [
        "\u0000",
        "\ud800",
        "\udfff",
        "\u202e",
        "\ufeff",
        "é" * 10_000,
        "𝕏" * 1000,
        "<script>",
        "' OR '1'='1",
        "../../etc/passwd",
        "%00",
        "",
    ]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20), ODD_TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
KEYS = [
    "model",
    "messages",
    "prompt",
    "tools",
    "tool_choice",
    "max_tokens",
    "stream",
    "n",
    "nvext",
    "sql",
    "max_rows",
    "trace_id",
    "reward",
    "feedback",
    "input_file_id",
    "endpoint",
    "completion_window",
    "lora_name",
    "lora_path",
    "deployment",
    "token_ids",
    "sampling_params",
    "path",
    "key",
    "input",  # the Responses and Messages APIs'
    "instructions",
    "previous_response_id",
    "max_output_tokens",
    "system",
    "metadata",
]


def raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


HOSTILE = st.one_of(
    st.integers(500, 20_000).map(lambda d: b'{"model": ' + b"[" * d + b"]" * d + b"}"),  # deep
    st.integers(10_000, 200_000).map(lambda n: raw(json.dumps({"model": "tiny", "messages": [0] * n}))),  # huge
    st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6).map(lambda d: raw(json.dumps(d))),  # wrong types
    VALUES.map(lambda v: raw(json.dumps(v))),  # not an object
    st.binary(max_size=64),  # not JSON
    st.just(b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'),  # lone surrogate
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with seeded_gateway(tmp_path_factory.mktemp("hostile")) as found:
        yield found


def routes(app) -> list[tuple[str, str]]:
    out = []
    for r in app.routes:
        if isinstance(r, APIRoute):
            path = r.path_format.replace("{model_id}", "tiny").replace("{alias}", "tiny")
            path = path.split("{")[0] + "x" if "{" in path else path
            out += [(m, path) for m in sorted(r.methods) if m in ("POST", "PUT", "DELETE")]
    return out


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_every_route_answers_hostile_bodies_with_a_4xx_in_its_shape(gateway):
    client, keys = gateway
    targets = routes(client.app)
    assert ("POST", "/v1/chat/completions") in targets and ("POST", "/v1/traces/query") in targets
    before = rss_mb()
    seen: dict[int, int] = {}

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(target=st.sampled_from(targets), body=HOSTILE, who=st.sampled_from(["red", "admin", None]))
    def attack(target, body, who):
        method, path = target
        headers = {"Content-Type": "application/json"}
        if who:
            headers["Authorization"] = f"Bearer {keys[who]}"
        r = client.request(method, path, content=body, headers=headers)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code != 500, (method, path, body[:200], r.text[:300])
        if r.status_code >= 400 and not path.startswith("/ui"):
            err = r.json()["error"]
            assert isinstance(err, dict) and err["message"] and "type" in err, (method, path, r.text[:300])
            assert (r.json().get("type") == "error") == path.startswith("/v1/messages"), (path, r.text[:300])  # Anthropic's

    attack()
    print(f"\nstatuses: {dict(sorted(seen.items()))}; RSS {before:.0f} -> {rss_mb():.0f} MB")
    assert client.get("/health").status_code == 200
    after = client.post(
        "/v1/traces/query", json={"sql": "SELECT count(*) FROM traces"}, headers={"Authorization": f"Bearer {keys['red']}"}
    )
    # the seeded rows are all still there (a hostile body that happened to be a valid request adds one)
    assert after.status_code == 200 and after.json()["rows"][0][0] >= 4, after.text
    assert rss_mb() - before < 1024, "memory grew past a bound on hostile bodies"
