"""Sparse MLA decode straight from compressed rows: the torch reference and a Triton kernel.

For each query token ``t`` and head ``h``, attention runs over the rows ``indices[t, :]`` picks
from the cache (up to 2,048; ``-1`` marks an empty slot, which is skipped, never read as row 0):

    score[j] = scale * (q_latent . k_latent[j] + q_rope . k_rope[j])
    out[t, h] = softmax(score) @ k_latent          (MLA: the latent is also the value)

Rows are the 352-byte NVFP4/FP8 format of ``kernels.mla_row``; accumulation is fp32. The
Triton kernel unpacks the rows on chip (nibbles -> e2m1 by arithmetic, e4m3 scale bits decoded
by arithmetic, no lookup through memory) and runs an online softmax over blocks of indices.
On CPU it runs under ``TRITON_INTERPRET=1`` for correctness; ``deploy/bench/kernels_gpu.py``
checks and times it on a GPU.
"""

from __future__ import annotations

import torch

from kernels.mla_row import LATENT, LATENT_BYTES, ROPE, SCALE_BYTES, MLARows, unpack_rows


def sparse_mla_decode_reference(q: torch.Tensor, rows: MLARows, indices: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """q [T, H, 576], indices [T, K] int (-1 = empty) -> out [T, H, 512] fp32."""
    kv = unpack_rows(rows)  # [N, 576] fp32
    valid = indices >= 0  # [T, K]
    picked = kv[indices.clamp(min=0).long()]  # [T, K, 576] (row 0 for -1, masked below)
    scores = torch.einsum("thc,tkc->thk", q.float(), picked) * softmax_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # a token with no valid row attends to nothing
    return torch.einsum("thk,tkc->thc", probs, picked[..., :LATENT])


try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with the CPU torch wheel here
    triton = None

if triton is not None:

    @triton.jit
    def _e4m3_to_f32(bits):
        # e4m3fn: sign | 4-bit exponent (bias 7) | 3-bit mantissa; exponent 0 = subnormal
        b = bits.to(tl.int32)
        sign = tl.where((b & 0x80) != 0, -1.0, 1.0)
        exp = (b >> 3) & 0xF
        man = (b & 0x7).to(tl.float32)
        normal = (1.0 + man / 8.0) * tl.exp2((exp - 7).to(tl.float32))
        sub = (man / 8.0) * 0.015625  # 2^-6
        return sign * tl.where(exp == 0, sub, normal)

    @triton.jit
    def _e2m1_to_f32(code):
        c = code.to(tl.int32)
        mag_code = c & 7
        exp = mag_code >> 1
        man = (mag_code & 1).to(tl.float32)
        mag = tl.where(exp == 0, man * 0.5, (1.0 + man * 0.5) * tl.exp2((exp - 1).to(tl.float32)))
        return tl.where((c & 8) != 0, -mag, mag)

    @triton.jit
    def _sparse_mla_kernel(
        q_ptr,
        rows_ptr,
        idx_ptr,
        out_ptr,
        latent_scale,
        rope_scale,
        softmax_scale,
        H,
        K,
        ROW_BYTES: tl.constexpr,
        LAT: tl.constexpr,
        ROPE_DIM: tl.constexpr,
        LAT_BYTES: tl.constexpr,
        SCALE_OFF: tl.constexpr,
        ROPE_OFF: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        t = tl.program_id(0)
        h = tl.program_id(1)
        lat = tl.arange(0, LAT)
        rope = tl.arange(0, ROPE_DIM)
        q_base = q_ptr + (t * H + h) * (LAT + ROPE_DIM)
        q_lat = tl.load(q_base + lat).to(tl.float32)
        q_rope = tl.load(q_base + LAT + rope).to(tl.float32)
        m_i = -float("inf")
        l_i = 0.0
        acc = tl.zeros([LAT], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            idx = tl.load(idx_ptr + t * K + ks, mask=ks < K, other=-1)
            valid = idx >= 0
            row = tl.where(valid, idx, 0).to(tl.int64) * ROW_BYTES
            # latent: byte lat // 2, low nibble for even elements
            byte = tl.load(rows_ptr + row[:, None] + (lat // 2)[None, :], mask=valid[:, None], other=0)
            code = tl.where((lat % 2 == 0)[None, :], byte & 0xF, byte >> 4)
            sbits = tl.load(rows_ptr + row[:, None] + SCALE_OFF + (lat // 16)[None, :], mask=valid[:, None], other=0)
            k_lat = _e2m1_to_f32(code) * _e4m3_to_f32(sbits) * latent_scale
            rbits = tl.load(rows_ptr + row[:, None] + ROPE_OFF + rope[None, :], mask=valid[:, None], other=0)
            k_rope = _e4m3_to_f32(rbits) * rope_scale
            s = (tl.sum(k_lat * q_lat[None, :], axis=1) + tl.sum(k_rope * q_rope[None, :], axis=1)) * softmax_scale
            s = tl.where(valid, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            p = tl.where(valid, tl.exp(s - m_safe), 0.0)
            alpha = tl.where(m_i == -float("inf"), 0.0, tl.exp(m_i - m_safe))
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * k_lat, axis=0)
            m_i = m_new
        out = tl.where(l_i > 0, acc / l_i, 0.0)
        tl.store(out_ptr + (t * H + h) * LAT + lat, out)


def sparse_mla_decode_triton(
    q: torch.Tensor, rows: MLARows, indices: torch.Tensor, softmax_scale: float, block_k: int = 32
) -> torch.Tensor:
    """Same contract as the reference; q, rows and indices on one device (CPU: TRITON_INTERPRET=1)."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    T, H, C = q.shape
    assert C == LATENT + ROPE
    out = torch.empty(T, H, LATENT, dtype=torch.float32, device=q.device)
    _sparse_mla_kernel[(T, H)](
        q.contiguous(),
        rows.data.contiguous(),
        indices.to(torch.int32).contiguous(),
        out,
        float(rows.latent_scale),
        float(rows.rope_scale),
        float(softmax_scale),
        H,
        indices.shape[1],
        ROW_BYTES=rows.data.shape[1],
        LAT=LATENT,
        ROPE_DIM=ROPE,
        LAT_BYTES=LATENT_BYTES,
        SCALE_OFF=LATENT_BYTES,
        ROPE_OFF=LATENT_BYTES + SCALE_BYTES,
        BLOCK_K=block_k,
    )
    return out
