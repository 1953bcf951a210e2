"""Move one request's KV cache between two processes with NIXL (UCX on loopback), in both layouts.

    .venv/bin/python -m deploy.bench.kv_transfer [--tokens 16384] [--layers 61]

Each process holds a KV cache in host memory; the request's blocks sit scattered in it. The
destination READs them with the descriptors of ``kernels.kv_layout.transfer_plan``: LBHNC
(layer-major, 1,024-token blocks, one descriptor per layer and block) against BLHNC
(block-major, 64-token blocks, one descriptor per block). Bytes are checked after each run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import time

from kernels.kv_layout import CacheGeometry, request_blocks, transfer_plan


def _agent(name: str):
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _source(conn, nbytes: int, seed: int) -> None:
    import torch

    buf = torch.empty(nbytes, dtype=torch.uint8)
    buf.random_(generator=torch.Generator().manual_seed(seed))
    agent = _agent("src")
    agent.register_memory(agent.get_reg_descs(buf))
    conn.send((agent.get_agent_metadata(), buf.data_ptr()))
    conn.recv()  # wait until the destination is done
    conn.send(int(buf.sum()))


def run(layout: str, geom: CacheGeometry, src_blocks: list[int], dst_blocks: list[int]) -> dict:
    import torch

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    total = geom.layers * geom.num_blocks * geom.block_bytes
    proc = ctx.Process(target=_source, args=(child, total, 7))
    proc.start()
    src_meta, src_addr = parent.recv()
    dst = torch.zeros(total, dtype=torch.uint8)
    agent = _agent("dst")
    agent.register_memory(agent.get_reg_descs(dst))
    remote = agent.add_remote_agent(src_meta)
    plan = transfer_plan(geom, layout, src_blocks, dst_blocks)
    local = agent.get_xfer_descs([(dst.data_ptr() + d, n, 0) for _, d, n in plan], "DRAM")
    far = agent.get_xfer_descs([(src_addr + s, n, 0) for s, _, n in plan], "DRAM")
    t0 = time.perf_counter()
    handle = agent.initialize_xfer("READ", local, far, remote, b"kv")
    state = agent.transfer(handle)
    while state not in ("DONE", "ERR"):
        state = agent.check_xfer_state(handle)
    seconds = time.perf_counter() - t0
    moved = sum(n for _, _, n in plan)
    parent.send("done")
    parent.recv()
    proc.join()
    # check: what arrived equals what the source holds at those places (regenerated here)
    src = torch.empty(total, dtype=torch.uint8)
    src.random_(generator=torch.Generator().manual_seed(7))
    ok = all(torch.equal(dst[d : d + n], src[s : s + n]) for s, d, n in plan)
    agent.release_xfer_handle(handle)
    return {
        "layout": layout,
        "state": state,
        "descriptors": len(plan),
        "MiB": round(moved / 2**20, 1),
        "seconds": round(seconds, 4),
        "GiB_per_s": round(moved / seconds / 2**30, 2),
        "bytes_ok": ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=61)
    args = ap.parse_args()
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    rows = []
    for layout, block_tokens in (("LBHNC", 1024), ("BLHNC", 64)):
        n = request_blocks(args.tokens, block_tokens)
        geom = CacheGeometry(layers=args.layers, num_blocks=n * 5 // 4 + 1, block_tokens=block_tokens)
        rng = random.Random(0)
        rows.append(run(layout, geom, rng.sample(range(geom.num_blocks), n), rng.sample(range(geom.num_blocks), n)))
    print(json.dumps({"tokens": args.tokens, "layers": args.layers, "row_bytes": 576, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
