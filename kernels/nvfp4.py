"""NVFP4 quantisation, reference implementation in torch (runs on CPU).

NVFP4: 4-bit e2m1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} x sign, one FP8 e4m3 scale per block of
16 values, one fp32 global scale per tensor. Two codes share a byte, the even element in the low
nibble (the layout CUTLASS/FlashInfer use). The global scale maps the tensor's largest
magnitude to the top of the range (6 x 448), so every block scale fits e4m3.

torch has ``float4_e2m1fn_x2`` only as a storage type on CPU (``.to()`` raises), so the codes
are computed and packed by hand here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 16
E2M1_MAX, E4M3_MAX = 6.0, 448.0
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# midpoints between neighbouring magnitudes: a value rounds to the code above when it passes one
_E2M1_BOUNDS = (E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2


@dataclass(frozen=True)
class NVFP4Tensor:
    packed: torch.Tensor  # uint8 [..., n / 2]: two e2m1 codes per byte
    scales: torch.Tensor  # uint8 [..., n / 16]: e4m3 bits of each block's scale
    global_scale: torch.Tensor  # fp32 scalar
    shape: tuple[int, ...]


def _check_finite(x: torch.Tensor) -> None:
    if not torch.isfinite(x).all():
        bad = "NaN" if torch.isnan(x).any() else "infinity"
        raise ValueError(f"NVFP4 cannot represent {bad}; refusing to quantise")


def global_scale_for(x: torch.Tensor) -> torch.Tensor:
    amax = x.abs().max().float()
    return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones(()))


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 code (ties to the even code) of values already divided by their scale."""
    mag = v.abs().clamp(max=E2M1_MAX)
    idx = torch.bucketize(mag, _E2M1_BOUNDS.to(v.device), right=False)
    # bucketize puts an exact midpoint in the lower bucket; ties go to the even code instead
    tie = (mag == _E2M1_BOUNDS.to(v.device)[(idx).clamp(max=6)]) & (idx < 7)
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)
    sign = ((v < 0) & (idx > 0)).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    vals = E2M1_VALUES.to(codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -vals, vals)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Tensor:
    """Quantise along the last dimension (a multiple of 16)."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of {BLOCK}")
    _check_finite(x)
    x = x.float()
    g = global_scale_for(x) if global_scale is None else global_scale.float()
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    block_scale = (blocks.abs().amax(-1) / E2M1_MAX / g).clamp(max=E4M3_MAX)
    scale_fp8 = block_scale.to(torch.float8_e4m3fn)
    eff = scale_fp8.float() * g
    safe = torch.where(eff > 0, eff, torch.ones_like(eff))
    codes = e2m1_codes(blocks / safe.unsqueeze(-1))
    codes = torch.where((eff > 0).unsqueeze(-1), codes, torch.zeros_like(codes))
    return NVFP4Tensor(pack_nibbles(codes.reshape(x.shape)), scale_fp8.view(torch.uint8), g, tuple(x.shape))


def dequantize(q: NVFP4Tensor) -> torch.Tensor:
    # value x block scale is exact in fp32 (2 + 4 mantissa bits); the global scale comes last,
    # so each element is rounded once, as FlashInfer's dequantisation does (bit for bit, tested)
    codes = unpack_nibbles(q.packed)
    scales = q.scales.view(torch.float8_e4m3fn).float()
    vals = e2m1_decode(codes).reshape(*q.shape[:-1], -1, BLOCK) * scales.unsqueeze(-1)
    return (vals * q.global_scale).reshape(q.shape)
