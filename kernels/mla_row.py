"""The compressed MLA KV row: 512 latent values in NVFP4 plus the 64-value RoPE part in FP8.

Per token and layer, MLA caches one 576-value row (512 latent + 64 rope). Stored as FP8 that is
576 bytes; here it is 352:

    bytes   0..255  latent e2m1 codes, two per byte (512 values)
    bytes 256..287  latent block scales, e4m3 (one per 16 values)
    bytes 288..351  rope values, e4m3

with two fp32 scales per cache (latent global scale, rope scale) kept beside the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.nvfp4 import BLOCK, E4M3_MAX, NVFP4Tensor, ScaleRule, _check_finite, dequantize, quantize

LATENT, ROPE = 512, 64
LATENT_BYTES, SCALE_BYTES, ROPE_BYTES = LATENT // 2, LATENT // BLOCK, ROPE
ROW_BYTES = LATENT_BYTES + SCALE_BYTES + ROPE_BYTES  # 352
FP8_ROW_BYTES = LATENT + ROPE  # 576


@dataclass(frozen=True)
class MLARows:
    data: torch.Tensor  # uint8 [n, 352]
    latent_scale: torch.Tensor  # fp32 scalar (NVFP4 global scale)
    rope_scale: torch.Tensor  # fp32 scalar


def pack_rows(
    kv: torch.Tensor,
    latent_scale: torch.Tensor | None = None,
    rope_scale: torch.Tensor | None = None,
    scale_rule: ScaleRule = "amax",
) -> MLARows:
    """[n, 576] (latent then rope) -> [n, 352] bytes; ``scale_rule``: how each latent block's
    scale is chosen (kernels/nvfp4.py), the bytes' layout the same either way."""
    if kv.shape[-1] != LATENT + ROPE:
        raise ValueError(f"an MLA row has {LATENT + ROPE} values, got {kv.shape[-1]}")
    _check_finite(kv)
    q = quantize(kv[:, :LATENT], latent_scale, scale_rule)
    rope = kv[:, LATENT:].float()
    rs = rope_scale if rope_scale is not None else torch.clamp(rope.abs().max() / E4M3_MAX, min=1e-12)
    rope_fp8 = (rope / rs).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    data = torch.cat([q.packed, q.scales, rope_fp8], dim=-1).contiguous()
    assert data.shape[-1] == ROW_BYTES
    return MLARows(data, q.global_scale, rs.float())


def unpack_rows(rows: MLARows) -> torch.Tensor:
    """[n, 352] bytes -> [n, 576] fp32."""
    d = rows.data
    q = NVFP4Tensor(d[:, :LATENT_BYTES], d[:, LATENT_BYTES : LATENT_BYTES + SCALE_BYTES], rows.latent_scale, (d.shape[0], LATENT))
    rope = d[:, LATENT_BYTES + SCALE_BYTES :].contiguous().view(torch.float8_e4m3fn).float() * rows.rope_scale
    return torch.cat([dequantize(q), rope], dim=-1)
