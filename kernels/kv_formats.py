"""KV-cache number formats as a round trip (quantise, then read back as fp32), for measuring what
each costs a model's outputs (deploy/bench/kv_accuracy.py).

Each tensor is one layer's keys or values for a batch, ``[..., head_dim]``; a row is one token's
head (``head_dim`` values), as the cache stores it.
- ``fp32``: untouched (the reference).
- ``bf16``: rounded to bfloat16.
- ``fp8``: e4m3 with one scale per tensor (its amax to 448), as vLLM's dynamic FP8 KV.
- ``nvfp4``: e2m1 codes in blocks of 16 along the row, an e4m3 scale per block (the amax rule)
  and an fp32 global scale per tensor: kernels/nvfp4.py, the format of the 352-byte MLA row.
- ``nvfp4-mse``: the same bytes, each block's scale searched for the smallest error.
"""

from __future__ import annotations

import torch

from kernels.nvfp4 import BLOCK, E4M3_MAX, dequantize, quantize

FORMATS = ("fp32", "bf16", "fp8", "nvfp4", "nvfp4-mse")


def round_trip(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x`` stored in ``fmt`` and read back, in ``x``'s dtype."""
    if fmt == "fp32":
        return x
    y = x.float()
    if fmt == "bf16":
        out = y.to(torch.bfloat16).float()
    elif fmt == "fp8":
        scale = torch.clamp(y.abs().max() / E4M3_MAX, min=1e-12)
        out = (y / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale
    elif fmt in ("nvfp4", "nvfp4-mse"):
        if y.shape[-1] % BLOCK:
            raise ValueError(f"NVFP4 needs rows of a multiple of {BLOCK} values; this model's have {y.shape[-1]}")
        out = dequantize(quantize(y, scale_rule="mse" if fmt == "nvfp4-mse" else "amax"))
    else:
        raise ValueError(f"unknown KV format {fmt!r} (known: {', '.join(FORMATS)})")
    return out.to(x.dtype)


def relative_error(x: torch.Tensor, stored: torch.Tensor) -> float:
    """||stored - x|| / ||x||: what storing ``x`` (as ``round_trip`` gave it back) cost."""
    x = x.float()
    return ((stored.float() - x).norm() / x.norm().clamp(min=1e-30)).item()
