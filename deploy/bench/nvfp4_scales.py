"""How close each way of choosing NVFP4's block scales comes to the data, in the same bytes,
side by side on the same rows (the 512 latent values of an MLA row: kernels/nvfp4.py):

    .venv/bin/python -m deploy.bench.nvfp4_scales [--rows 4096] [--seed 0]

- ``amax``: the block's largest value mapped to 6, as the hardware's conversion does;
- ``mse``: the rule the cache can use (``scale_rule="mse"``): the 17 e4m3 scales around amax's;
- ``every e4m3 scale``: each block's best of all 126 positive e4m3 scales. No choice of block
  scales stored in these bytes can do better: this is the format's floor on the data;
- ``mse, global scale swept``: the mse rule under the global scale x 2^(k/16), k = -8..8, the
  best of them (the global scale places every block on the e4m3 grid at once);
- ``e4m3 and one more bit``: each block's best scale on a grid one mantissa bit finer than
  e4m3's (its values and the midpoints between neighbours), as if the scale byte's sign bit,
  unused since scales are positive, were spent so. No NVFP4 reader (FlashInfer's, the
  hardware's) decodes that: what such a change to the format would reach, for the team to weigh;
- ``fp32 block scales``: each block's best real scale (steps of 2^(1/128) around amax's), which
  no e4m3 byte holds: what the e4m3 grid of scales costs, not a rule the cache could use.

Rows: standard normal (the figure the issue gives: amax 0.095), and Student-t with 3 degrees of
freedom (outliers, as real keys have). Relative error is ||read back - x|| / ||x||.
"""

from __future__ import annotations

import argparse
import time

import torch

from kernels.nvfp4 import BLOCK, E2M1_MAX, dequantize, global_scale_for, quantize, round_under

# the positive finite e4m3 values, in order (0x7F is NaN)
E4M3_VALUES = torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def relative(x: torch.Tensor, block_errors: torch.Tensor) -> float:
    return (block_errors.sum().sqrt() / x.norm()).item()


def rule_error(x: torch.Tensor, rule: str, g: torch.Tensor | None = None) -> float:
    return ((dequantize(quantize(x, g, rule)) - x).norm() / x.norm()).item()


def blocks_of(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], -1, BLOCK)


def least_error(x: torch.Tensor, scales) -> float:
    """``x``'s relative error when each block reads back under whichever of ``scales`` (each a
    tensor of real block scales) comes closest to it."""
    blocks, best = blocks_of(x), None
    for eff in scales:
        err = round_under(blocks, eff)[1]
        best = err if best is None else torch.minimum(best, err)
    return relative(x, best)


def on_grid(x: torch.Tensor, values: torch.Tensor):
    """Every block of ``x`` under each of ``values`` (x its global scale), one at a time."""
    g, shape = global_scale_for(x), blocks_of(x).shape[:-1]
    return (torch.full(shape, v) * g for v in values.tolist())


def every_e4m3_scale(x: torch.Tensor) -> float:
    return least_error(x, on_grid(x, E4M3_VALUES))


def swept_global_scale(x: torch.Tensor) -> tuple[float, float]:
    """The mse rule's least error over global scales x 2^(k/16), and the factor that gave it."""
    g = global_scale_for(x)
    return min((rule_error(x, "mse", g * 2 ** (k / 16)), 2 ** (k / 16)) for k in range(-8, 9))


def one_more_scale_bit(x: torch.Tensor) -> float:
    midpoints = (E4M3_VALUES[1:] + E4M3_VALUES[:-1]) / 2
    return least_error(x, on_grid(x, torch.cat([E4M3_VALUES, midpoints])))


def fp32_block_scales(x: torch.Tensor) -> float:
    amax_scale = blocks_of(x).abs().amax(-1) / E2M1_MAX
    # 2^-1.5 .. 2^1.5 of amax's scale, as far as mse's search reaches and more
    return least_error(x, (amax_scale * 2 ** (step / 128) for step in range(-192, 193)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096, help="rows of 512 latent values")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.rows < 1:
        raise SystemExit("--rows takes a positive number of rows")
    torch.manual_seed(args.seed)
    data = {
        "normal": torch.randn(args.rows, 512),
        "student-t(3)": torch.distributions.StudentT(3.0).sample((args.rows, 512)),
    }
    print(f"{args.rows} rows x 512 values, seed {args.seed}; relative error of the values read back")
    print(f"{'block scales':<28} " + " ".join(f"{name:>13}" for name in data) + "   seconds")
    swept: dict[str, tuple[float, float]] = {}

    def sweep(name: str, x: torch.Tensor) -> float:
        swept[name] = swept_global_scale(x)
        return swept[name][0]

    rows = [
        ("amax", lambda name, x: rule_error(x, "amax")),
        ("mse (17 e4m3 scales)", lambda name, x: rule_error(x, "mse")),
        ("every e4m3 scale (floor)", lambda name, x: every_e4m3_scale(x)),
        ("mse, global scale swept", sweep),
        ("e4m3 and one more bit", lambda name, x: one_more_scale_bit(x)),
        ("fp32 block scales (bound)", lambda name, x: fp32_block_scales(x)),
    ]
    for label, measure in rows:
        t0 = time.monotonic()
        errors = [measure(name, x) for name, x in data.items()]
        print(f"{label:<28} " + " ".join(f"{e:>13.4f}" for e in errors) + f"   {time.monotonic() - t0:>7.2f}")
    print("the sweep's best global scale: " + ", ".join(f"{name} x{f:.3f}" for name, (_, f) in swept.items()))


if __name__ == "__main__":
    main()
