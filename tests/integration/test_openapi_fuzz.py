"""schemathesis over the gateway's own /openapi.json, as a team and as the admin, against a real
(sim) deployment: no server error, and every 4xx in its route's error shape (OpenAI's; Anthropic's on
the Messages routes)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serve.keys import KeyStore

pytestmark = pytest.mark.integration


def fuzz(url: str, key: str, seed: int, workdir: Path) -> subprocess.CompletedProcess:
    st = Path(sys.executable).with_name("st")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "st_openai_shape", "PYTHONPATH": str(Path(__file__).parent), "NO_COLOR": "1"}
    return subprocess.run(
        [
            str(st),
            "run",
            f"{url}/openapi.json",
            "-H",
            f"Authorization: Bearer {key}",
            "--checks",
            "not_a_server_error,openai_error_shape",
            "--max-examples",
            "15",
            "--seed",
            str(seed),
            "--phases",
            "examples,coverage,fuzzing",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=workdir,
    )  # its cache goes there


@pytest.mark.parametrize("stream", [False, True])
def test_a_text_prompt_longer_than_the_context_is_400_on_the_mocker_too(sim_stack, stream):
    """Dynamo's mocker answers such a prompt with a bare 500 (an SSE error event when streamed).
    Before the fuzz runs: the admin's may delete the alias."""
    import httpx

    gw = sim_stack.resolved_gateway()
    r = httpx.post(
        f"http://{gw.host}:{gw.port}/v1/chat/completions",
        timeout=60,
        json={"model": "tiny", "messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 5, "stream": stream},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert str(sim_stack.worker.max_model_len) in err["message"]


@pytest.mark.parametrize("who", ["team", "admin"])
def test_fuzzing_every_route_finds_no_server_error_and_only_openai_shaped_errors(sim_stack, who, tmp_path):
    gw = sim_stack.resolved_gateway()
    key = gw.admin_key if who == "admin" else KeyStore(gw.keys_file).create("fuzzers")[1]
    out = fuzz(f"http://{gw.host}:{gw.port}", key, seed=7, workdir=tmp_path)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report[-4000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", report)
    assert cases and int(cases.group(1)) == int(cases.group(2)) > 500, report[-2000:]
    print(f"\n{who}: {cases.group(0)}")
