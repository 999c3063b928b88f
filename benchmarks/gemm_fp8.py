"""The GEMM core in float8 against torch._scaled_mm at world 1, tensor-wise and row-wise scales.

For every shape of a grid (``benchmarks.gemm_sweep.GRIDS``, default ``parity``) and each scaling,
the Triton GEMM core (``tilefuse.ops.common.gemm.matmul`` with ``scales``, its default config) and
``torch._scaled_mm`` are timed in the same round, their calls interleaved one by one, each after an L2
clear, with CUDA events (``benchmarks.timing.bench_interleaved``; median). A is float8_e4m3fn
row-major, B a Linear weight (``w.t()``, column-major, as _scaled_mm takes it), the result bfloat16.
_scaled_mm takes only dimensions that are multiples of 16: on the grid's other shapes it runs on
operands zero-padded to them (the copy not timed; the note says so).

    python -m benchmarks gemm_fp8 --csv fp8_parity.csv                  # parity grid, both scalings
    python -m benchmarks gemm_fp8 --scalings rowwise --ms 512,4096      # a part of it

CSV (long format, ``benchmarks.results`` columns plus ``config``): per shape and scaling (variant
``tensorwise`` / ``rowwise``) the ``ms`` of the GEMM core, ``torch_ms`` of _scaled_mm and ``ratio`` =
torch_ms / ms (above 1: faster than _scaled_mm); per scaling ``ratio_median`` and ``ratio_worst``
over the grid (shape ``all``). Target: median >= 0.95, worst >= 0.85.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from .gemm_sweep import GRIDS, label, start_one_process, summarize
from .results import COLUMNS, print_table, row, write_csv

OP = "gemm_core_fp8"
E4M3 = torch.float8_e4m3fn


def _pad16(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``t`` zero-padded to ``[rows, cols]``."""
    if tuple(t.shape) == (rows, cols):
        return t
    out = torch.zeros(rows, cols, dtype=t.dtype, device=t.device)
    out[: t.shape[0], : t.shape[1]] = t
    return out


def _up16(x: int) -> int:
    return -(-x // 16) * 16


def operands(M: int, N: int, K: int, rowwise: bool, device) -> tuple:
    """``(a [M, K], b [K, N] column-major, scale_a, scale_b)``: float8 values of unit-scale normals."""
    gen = torch.Generator(device=device).manual_seed(M * 7 + N * 3 + K)
    a = torch.randn(M, K, device=device, generator=gen).to(E4M3)
    w = torch.randn(N, K, device=device, generator=gen).to(E4M3)
    if rowwise:
        sa = torch.rand(M, 1, device=device, generator=gen) + 0.5
        sb = torch.rand(1, N, device=device, generator=gen) + 0.5
    else:
        sa = torch.tensor(0.75, device=device)
        sb = torch.tensor(1.25, device=device)
    return a, w.t(), sa, sb


def baseline(a, b, sa, sb):
    """``torch._scaled_mm`` of the operands (padded to multiples of 16 where needed): ``(fn, padded)``."""
    (M, K), N = a.shape, b.shape[1]
    Mp, Kp, Np = _up16(M), _up16(K), _up16(N)
    padded = (Mp, Kp, Np) != (M, K, N)
    ap = _pad16(a, Mp, Kp)
    bp = _pad16(b.t(), Np, Kp).t()  # column-major, as _scaled_mm takes B
    if sa.numel() > 1:
        sa = _pad16(sa, Mp, 1).contiguous()
        sb = _pad16(sb, 1, Np).contiguous()
    return (lambda: torch._scaled_mm(ap, bp, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)), padded


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="parity")
    parser.add_argument("--csv", "--out", dest="csv", default="gemm_fp8.csv", help="long-format CSV")
    parser.add_argument("--scalings", default="tensorwise,rowwise", help="comma-separated: tensorwise, rowwise")
    parser.add_argument("--ms", default=None, help="comma-separated: only the grid's shapes with these M")
    parser.add_argument("--rep-ms", type=float, default=60.0, help="each method's share of timed calls")
    parser.add_argument("--max-reps", type=int, default=400)
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop starting new shapes after this long")
    args = parser.parse_args(argv)
    t_start = time.monotonic()

    from tilefuse.ops.common.config import default_config
    from tilefuse.ops.common.gemm import matmul
    from tilefuse.ops.common.scaled import kernel_scales

    from .timing import bench_interleaved

    if not torch.cuda.is_available():
        raise SystemExit("gemm_fp8: needs a GPU (torch._scaled_mm does not run on the CPU)")
    device = torch.device("cuda")
    ctx, sms, info = start_one_process(device)
    shapes = GRIDS[args.grid]
    if args.ms:
        keep = {int(m) for m in args.ms.split(",") if m.strip()}
        shapes = [s for s in shapes if s[0] in keep]
    scalings = [s.strip() for s in args.scalings.split(",") if s.strip()]
    columns = COLUMNS + ["config"]
    Path(args.csv).unlink(missing_ok=True)
    ratios, table = {}, []
    for scaling in scalings:
        rowwise = scaling == "rowwise"
        for M, N, K in shapes:
            if time.monotonic() - t_start > args.budget_s:
                print("gemm_fp8: budget spent; the remaining shapes were not timed", flush=True)
                break
            rows = []
            a, b, sa, sb = operands(M, N, K, rowwise, device)
            cfg = default_config(M, N, K, E4M3, num_sms=sms, interpreter=False, comm=False, split_k=True)
            c = torch.empty(M, N, device=device, dtype=torch.bfloat16)
            scales = kernel_scales(sa, sb, device)
            ref_fn, padded = baseline(a, b, sa, sb)
            note = "_scaled_mm on operands padded to multiples of 16" if padded else ""
            try:
                matmul(a, b, c, cfg, scales=scales)
                ref = (a.float() * sa) @ (b.float() * sb)
                err = ((c.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                if not err <= 2e-2:
                    raise AssertionError(f"relative error {err:.2e}")
                ours = lambda a=a, b=b, c=c, cfg=cfg, scales=scales: matmul(a, b, c, cfg, scales=scales)  # noqa: E731
                t, t_ref = bench_interleaved(ctx, [ours, ref_fn], rep_ms=args.rep_ms, max_reps=args.max_reps)
            except Exception as err:  # a config that does not compile, a wrong result, ...
                rows.append(dict(row(OP, scaling, M, N, K, E4M3, 1, "error", float("nan"),
                                     note=f"{type(err).__name__}: {err}"[:300]), config=label(cfg)))
                ratios.setdefault(scaling, []).append(float("nan"))
                write_csv(rows, args.csv, info, append=True, columns=columns)
                print(f"{scaling} {M}x{N}x{K}: {type(err).__name__}: {err}"[:300], flush=True)
                continue
            ratio = t_ref / t
            ratios.setdefault(scaling, []).append(ratio)
            for metric, value in (("ms", t), ("torch_ms", t_ref), ("ratio", ratio)):
                rows.append(dict(row(OP, scaling, M, N, K, E4M3, 1, metric, value, note=note), config=label(cfg)))
            write_csv(rows, args.csv, info, append=True, columns=columns)
            table.append(dict(scaling=scaling, shape=f"{M}x{N}x{K}", config=label(cfg), torch_ms=t_ref, ms=t,
                              ratio=ratio))
            print(f"{scaling} {M}x{N}x{K}: {label(cfg)} {ratio:.3f}x{' (padded baseline)' if padded else ''}",
                  flush=True)
    rows, summary = [], []
    for scaling, med, worst, n in summarize(ratios):
        summary.append(dict(scaling=scaling, shapes=n, ratio_median=med, ratio_worst=worst))
        for metric, value in (("ratio_median", med), ("ratio_worst", worst), ("shapes", n)):
            rows.append(dict(row(OP, scaling, "all", "all", "all", E4M3, 1, metric, value), config=""))
    write_csv(rows, args.csv, info, append=True, columns=columns)
    print_table(table, ["scaling", "shape", "config", "torch_ms", "ms", "ratio"],
                "GEMM core in float8, default configs")
    print_table(summary, ["scaling", "shapes", "ratio_median", "ratio_worst"],
                "ratio = torch._scaled_mm time / GEMM-core time (above 1: faster)")
    print(f"wrote {args.csv}", flush=True)


if __name__ == "__main__":
    main()
