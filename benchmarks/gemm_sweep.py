"""The GEMM core against torch.matmul at world 1: every candidate tile config on a grid of shapes.

Writes one long-format CSV row per (shape, config): the Triton GEMM's median time, torch.matmul's
median time in the same round, and their ratio. The grid covers small M (16-1024), M that is not a
multiple of the tile, and N, K that are not multiples of 128; B is a Linear weight (``w.t()``,
column-major) as in the TP layers. The best config per shape class feeds
``tilefuse.ops.common.config.default_config``.

    python -m benchmarks.gemm_sweep --out docs/perf/gemm_sweep.csv [--dtype bfloat16] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import time

import torch

SHAPES = [
    # (M, N, K): decode and prefill token counts on TP-2 layer shapes, ragged ones
    (16, 4096, 4096), (64, 14336, 4096), (128, 4096, 14336), (256, 7168, 4096), (333, 6144, 4096),
    (512, 4096, 4096), (1000, 14336, 4096), (1024, 4096, 7168), (2048, 3584, 8192), (3000, 4000, 3000),
    (4096, 14336, 4096), (4096, 4096, 14336), (4100, 5000, 3500), (8192, 8192, 8192), (8192, 3584, 14336),
    (16384, 1536, 4096),
]

BLOCKS = [(64, 64), (64, 128), (128, 128), (128, 256), (64, 256)]
BLOCK_K = [64]
WARPS_STAGES = [(4, 3), (8, 3), (4, 4)]


def _commit() -> str:
    from .results import commit_id

    return commit_id()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gemm_sweep.csv")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="4 shapes, 3 configs")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new shapes after this")
    parser.add_argument("--default-only", action="store_true",
                        help="time only the config tilefuse picks for an untuned shape (default_config)")
    args = parser.parse_args(argv)

    import triton

    from tilefuse.ops.common.config import Config, default_config
    from tilefuse.ops.common.gemm import matmul

    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    shapes = SHAPES[:4] if args.quick else SHAPES
    configs = list(itertools.product(BLOCKS, BLOCK_K, WARPS_STAGES))
    if args.quick:
        configs = configs[:3]
    rows = []
    commit = _commit()
    name = torch.cuda.get_device_name(device)
    t_start = time.monotonic()
    for M, N, K in shapes:
        if time.monotonic() - t_start > args.budget_s:
            break
        a = torch.randn(M, K, device=device, dtype=dtype)
        w = torch.randn(N, K, device=device, dtype=dtype)
        b = w.t()
        c = torch.empty(M, N, device=device, dtype=dtype)
        t_torch = triton.testing.do_bench(lambda a=a, b=b: torch.matmul(a, b), warmup=25, rep=100, return_mode="median")
        best = None
        if args.default_only:
            d = default_config(M, N, K, dtype, num_sms=sms, interpreter=False, comm=False)
            configs = [((d.BLOCK_M, d.BLOCK_N), d.BLOCK_K, (d.num_warps, d.num_stages))]
        for (bm, bn), bk, (warps, stages) in configs:
            if bm * bn >= 128 * 256 and warps < 8 and not args.default_only:
                continue
            cfg = Config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
                         GEMM_SMS=sms, COMM_SMS=0)
            try:
                t = triton.testing.do_bench(lambda cfg=cfg, a=a, b=b, c=c: matmul(a, b, c, cfg), warmup=25, rep=100,
                                            return_mode="median")
            except Exception as err:  # e.g. out of shared memory for this tile
                rows.append(dict(M=M, N=N, K=K, config=f"{bm}x{bn}x{bk}_w{warps}_s{stages}", metric="error",
                                 value=type(err).__name__))
                continue
            t_ref = triton.testing.do_bench(lambda a=a, b=b: torch.matmul(a, b), warmup=5, rep=50, return_mode="median")
            ratio = t_ref / t
            rows.append(dict(M=M, N=N, K=K, config=f"{bm}x{bn}x{bk}_w{warps}_s{stages}", metric="ms",
                             value=f"{t:.5f}"))
            rows.append(dict(M=M, N=N, K=K, config=f"{bm}x{bn}x{bk}_w{warps}_s{stages}", metric="torch_ms",
                             value=f"{t_ref:.5f}"))
            rows.append(dict(M=M, N=N, K=K, config=f"{bm}x{bn}x{bk}_w{warps}_s{stages}", metric="speedup",
                             value=f"{ratio:.4f}"))
            if best is None or ratio > best[1]:
                best = (f"{bm}x{bn}x{bk}_w{warps}_s{stages}", ratio)
        rows.append(dict(M=M, N=N, K=K, config="torch", metric="ms", value=f"{t_torch:.5f}"))
        print(f"{M}x{N}x{K}: torch {t_torch:.4f} ms, best {best}", flush=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["M", "N", "K", "dtype", "config", "metric", "value", "device",
                                               "commit"])
        writer.writeheader()
        for row in rows:
            writer.writerow(dict(row, dtype=args.dtype, device=name, commit=commit))


if __name__ == "__main__":
    main()
