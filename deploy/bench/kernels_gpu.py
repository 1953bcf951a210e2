"""Check and time the kernels on a GPU (one short call on a lent accelerator).

    python -m deploy.bench.kernels_gpu            # needs CUDA + triton; prints one JSON object

Correctness: NVFP4 rows (either scale rule) are packed on the GPU exactly as on the CPU
reference, and the Triton sparse-MLA decode matches the torch reference. Timings (CUDA events,
median of 20): packing rows by the amax rule and by the mse rule's search, and the sparse decode
at 15 / 20 / 35 query tokens over 2,048 selected rows per token, next to the same attention on
FP8 rows (decode after an FP8 -> fp32 upcast in torch).
"""

from __future__ import annotations

import json
import statistics

import torch

from kernels.mla_row import pack_rows
from kernels.sparse_mla import sparse_mla_decode_reference, sparse_mla_decode_triton


def timed(fn, reps: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)


def main() -> None:
    assert torch.cuda.is_available(), "no GPU: run the CPU tests instead"
    dev = "cuda"
    torch.manual_seed(0)
    n_rows, heads, k = 200_000, 16, 2048
    kv = torch.randn(n_rows, 576, device=dev)
    rows = pack_rows(kv)
    cpu_rows = pack_rows(kv.cpu(), rows.latent_scale.cpu(), rows.rope_scale.cpu())
    result = {
        "device": torch.cuda.get_device_name(),
        "rows_bitexact_vs_cpu": bool(torch.equal(rows.data.cpu(), cpu_rows.data)),
        "quantize_ms_200k_rows": timed(lambda: pack_rows(kv, rows.latent_scale, rows.rope_scale)),
        # the mse rule's 17 roundings, on the cache's write path if a deployment chose it
        "mse_rows_bitexact_vs_cpu": bool(
            torch.equal(
                pack_rows(kv, rows.latent_scale, rows.rope_scale, "mse").data.cpu(),
                pack_rows(kv.cpu(), cpu_rows.latent_scale, cpu_rows.rope_scale, "mse").data,
            )
        ),
        "quantize_mse_ms_200k_rows": timed(lambda: pack_rows(kv, rows.latent_scale, rows.rope_scale, "mse")),
    }
    fp8 = kv.to(torch.float8_e4m3fn)
    for t in (15, 20, 35):
        q = torch.randn(t, heads, 576, device=dev)
        idx = torch.randint(0, n_rows, (t, k), device=dev, dtype=torch.int32)
        idx[:, -100:] = -1
        ref = sparse_mla_decode_reference(q, rows, idx, 0.04)
        tri = sparse_mla_decode_triton(q, rows, idx, 0.04, block_k=64)

        def fp8_path():
            picked = fp8[idx.clamp(min=0).long()].float()
            s = torch.einsum("thc,tkc->thk", q, picked) * 0.04
            s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
            return torch.einsum("thk,tkc->thc", torch.softmax(s, -1), picked[..., :512])

        result[f"decode_{t}_tokens"] = {
            "max_abs_err_vs_reference": float((tri - ref).abs().max()),
            "nvfp4_triton_ms": timed(lambda: sparse_mla_decode_triton(q, rows, idx, 0.04, block_k=64)),
            "fp8_torch_ms": timed(fp8_path),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
