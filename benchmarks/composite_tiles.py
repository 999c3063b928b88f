"""GEMM tiles whose width is not a power of two, made of two blocks: how far they take the GEMM core
towards cuBLAS on the mid-size shapes where cuBLAS runs such tiles.

    python -m benchmarks.composite_tiles --shapes 333x6144x4096,512x6144x4096 --csv composite.csv
    python -m benchmarks.composite_tiles --smoke            (the interpreter: tiny shapes, fp16)

Triton's blocks are powers of two. On the parity grid's shapes where the GEMM core is slowest against
torch.matmul (M = 333-512), cuBLAS runs tiles 88, 168 or 192 wide that come to about one wave of the
multiprocessors (docs/RESULTS.md, "GEMM core": 4 x 32 tiles of 88 x 192 at 333x6144x4096, where the core
runs 72 tiles of 128 x 256). A tile ``BLOCK_M x (BN1 + BN2)`` here keeps two fp32 accumulators,
``[BM, BN1]`` and ``[BM, BN2]``, that share each ``[BM, BK]`` block of A: 128 + 64 = 192 columns,
128 + 32 = 160, 64 + 32 = 96. Each candidate is a persistent kernel of its own (:func:`composite_kernel`:
one program per multiprocessor, tiles in the GEMM core's grouped order, A and a Linear weight B
read through tensor descriptors, optionally warp-specialized like the core's 128 x 256 default),
checked against torch.matmul (relative error <= 2e-2, else recorded as ``error``) and timed
interleaved with torch.matmul and the GEMM core's default (``benchmarks.timing.bench_interleaved``:
device time, L2 cleared before each call). Same-width controls (128 + 128, 64 + 64) tell the cost of
two accumulators from the gain of the width. CSV: ``benchmarks.results`` columns, the candidate as
``variant`` (``comp_<BM>x<BN1>+<BN2>x<BK>_w<warps>_s<stages>[_ws]``), metrics ``ms``, ``ratio``
(torch's ms over the method's) and ``tiles`` (the candidate's tile count).
"""

from __future__ import annotations

import argparse
import time

import torch
import triton
import triton.language as tl

from tilefuse.ops.common.tiles import store_tile, tile_coords

from .results import COLUMNS, parse_dtype, row, write_csv

OP = "composite_tiles"


@triton.jit
def composite_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                     BLOCK_M: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPEC: tl.constexpr):
    """``c [M, N] = a [M, K] @ b [K, N]`` (b column-major: a Linear weight's ``w.t()``) in tiles of
    ``BLOCK_M x (BN1 + BN2)``, each two accumulators over the same blocks of A."""
    a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    b1_d = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[BN1, BLOCK_K])
    b2_d = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[BN2, BLOCK_K])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BN1 + BN2)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, warp_specialize=WARP_SPEC):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * (BN1 + BN2)
        acc1 = tl.zeros((BLOCK_M, BN1), dtype=tl.float32)  # [BM, BN1]
        acc2 = tl.zeros((BLOCK_M, BN2), dtype=tl.float32)  # [BM, BN2]
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_d.load([off_m, k * BLOCK_K])  # [BM, BK]; past M or K: zeros
            acc1 = tl.dot(a, tl.trans(b1_d.load([off_n, k * BLOCK_K])), acc1)
            acc2 = tl.dot(a, tl.trans(b2_d.load([off_n + BN1, k * BLOCK_K])), acc2)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        store_tile(c_ptr, acc1, offs_m, off_n + tl.arange(0, BN1), M, N, stride_cm, 1)
        store_tile(c_ptr, acc2, offs_m, off_n + BN1 + tl.arange(0, BN2), M, N, stride_cm, 1)


def composite(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cand: tuple, programs: int) -> torch.Tensor:
    """``c = a @ b`` with the candidate ``(BM, BN1, BN2, BK, warps, stages, warp_spec)``."""
    bm, bn1, bn2, bk, warps, stages, ws = cand
    M, K = a.shape
    N = b.shape[1]
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn1 + bn2)
    grid = min(programs, tiles)
    composite_kernel[(grid,)](a, b, c, M, N, K, a.stride(0), b.stride(1), c.stride(0),
                              BLOCK_M=bm, BN1=bn1, BN2=bn2, BLOCK_K=bk, GROUP_M=8, NUM_PROGRAMS=grid,
                              WARP_SPEC=ws, num_warps=warps, num_stages=stages)
    return c


def label(cand: tuple) -> str:
    bm, bn1, bn2, bk, warps, stages, ws = cand
    return f"comp_{bm}x{bn1}+{bn2}x{bk}_w{warps}_s{stages}" + ("_ws" if ws else "")


def candidates(smoke: bool = False) -> list:
    """``(BM, BN1, BN2, BK, warps, stages, warp_spec)``: the widths 192, 160 and 96 made of two
    blocks, and the same-width controls 256 (128 + 128) and 128 (64 + 64); 64-deep K steps, as many
    stages as about 200 KiB of shared memory holds (bf16); each plain with 8 warps (two warpgroups
    over a 128-row tile) and warp-specialized with 4 warps a group."""
    if smoke:
        return [(32, 32, 16, 32, 4, 1, False), (16, 16, 16, 16, 4, 1, False)]
    out = []
    for bm, bn1, bn2 in ((128, 128, 64), (128, 128, 32), (128, 64, 32), (128, 128, 128), (128, 64, 64)):
        stages = min(6, (200 * 1024) // ((bm + bn1 + bn2) * 64 * 2))
        out.append((bm, bn1, bn2, 64, 8, stages, False))
        out.append((bm, bn1, bn2, 64, 4, min(stages, 4), True))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.composite_tiles", description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", default="composite_tiles.csv")
    p.add_argument("--shapes", default="333x6144x4096,512x6144x4096,333x4096x4096,333x14336x4096,"
                                       "333x4096x14336,512x4096x4096,1000x14336x4096,1000x6144x4096",
                   help="comma-separated MxNxK")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--budget-s", type=float, default=240.0, help="no new shape after this many seconds")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, fp16 (the interpreter)")
    args = p.parse_args(argv)
    from tilefuse.ops.common.config import default_config
    from tilefuse.ops.common.gemm import ensure_triton_allocator, matmul

    from .gemm_sweep import start_one_process
    from .timing import bench_interleaved

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    if args.smoke:
        shapes, dtype = [(37, 72, 48), (5, 40, 24)], torch.float16
    else:
        if not on_gpu:
            raise SystemExit("composite_tiles: no GPU: only --smoke runs in the interpreter")
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s.strip()]
        dtype = parse_dtype(args.dtype)
    ensure_triton_allocator()
    ctx, sms, info = start_one_process(device)
    t0 = time.monotonic()
    first = True
    for M, N, K in shapes:
        if time.monotonic() - t0 > args.budget_s:
            print(f"composite_tiles: budget spent, {M}x{N}x{K} and later left out", flush=True)
            break
        g = torch.Generator(device=device).manual_seed(M * 7 + N * 3 + K)
        a = torch.randn(M, K, device=device, generator=g).to(dtype)
        b = torch.randn(N, K, device=device, generator=g).to(dtype).t()  # a Linear weight's layout
        c = torch.empty(M, N, device=device, dtype=dtype)
        ref = (a.float() @ b.float()) if not on_gpu else torch.matmul(a, b).float()
        cfg0 = default_config(M, N, K, dtype, num_sms=sms, interpreter=not on_gpu, comm=False, split_k=True)
        fns = {"torch": lambda a=a, b=b: torch.matmul(a, b),
               "core": lambda a=a, b=b, c=c, cfg0=cfg0: matmul(a, b, c, cfg0)}
        rows = []
        for cand in candidates(args.smoke):
            name = label(cand)
            out = torch.full((M, N), float("nan"), device=device, dtype=dtype)
            try:
                err = ((composite(a, b, out, cand, sms).float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                if not err <= 2e-2:
                    raise AssertionError(f"relative error {err:.2e}")
            except Exception as e:  # out of shared memory or registers for this tile, a wrong result, ...
                rows.append(row(OP, name, M, N, K, dtype, 1, "error", float("nan"),
                                note=f"{type(e).__name__}: {e}"[:300]))
                continue
            fns[name] = lambda cand=cand, a=a, b=b, out=out: composite(a, b, out, cand, sms)
            bm, bn1, bn2 = cand[:3]
            tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn1 + bn2)
            rows.append(row(OP, name, M, N, K, dtype, 1, "tiles", float(tiles)))
        names = list(fns)
        times = bench_interleaved(ctx, [fns[n] for n in names], rep_ms=20, max_reps=200)
        for name, t in zip(names, times):
            rows.append(row(OP, name, M, N, K, dtype, 1, "ms", t))
            rows.append(row(OP, name, M, N, K, dtype, 1, "ratio", times[0] / t))
        write_csv(rows, args.csv, info, append=not first, columns=COLUMNS)
        first = False
        best = max(((times[0] / t, n) for t, n in zip(times, names) if n.startswith("comp_")),
                   default=(float("nan"), "none"))
        print(f"{M}x{N}x{K}: torch {times[0] * 1e3:.1f} us, core {times[1] * 1e3:.1f} ({times[0] / times[1]:.3f}x, "
              f"{cfg0.BLOCK_M}x{cfg0.BLOCK_N}), best composite {best[1]} {best[0]:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
