"""Registers, spills and shared memory of an op's fused_sequential kernels, staged and in the
epilogue-sum form (Config.EPILOGUE_SUM), on one shape's default tiles at world 1 (one GPU).

    python -m benchmarks.kernel_regs --op gemm_reduce_scatter --shape 8192x4096x4096

The epilogue-sum form sums tiles in its GEMM kernel: whether that costs the K loop registers
(spills) is read here from the compiled kernels, next to the staged form's.
"""

from __future__ import annotations

import argparse
import importlib

import torch

from .gemm_sweep import kernel_info
from .launch import launch

# The kernel each form of an op's fused_sequential launches (gemm_all_reduce: one, whose constexprs differ).
KERNELS = {"gemm_reduce_scatter": ("_fused_kernel", "_fused_sum_kernel"),
           "gemm_all_reduce": ("_fused_kernel", "_fused_kernel")}


def _rank(ctx, op: str, M: int, N: int, K: int) -> list:
    fs = importlib.import_module(f"tilefuse.ops.{op}.fused_sequential")  # the module, not the entry point
    staged, summed = (getattr(fs, name) for name in KERNELS[op])
    a = torch.randn(M, K, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(K, N, device=ctx.device, dtype=torch.bfloat16)
    out = []
    for name, kern, fn in (("staged", staged, lambda: fs.fused_sequential(a, b)),
                           ("epilogue_sum", summed, lambda: fs.fused_sequential_epilogue(a, b))):
        info = kernel_info(fn, kern)
        out.append((name, info))
        print(f"{op} {name} {M}x{N}x{K}: {info}", flush=True)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="gemm_reduce_scatter", choices=sorted(KERNELS))
    parser.add_argument("--shape", default="8192x4096x4096", help="MxNxK at world 1")
    args = parser.parse_args(argv)
    M, N, K = (int(x) for x in args.shape.split("x"))
    launch(_rank, 1, args.op, M, N, K)


if __name__ == "__main__":
    main()
