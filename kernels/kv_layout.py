"""KV-cache layouts and the transfer plan for moving one request's blocks between two caches.

Two layouts of the same cache ``[layers, blocks, heads, tokens-per-block, channels]``:

- LBHNC (layer-major, what vLLM allocates per layer): one block of one layer is contiguous, so a
  request costs ``layers x blocks`` descriptors (fewer where its block ids are adjacent);
- BLHNC (block-major): one block of *all* layers is contiguous, so the same request costs
  ``blocks`` descriptors, each ``layers`` times larger.

A descriptor is ``(src_offset, dst_offset, nbytes)``; adjacent descriptors that are contiguous
on both sides are merged (what NIXL's prepped transfers would do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Layout = Literal["LBHNC", "BLHNC"]


@dataclass(frozen=True)
class CacheGeometry:
    layers: int
    num_blocks: int
    block_tokens: int
    heads: int = 1  # MLA: one latent "head" per token
    row_bytes: int = 576  # bytes per token per head per layer (576 FP8 MLA, 352 NVFP4)

    @property
    def block_bytes(self) -> int:
        """One block of one layer."""
        return self.heads * self.block_tokens * self.row_bytes

    def offset(self, layout: Layout, layer: int, block: int) -> int:
        if layout == "LBHNC":
            return (layer * self.num_blocks + block) * self.block_bytes
        return (block * self.layers + layer) * self.block_bytes


def transfer_plan(
    geom: CacheGeometry, layout: Layout, src_blocks: list[int], dst_blocks: list[int]
) -> list[tuple[int, int, int]]:
    """Descriptors moving the request's blocks (``src_blocks[i]`` -> ``dst_blocks[i]``)."""
    if len(src_blocks) != len(dst_blocks):
        raise ValueError("source and destination need the same number of blocks")
    raw = []
    if layout == "LBHNC":
        for layer in range(geom.layers):
            for s, d in zip(src_blocks, dst_blocks):
                raw.append((geom.offset(layout, layer, s), geom.offset(layout, layer, d), geom.block_bytes))
    else:
        for s, d in zip(src_blocks, dst_blocks):  # all layers of a block in one piece
            raw.append((geom.offset(layout, 0, s), geom.offset(layout, 0, d), geom.block_bytes * geom.layers))
    merged: list[tuple[int, int, int]] = []
    for src, dst, n in raw:
        if merged and merged[-1][0] + merged[-1][2] == src and merged[-1][1] + merged[-1][2] == dst:
            merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + n)
        else:
            merged.append((src, dst, n))
    return merged


def request_blocks(tokens: int, block_tokens: int) -> int:
    return -(-tokens // block_tokens)


def descriptor_counts(tokens: int, layers: int, row_bytes: int = 576) -> dict:
    """The worst case (every block id scattered) for a request of ``tokens`` tokens:
    LBHNC with 1,024-token blocks vs BLHNC with 64-token blocks."""
    lb, bb = request_blocks(tokens, 1024), request_blocks(tokens, 64)
    return {
        "tokens": tokens,
        "layers": layers,
        "LBHNC_1024": {"blocks": lb, "descriptors": layers * lb, "bytes_each": 1024 * row_bytes},
        "BLHNC_64": {"blocks": bb, "descriptors": bb, "bytes_each": 64 * row_bytes * layers},
    }
