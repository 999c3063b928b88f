"""Registers, spills and shared memory of gemm_reduce_scatter's fused_sequential kernels, staged and in
its epilogue-sum form, on one shape's default tiles at world 1 (one GPU).

    python -m benchmarks.kernel_regs --op gemm_reduce_scatter --shape 8192x4096x4096

The epilogue-sum form sums the own tiles in its GEMM kernel: whether that costs the K loop registers
(spills) is read here from the compiled kernels, next to the staged form's.
"""

from __future__ import annotations

import argparse
import importlib

import torch

from .gemm_sweep import kernel_info
from .launch import launch


def _rank(ctx, M: int, N: int, K: int) -> list:
    fs = importlib.import_module("tilefuse.ops.gemm_reduce_scatter.fused_sequential")  # the module, not the entry
    a = torch.randn(M, K, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(K, N, device=ctx.device, dtype=torch.bfloat16)
    out = []
    for name, kern, fn in (("staged", fs._fused_kernel, lambda: fs.fused_sequential(a, b)),
                           ("epilogue_sum", fs._fused_sum_kernel, lambda: fs.fused_sequential_epilogue(a, b))):
        info = kernel_info(fn, kern)
        out.append((name, info))
        print(f"{name} {M}x{N}x{K}: {info}", flush=True)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="gemm_reduce_scatter", choices=["gemm_reduce_scatter"])
    parser.add_argument("--shape", default="8192x4096x4096", help="MxNxK at world 1")
    args = parser.parse_args(argv)
    M, N, K = (int(x) for x in args.shape.split("x"))
    launch(_rank, 1, M, N, K)


if __name__ == "__main__":
    main()
