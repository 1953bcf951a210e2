"""Our top-level `kernels` and `envs` share names with unrelated PyPI packages; importing ours
must not break the libraries that probe for those names."""

import os
import subprocess
import sys
from pathlib import Path

from deploy.stack.config import load_config
from deploy.stack.launcher import components

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import kernels, envs
assert kernels.__file__.startswith(ROOT), kernels.__file__
assert envs.__file__.startswith(ROOT), envs.__file__
import transformers
from transformers.utils import is_kernels_available
assert not is_kernels_available(), "transformers mistook our kernels/ for hub kernels"
import transformers.integrations.hub_kernels
from transformers import AutoModelForCausalLM
import vllm
from vllm import envs as vllm_envs
assert vllm_envs.__name__ == "vllm.envs"
from vllm.entrypoints.openai import api_server
print("ok")
"""


def test_our_kernels_and_envs_packages_do_not_break_transformers_or_vllm():
    out = subprocess.run(
        [sys.executable, "-c", f"ROOT = {str(ROOT)!r}\n" + PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def _agent_delay(variant: str, env: dict) -> int:
    """The pthrDelay a NIXL agent of ``variant`` is created with, read from inside the wrapper
    (its native agent replaced by one that records its config)."""
    code = f"""
import {variant}._api as api
seen = []
api.nixlBind.nixlAgent = lambda name, config: seen.append(config.pthrDelay) or (_ for _ in ()).throw(SystemExit)
try:
    api.nixl_agent("probe")
except SystemExit:
    pass
print(seen[0])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


def test_nixl_progress_threads_wait_instead_of_spinning():
    """Every installed NIXL variant's agents get a non-zero pthrDelay (deploy/engine/patches.py), or an
    idle P/D worker busy-polls a core and its discovery registration lapses; the workers'
    `worker.nixl_progress_delay_us` reaches it."""
    import importlib.util

    variants = [v for v in ("nixl_cu12", "nixl_cu13") if importlib.util.find_spec(v)]
    assert variants, "no NIXL variant installed (the P/D profile needs one)"
    for variant in variants:
        assert _agent_delay(variant, {}) == 100_000, variant
        assert _agent_delay(variant, {"NIXL_PTHR_DELAY_US": "2500"}) == 2500, variant
    cfg = load_config("local-pd", [], environ={})
    worker = next(c for c in components(cfg) if c.name == "worker-0")
    assert worker.env["NIXL_PTHR_DELAY_US"] == str(cfg.worker.nixl_progress_delay_us) == "100000"
