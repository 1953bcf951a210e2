"""Our top-level `kernels` and `envs` share names with unrelated PyPI packages; importing ours
must not break the libraries that probe for those names."""

import subprocess
import sys
from pathlib import Path

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
    out = subprocess.run([sys.executable, "-c", f"ROOT = {str(ROOT)!r}\n" + PROBE], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_nixl_progress_threads_wait_instead_of_spinning():
    """Every installed NIXL variant's agents get a non-zero pthrDelay (deploy/patches.py), or an
    idle P/D worker busy-polls a core and its discovery registration lapses."""
    import importlib.util

    found = 0
    for variant in ("nixl_cu12", "nixl_cu13"):
        spec = importlib.util.find_spec(variant)
        if spec is None:
            continue
        source = Path(spec.submodule_search_locations[0], "_api.py").read_text()
        assert "agent_config.pthrDelay = 0\n" not in source, f"{variant} still busy-polls"
        assert "agent_config.pthrDelay = 100000" in source, variant
        found += 1
    assert found, "no NIXL variant installed (the P/D profile needs one)"
