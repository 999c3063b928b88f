"""Decode-size GEMMs against the read of their weight: how much room cuBLAS leaves at M <= 128.

    python -m benchmarks.decode_gemm --ms 1,16 --csv decode_gemm.csv
    python -m benchmarks.decode_gemm --ms 16,64,128 --shapes 4096x4096,1000x8000 --csv decode_gemm.csv

At decode sizes a GEMM reads its weight once and does little else, so no kernel can beat the time
it takes to stream ``w [N, K]`` from memory. Per ``(M, N, K)`` (``a [M, K] @ w.t()``, ``w`` a
Linear weight), every method below is timed in the same interleaved rounds, each call after an L2
clear, device time only (``benchmarks.timing.bench_interleaved``):

- ``torch``: torch.matmul (cuBLAS); its kernel names go into the CSV (``metric=kernels``);
- ``core``: the GEMM core with the config ``default_config(..., split_k=True)`` picks;
- ``read``: a streaming read of ``w`` alone (a persistent Triton kernel, 4 programs per
  multiprocessor, 2048 elements a load): the time of the weight's bytes under the same timing;
- candidate configs of :func:`splitk_kernel`: ``(BM, BN, BK, SPLIT, warps, stages)``, one program
  per ``[BM, BN]`` tile and K slice (``cdiv(M, BM) * cdiv(N, BN) * SPLIT`` programs, several per
  multiprocessor), pointer loads pipelined ``stages`` deep, K slices summed with fp32 atomics. The
  atomics make it an upper bound on the speed of a deterministic form, not a shipped kernel;
- with ``--core-candidates``: the GEMM core on such schedules (``core_<BM>x<BN>x<BK>_k<SPLIT>...``:
  ``SPLIT_K`` slices summed in order by the last one, ``GEMM_SMS`` = one program per work item), on
  the descriptor path and (``_ptr``) the pointer path.

Each candidate is checked against torch.matmul first (relative error <= 2e-2) and recorded as
``error`` if it fails or does not fit. ``--smoke`` runs tiny shapes with fp16 in Triton's
interpreter (the timings mean nothing there). CSV: ``benchmarks.results`` columns, methods as
``variant``: ``ms`` and ``ratio`` (torch's ms over the method's).
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import triton
import triton.language as tl

from .results import COLUMNS, parse_dtype, row, write_csv

OP = "decode_gemm"


@triton.jit
def splitk_kernel(a_ptr, b_ptr, ws_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                  STAGES: tl.constexpr):
    """``ws [M, N] fp32 += a [M, K] @ b [K, N]`` over this program's K slice of its tile (ws zeroed)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    steps = tl.cdiv(K, BLOCK_K)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    offs_k = tl.arange(0, BLOCK_K)  # [BK]
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # [BM, BN]
    for k in tl.range(pid_k * steps // SPLIT, (pid_k + 1) * steps // SPLIT, num_stages=STAGES):
        kk = k * BLOCK_K + offs_k  # [BK]
        mk = kk < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=mask_m[:, None] & mk[None, :], other=0.0)  # [BM, BK]
        b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=mk[:, None] & mask_n[None, :], other=0.0)  # [BK, BN]
        acc = tl.dot(a, b, acc)
    tl.atomic_add(ws_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :],
                  sem="relaxed")


@triton.jit
def read_kernel(w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Stream ``n`` elements of ``w`` (persistent, grid-stride) and store one sum per program."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)  # [BLOCK]
        acc += tl.load(w_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def splitk(a: torch.Tensor, b: torch.Tensor, ws: torch.Tensor, cfg: tuple) -> torch.Tensor:
    """``a @ b`` in fp32 into ``ws [M, N]`` with the candidate ``cfg = (BM, BN, BK, SPLIT, warps, stages)``."""
    bm, bn, bk, split, warps, stages = cfg
    M, K = a.shape
    N = b.shape[1]
    ws.zero_()
    splitk_kernel[(triton.cdiv(N, bn), split, triton.cdiv(M, bm))](
        a, b, ws, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, STAGES=stages, num_warps=warps)
    return ws


def candidates(M: int, smoke: bool = False) -> list:
    """The splitk configs timed at ``M``: 16-row tiles up to M = 16, else 64 (and 128 above 64) rows."""
    if smoke:
        return [(16, 32, 64, 1, 4, 2), (16, 32, 64, 3, 4, 2)]
    if M <= 16:
        return [(16, bn, bk, sp, w, s) for bn, bk, sp, (w, s) in itertools.product(
            (32, 64, 128), (256, 512), (1, 2, 4), ((4, 3), (8, 3)))]
    return [(bm, bn, bk, sp, w, s) for bm, bn, bk, sp, (w, s) in itertools.product(
        (64,) if M <= 64 else (64, 128), (32, 64, 128), (128, 256), (1, 2, 4), ((4, 3), (8, 3)))]


def core_candidates(M: int, smoke: bool = False) -> list:
    """The same schedules run by the GEMM core (``matmul``, deterministic slices): one program per
    work item (``GEMM_SMS`` = tiles x ``SPLIT_K``, several per multiprocessor)."""
    if smoke:
        return [(16, 32, 64, 2, 4, 2)]
    bm = 16 if M <= 16 else 64
    return [(bm, bn, 256 if M <= 16 else 128, sp, 4, 3) for bn in (32, 64) for sp in (1, 2, 4)]


def core_config(cfg: tuple, M: int, N: int):
    """The GEMM core's Config of ``cfg``, one program per work item."""
    from tilefuse.ops.common.config import Config

    bm, bn, bk, split, warps, stages = cfg
    work = -(-M // bm) * -(-N // bn) * split
    return Config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, num_warps=warps, num_stages=stages,
                  GEMM_SMS=work, COMM_SMS=0, SPLIT_K=split)


def label(cfg: tuple) -> str:
    bm, bn, bk, split, warps, stages = cfg
    return f"splitk_{bm}x{bn}x{bk}_k{split}_w{warps}_s{stages}"


def _kernel_names(fn) -> str:
    from .auto_ab import _kernels

    return ";".join(name for name, _, _ in _kernels(fn, calls=2))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_gemm", description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", default="decode_gemm.csv")
    p.add_argument("--ms", default="1,16", help="comma-separated M")
    p.add_argument("--shapes", default="8192x4096,4096x4096,14336x4096,4096x14336,6144x4096",
                   help="comma-separated NxK")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--budget-s", type=float, default=240.0, help="no new shape after this many seconds")
    p.add_argument("--core-candidates", action="store_true",
                   help="also the GEMM core on the same schedules, one program per work item, on the "
                        "descriptor and the pointer path")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, fp16, two candidates (the interpreter)")
    args = p.parse_args(argv)
    from tilefuse.ops.common.config import default_config
    from tilefuse.ops.common.gemm import matmul

    from .gemm_sweep import start_one_process
    from .timing import bench_interleaved

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    if args.smoke:
        ms, shapes, dtype = [1, 5], [(48, 96)], torch.float16
    else:
        if not on_gpu:
            raise SystemExit("decode_gemm: no GPU: only --smoke runs in the interpreter")
        ms = [int(x) for x in args.ms.split(",") if x.strip()]
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s.strip()]
        dtype = parse_dtype(args.dtype)
    ctx, sms, info = start_one_process(device)
    t0 = time.monotonic()
    first = True
    for M in ms:
        for N, K in shapes:
            if time.monotonic() - t0 > args.budget_s:
                print(f"decode_gemm: budget spent, M={M} {N}x{K} and later left out", flush=True)
                return 0
            rows = []
            g = torch.Generator(device=device).manual_seed(N + K + M)
            a = torch.randn(M, K, device=device, generator=g).to(dtype)
            w = torch.randn(N, K, device=device, generator=g).to(dtype)
            b = w.t()
            ws = torch.empty(M, N, device=device, dtype=torch.float32)
            c = torch.empty(M, N, device=device, dtype=dtype)
            ref = (a.float() @ b.float()) if not on_gpu else torch.matmul(a, b).float()
            flat = w.view(-1)
            sums = torch.empty(4 * sms, device=device, dtype=torch.float32)
            cfg0 = default_config(M, N, K, dtype, num_sms=sms, interpreter=not on_gpu, comm=False, split_k=True)
            fns = {"torch": lambda a=a, b=b: torch.matmul(a, b),
                   "core": lambda a=a, b=b, c=c, cfg0=cfg0: matmul(a, b, c, cfg0),
                   "read": lambda flat=flat, sums=sums: read_kernel[(sums.numel(),)](
                       flat, sums, flat.numel(), BLOCK=2048 if on_gpu else 64, num_warps=8 if on_gpu else 4)}
            for cfg in candidates(M, args.smoke):
                try:
                    err = ((splitk(a, b, ws, cfg) - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                    if not err <= 2e-2:
                        raise AssertionError(f"relative error {err:.2e}")
                except Exception as e:  # out of shared memory for this tile, a wrong result, ...
                    rows.append(row(OP, label(cfg), M, N, K, dtype, 1, "error", float("nan"),
                                    note=f"{type(e).__name__}: {e}"[:300]))
                    continue
                fns[label(cfg)] = lambda cfg=cfg, a=a, b=b, ws=ws: splitk(a, b, ws, cfg)
            for cfg in core_candidates(M, args.smoke) if args.core_candidates or args.smoke else []:
                ccfg = core_config(cfg, M, N)
                for ptr in (False, True):
                    name = "core_" + label(cfg).removeprefix("splitk_") + ("_ptr" if ptr else "")
                    try:
                        err = ((matmul(a, b, c, ccfg, tma=not ptr).float() - ref).norm()
                               / ref.norm().clamp_min(1e-30)).item()
                        if not err <= 2e-2:
                            raise AssertionError(f"relative error {err:.2e}")
                    except Exception as e:  # out of shared memory for this tile, a wrong result, ...
                        rows.append(row(OP, name, M, N, K, dtype, 1, "error", float("nan"),
                                        note=f"{type(e).__name__}: {e}"[:300]))
                        continue

                    def run(a=a, b=b, c=c, ccfg=ccfg, ptr=ptr):
                        matmul(a, b, c, ccfg, tma=not ptr)
                    fns[name] = run
            names = list(fns)
            times = bench_interleaved(ctx, [fns[n] for n in names], rep_ms=15, max_reps=200)
            t_torch = times[0]
            for name, t in zip(names, times):
                rows.append(row(OP, name, M, N, K, dtype, 1, "ms", t))
                rows.append(row(OP, name, M, N, K, dtype, 1, "ratio", t_torch / t))
            if on_gpu:
                rows.append(row(OP, "torch", M, N, K, dtype, 1, "kernels", float("nan"),
                                note=_kernel_names(fns["torch"])[:300]))
            write_csv(rows, args.csv, info, append=not first, columns=COLUMNS)
            first = False
            best = min(((t, n) for t, n in zip(times, names) if n.startswith("splitk")), default=(float("nan"), "none"))
            core_best = min(((t, n) for t, n in zip(times, names) if n.startswith("core_")), default=None)
            print(f"M={M} {N}x{K}: torch {t_torch * 1e3:.1f} us, core {times[1] * 1e3:.1f}, "
                  f"read of w {times[2] * 1e3:.1f} ({N * K * w.element_size() / times[2] / 1e6:.0f} GB/s), "
                  f"best splitk {best[0] * 1e3:.1f} ({best[1]}, {t_torch / best[0]:.2f}x torch)"
                  + (f", best core schedule {core_best[0] * 1e3:.1f} ({core_best[1]}, "
                     f"{t_torch / core_best[0]:.2f}x torch)" if core_best else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
