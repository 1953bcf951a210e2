"""schemathesis over the gateway's own /openapi.json, as a team and as the admin, against a real
(sim) deployment: no server error, and every 4xx in the OpenAI error shape."""

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
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "st_openai_shape",
           "PYTHONPATH": str(Path(__file__).parent), "NO_COLOR": "1"}
    return subprocess.run(
        [str(st), "run", f"{url}/openapi.json", "-H", f"Authorization: Bearer {key}",
         "--checks", "not_a_server_error,openai_error_shape", "--max-examples", "15", "--seed", str(seed),
         "--phases", "examples,coverage,fuzzing"],
        capture_output=True, text=True, timeout=600, env=env, cwd=workdir)  # its cache goes there


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
