"""gemm_all_scatter's copy of the peers' column blocks out of the heap: its kernel against torch's copies.

    python -m benchmarks peer_block_copy [--world-sizes 2,4] [--M 1,16,128,1024,8192] [--N 4096,14336]
                                         [--dtype bf16] [--csv peer_block_copy.csv]

At world >= 2 a default gemm_all_scatter call (no heap ``out=``) ends by copying the W - 1 peers'
``[M, N]`` column blocks of c, on the heap, into its ordinary result ``[M, W*N]``
(``tilefuse.ops.gemm_all_scatter._tiles.copy_peer_blocks``, one launch; before it, one or two torch
copies of the column ranges left and right of this rank's own block). Both are timed here on one
GPU, in one process, on ordinary tensors of those shapes as rank 0 of ``W`` (the copy reads no
peer memory: the peers' blocks are already in c): device time per call, interleaved, the L2
cleared before each (``benchmarks.timing.bench_interleaved``). CSV: ``W, M, N, dtype, method, metric
(us, GB/s: bytes read and written per second), value, device, commit``.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .common import commit_id, launch, parse_dtype
from .results import write_rows
from .timing import bench_interleaved

CSV_COLUMNS = ["W", "M", "N", "dtype", "method", "metric", "value", "device", "commit"]


def _shape_rows(ctx, W: int, M: int, N: int, dtype_name: str) -> list:
    from tilefuse.ops.gemm_all_scatter._tiles import launch_copy_peer_blocks

    src = torch.randn(M, W * N, device=ctx.device).to(parse_dtype(dtype_name))
    dst = torch.zeros_like(src)

    def kernel_copy():
        launch_copy_peer_blocks(dst, src, M, N, 0, W)

    def torch_copy():  # rank 0: its own block is the first, the peers' are one range
        dst[:, N:].copy_(src[:, N:])

    kernel_copy()
    assert torch.equal(dst[:, N:], src[:, N:]), f"the kernel's copy differs at W={W} M={M} N={N}"
    k_ms, t_ms = bench_interleaved(ctx, [kernel_copy, torch_copy])
    nbytes = 2 * (W - 1) * M * N * src.element_size()
    rows = []
    for method, ms in (("kernel", k_ms), ("torch", t_ms)):
        base = dict(W=W, M=M, N=N, dtype=dtype_name, method=method)
        rows.append({**base, "metric": "us", "value": ms * 1e3})
        rows.append({**base, "metric": "GB/s", "value": nbytes / (ms * 1e-3) / 1e9})
    return rows


def _job(ctx, worlds, Ms, Ns, dtype_name) -> list:
    return [row for W in worlds for M in Ms for N in Ns for row in _shape_rows(ctx, W, M, N, dtype_name)]


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-sizes", default="2,4", help="W of the calls whose copy is timed, comma-separated")
    p.add_argument("--M", default="1,16,128,1024,8192")
    p.add_argument("--N", default="4096,14336", help="columns per rank's block")
    p.add_argument("--dtype", default="bf16", choices=("fp16", "bf16", "fp32"))
    p.add_argument("--csv", default="peer_block_copy.csv")
    args = p.parse_args(argv)
    [rows] = launch(_job, 1, _ints(args.world_sizes), _ints(args.M), _ints(args.N), args.dtype)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    us = {(r["W"], r["M"], r["N"], r["method"]): r["value"] for r in rows if r["metric"] == "us"}
    for (W, M, N, method), t in us.items():
        if method == "kernel":
            print(f"W={W} M={M:<5d} N={N:<6d} kernel {t:9.1f} us  torch {us[W, M, N, 'torch']:9.1f} us  "
                  f"kernel/torch {t / us[W, M, N, 'torch']:.2f}")
    write_rows(args.csv, rows, CSV_COLUMNS, device=device, commit=commit_id())
    return 0


if __name__ == "__main__":
    sys.exit(main())
