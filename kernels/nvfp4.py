"""NVFP4 quantisation, reference implementation in torch (runs on CPU).

NVFP4: 4-bit e2m1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} x sign, one FP8 e4m3 scale per block of
16 values, one fp32 global scale per tensor. Two codes share a byte, the even element in the low
nibble (the layout CUTLASS/FlashInfer use). The global scale maps the tensor's largest
magnitude to the top of the range (6 x 448), so every block scale fits e4m3.

torch has ``float4_e2m1fn_x2`` only as a storage type on CPU (``.to()`` raises), so the codes
are computed and packed by hand here.

Two rules choose a block's scale, in the same bytes (dequantisation does not know which):
``amax`` maps the block's largest magnitude to 6, as the hardware's own conversion does;
``mse`` tries the e4m3 scales from ``SEARCH_CODES`` codes below the amax one to as many above
and keeps the one whose rounded block is closest to the original (a smaller scale clips the
largest value but resolves the rest finer; a larger one spares a large outlier's neighbours).
Measured on standard-normal data (deploy/bench/nvfp4_scales.py): relative error 0.0951 (amax)
-> 0.0813 (mse, 17 scales). Every e4m3 scale tried on every block finds none closer (tested), so
0.081 is this format's floor on that data; exact fp32 block scales would give 0.078.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

BLOCK = 16
SEARCH_CODES = 8  # the mse rule tries the amax scale's e4m3 code +- this many
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


ScaleRule = Literal["amax", "mse"]


def round_blocks(blocks: torch.Tensor, g: torch.Tensor, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``blocks`` [..., 16] under the e4m3 block scales ``bits`` [...] (x the global scale ``g``):
    each value's nearest code, and each block's squared error once read back."""
    return round_under(blocks, bits.view(torch.float8_e4m3fn).float() * g)


def round_under(blocks: torch.Tensor, eff: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``blocks`` [..., 16] under the real scales ``eff`` [...] (0: the block reads back as 0):
    each value's nearest code, and each block's squared error once read back."""
    safe = torch.where(eff > 0, eff, torch.ones_like(eff))
    codes = e2m1_codes(blocks / safe.unsqueeze(-1))
    codes = torch.where((eff > 0).unsqueeze(-1), codes, torch.zeros_like(codes))
    return codes, ((e2m1_decode(codes) * eff.unsqueeze(-1) - blocks) ** 2).sum(-1)


def quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None, scale_rule: ScaleRule = "amax") -> NVFP4Tensor:
    """Quantise along the last dimension (a multiple of 16), each block's scale chosen by ``scale_rule``."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of {BLOCK}")
    if scale_rule not in ("amax", "mse"):
        raise ValueError(f"scale_rule must be amax or mse, not {scale_rule!r}")
    _check_finite(x)
    x = x.float().contiguous()
    g = global_scale_for(x) if global_scale is None else global_scale.float()
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    amax_bits = (blocks.abs().amax(-1) / E2M1_MAX / g).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)

    def rounded(off: int):
        """The block scale ``off`` e4m3 codes from the amax one, and the codes under it."""
        # positive e4m3 codes are ordered as their values; 0x7E is 448, 0x7F NaN; a zero block stays 0
        bits = torch.where(amax_bits == 0, amax_bits, (amax_bits.int() + off).clamp(1, 0x7E).to(torch.uint8))
        return bits, *round_blocks(blocks, g, bits)

    best_bits, best_codes, best_err = rounded(0)
    if scale_rule == "mse":  # another scale replaces the amax one only where strictly closer
        for off in (o for o in range(-SEARCH_CODES, SEARCH_CODES + 1) if o):
            bits, codes, err = rounded(off)
            closer = err < best_err
            best_bits = torch.where(closer, bits, best_bits)
            best_codes = torch.where(closer.unsqueeze(-1), codes, best_codes)
            best_err = torch.where(closer, err, best_err)
    return NVFP4Tensor(pack_nibbles(best_codes.reshape(x.shape)), best_bits, g, tuple(x.shape))


def dequantize(q: NVFP4Tensor) -> torch.Tensor:
    # value x block scale is exact in fp32 (2 + 4 mantissa bits); the global scale comes last,
    # so each element is rounded once, as FlashInfer's dequantisation does (bit for bit, tested)
    codes = unpack_nibbles(q.packed)
    scales = q.scales.view(torch.float8_e4m3fn).float()
    vals = e2m1_decode(codes).reshape(*q.shape[:-1], -1, BLOCK) * scales.unsqueeze(-1)
    return (vals * q.global_scale).reshape(q.shape)
