"""How many tokens a decoder's KV memory holds, per row format.

``tokens = floor(kv_bytes / (layers * bytes_per_token_per_layer))``, where a token's bytes per
layer are the MLA row (576 FP8, 352 NVFP4) plus whatever else the model caches per token and
layer (e.g. a sparse-attention indexer key), which compression does not touch.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.mla_row import FP8_ROW_BYTES, ROW_BYTES

# vLLM's `fp8_ds_mla` (DeepSeek-V3.2 sparse MLA): 512 FP8 latent values, 4 fp32 scales (one per
# 128) and the 64-value rope part left in bf16 = 656 bytes; its `nvfp4_ds_mla` is our 352-byte row
FP8_DS_MLA_ROW_BYTES = 512 + 4 * 4 + 64 * 2
FORMATS = {"fp8": FP8_ROW_BYTES, "fp8_ds_mla": FP8_DS_MLA_ROW_BYTES, "nvfp4": ROW_BYTES}


@dataclass(frozen=True)
class DecoderMemory:
    kv_bytes: float  # memory left for the KV cache on one decoder (after weights etc.)
    layers: int
    extra_bytes_per_layer: int = 0  # per token, uncompressed state beside the MLA row


def cached_tokens(mem: DecoderMemory, fmt: str) -> int:
    if fmt not in FORMATS:
        raise ValueError(f"unknown KV format {fmt!r}; one of {sorted(FORMATS)}")
    return int(mem.kv_bytes // (mem.layers * (FORMATS[fmt] + mem.extra_bytes_per_layer)))


def capacity_report(mem: DecoderMemory, baseline: str = "fp8") -> dict:
    fp8, fp4 = cached_tokens(mem, baseline), cached_tokens(mem, "nvfp4")
    return {f"{baseline}_tokens": fp8, "nvfp4_tokens": fp4, "gain": round(fp4 / fp8, 3)}
