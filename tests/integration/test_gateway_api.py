import json
import subprocess
import sys

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_bad_requests_through_the_real_stack_get_openai_shaped_4xx(gateway_url):
    cases = [
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        (b'{"model": "tiny", "messages": [', 400, None),
        ({"model": "tiny"}, 400, "messages"),
    ]
    for body, status, param in cases:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(f"{gateway_url}/v1/chat/completions", timeout=10, **kw)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param and r.json()["error"]["message"]


def test_models_lists_the_alias_with_its_checkpoint(openai_client):
    models = {m.id: m.model_dump() for m in openai_client.models.list()}
    assert models["tiny"]["checkpoint_version"]


def test_status_json_reports_each_component(stack):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.cli.main",
            "status",
            "--json",
            "--set",
            f"home={stack.home}",
            "--set",
            "gateway.port=18000",
            "--set",
            "frontend.port=18100",
            "--set",
            "worker.system_port_base=18200",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"event-broker", "frontend", "worker-0", "gateway", "supervisor"}
    assert all(r["healthy"] and r["pid"] for r in rows.values())
    assert rows["gateway"]["url"] == "http://127.0.0.1:18000"


def test_every_socket_of_the_stack_listens_on_loopback_only(stack):
    from tests.integration.conftest import exposed_listeners

    listening, exposed = exposed_listeners(stack)
    assert listening == {"event-broker", "frontend", "worker-0", "gateway"}
    assert not exposed, f"listening beyond loopback: {exposed}"
